#!/usr/bin/env python3
"""Turns text files into llm.c token shards for data.tokens (docs/data.md).

  scripts/prepare-data.py --vocab-size 512 -o build/bin/data/gpl-bpe /usr/share/common-licenses/GPL-3
  scripts/prepare-data.py --tokenizer my/tokenizer.json -o DIR FILE...
  scripts/prepare-data.py --gpt2 -o DIR FILE...

Tokenizer (one of):
  --vocab-size N       trains a byte-level BPE of N tokens (Hugging Face `tokenizers`) on the
                       given files, in their order; token 0 is <|endoftext|>, 1..256 the bytes
  --tokenizer FILE     encodes with an existing tokenizer.json (its own end-of-text token is
                       used when it has <|endoftext|>, </s> or <eos>)
  --gpt2               GPT-2's own encoding through `tiktoken` (vocabulary 50257, end of text
                       50256). NOT OFFLINE: tiktoken downloads GPT-2's ranks on first use (or
                       reads them from $TIKTOKEN_CACHE_DIR), and no package on this machine
                       ships them; neither does transformers' or tokenizers' GPT-2 (they
                       download too). Offline, pass a GPT-2 tokenizer.json you have with
                       --tokenizer instead.

Each file is one document: <|endoftext|> then its tokens (as llm.c's preprocessing does).
Validation split (--val-fraction, default 0.1): the LAST ceil(fraction * n) tokens of each
file go to the validation shards, the rest to the training shards, so neither split sees
the other's text; 0 writes no validation shards. Each split is cut into shards of at most
--shard-tokens tokens (default 100,000,000, as llm.c), of near-equal sizes.

Output, in -o DIR (created; existing shards of the same names are overwritten):
  train_000000.bin ...   llm.c shards: 256 int32 header (magic 20240520, version 1 for
  val_000000.bin ...     uint16 tokens when the vocabulary fits in 65,536 ids, else 2 for
                         uint32; token count), then the tokens, little-endian
  tokenizer.json         the tokenizer used (not written with --gpt2)
  meta.json              vocab_size, token dtype, eot id, token counts, the source files
                         with their sha256, every shard with its token count and sha256

The same inputs and options give byte-identical output (the BPE trainer is deterministic,
meta.json has no timestamps and sorted keys).

Runs with Debian's python3: when `tokenizers` is not importable it re-runs itself in the
small venv scripts/data-venv.sh makes outside the clone (~/.cache/baton/data-venv-*;
installing it needs PyPI once).
"""

import argparse
import hashlib
import json
import math
import os
import struct
import subprocess
import sys

MAGIC = 20240520
HEADER_INTS = 256
EOT = "<|endoftext|>"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def reexec_in_venv(why):
    """Runs this script again in the data venv (scripts/data-venv.sh); does not return."""
    if os.environ.get("BATON_PREPARE_DATA_IN_VENV"):
        sys.exit(f"prepare-data: {why}, even in the data venv ({sys.executable})")
    try:
        venv = subprocess.run([os.path.join(REPO, "scripts", "data-venv.sh")], check=True,
                              stdout=subprocess.PIPE, text=True).stdout.strip()
    except (subprocess.CalledProcessError, OSError) as e:
        sys.exit(f"prepare-data: {why}, and the data venv could not be made ({e}); "
                 "install it with scripts/data-venv.sh (needs PyPI once)")
    os.environ["BATON_PREPARE_DATA_IN_VENV"] = "1"
    python = os.path.join(venv, "bin", "python")
    os.execv(python, [python, os.path.abspath(__file__)] + sys.argv[1:])


def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def read_texts(paths):
    texts = []
    for p in paths:
        with open(p, "rb") as f:
            raw = f.read()
        # Invalid UTF-8 becomes U+FFFD: the same bytes always give the same text.
        texts.append((p, raw, raw.decode("utf-8", errors="replace")))
    return texts


class HfTokenizer:
    """A Hugging Face tokenizers.Tokenizer, trained or loaded."""

    def __init__(self, tok, eot_id):
        self.tok = tok
        self.eot = eot_id
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    def save(self, path):
        # pretty=False keeps the file compact; the content is deterministic either way.
        self.tok.save(path, pretty=True)

    def describe(self):
        return {"kind": "huggingface-tokenizers", "file": "tokenizer.json"}


def train_bpe(texts, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    if vocab_size < 257 + 1:
        sys.exit(f"prepare-data: --vocab-size {vocab_size} is too small: a byte-level BPE needs "
                 "257 ids (<|endoftext|> and the 256 bytes) and at least one merge")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((t for _, _, t in texts), trainer=trainer)
    eot = tok.token_to_id(EOT)
    return HfTokenizer(tok, eot), {"kind": "byte-level-bpe", "trained_vocab_size": vocab_size}


def load_tokenizer(path):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(path)
    eot = None
    for name in (EOT, "</s>", "<eos>", "<|end_of_text|>"):
        eot = tok.token_to_id(name)
        if eot is not None:
            break
    if eot is None:
        sys.exit(f"prepare-data: {path} has no end-of-text token ({EOT}, </s>, <eos>)")
    return HfTokenizer(tok, eot), {"kind": "tokenizer.json", "from": os.path.basename(path)}


class Gpt2Tiktoken:
    def __init__(self):
        try:
            import tiktoken
        except ImportError:
            sys.exit("prepare-data: --gpt2 needs the `tiktoken` package (pip install tiktoken; "
                     "it downloads GPT-2's ranks on first use, so it needs the network once)")
        try:
            self.enc = tiktoken.get_encoding("gpt2")
        except Exception as e:  # network errors come in many types
            sys.exit(f"prepare-data: tiktoken could not load GPT-2's encoding ({e}); it "
                     "downloads the ranks on first use: run it once with network, set "
                     "TIKTOKEN_CACHE_DIR to a cache that has them, or pass a GPT-2 "
                     "tokenizer.json with --tokenizer")
        self.eot = self.enc.eot_token
        self.vocab_size = self.enc.n_vocab

    def encode(self, text):
        return self.enc.encode_ordinary(text)

    def save(self, path):
        pass

    def describe(self):
        return {"kind": "tiktoken", "encoding": "gpt2"}


def split_evenly(tokens, max_per_shard):
    """Near-equal pieces of at most max_per_shard tokens (none when tokens is empty)."""
    n = len(tokens)
    if n == 0:
        return []
    k = math.ceil(n / max_per_shard)
    bounds = [n * i // k for i in range(k + 1)]
    return [tokens[bounds[i]:bounds[i + 1]] for i in range(k)]


def shard_bytes(tokens, version):
    header = [0] * HEADER_INTS
    header[0], header[1], header[2] = MAGIC, version, len(tokens)
    fmt = "H" if version == 1 else "I"
    return struct.pack(f"<{HEADER_INTS}i", *header) + struct.pack(f"<{len(tokens)}{fmt}", *tokens)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--vocab-size", type=int, help="train a byte-level BPE of this size")
    which.add_argument("--tokenizer", help="encode with this tokenizer.json")
    which.add_argument("--gpt2", action="store_true", help="GPT-2's encoding (tiktoken)")
    parser.add_argument("-o", "--out", required=True, help="output directory")
    parser.add_argument("--val-fraction", type=float, default=0.1,
                        help="tail of each file that goes to validation (default 0.1)")
    parser.add_argument("--shard-tokens", type=int, default=100_000_000,
                        help="most tokens per shard (default 100,000,000)")
    parser.add_argument("--context", type=int, default=0,
                        help="refuse shards shorter than one window of context + 1 tokens "
                             "(0: no check)")
    parser.add_argument("inputs", nargs="+", help="text files (one document each)")
    args = parser.parse_args()
    if not 0 <= args.val_fraction < 1:
        parser.error("--val-fraction must be in [0, 1)")
    if args.shard_tokens < 1:
        parser.error("--shard-tokens must be at least 1")

    if not args.gpt2:
        try:
            import tokenizers  # noqa: F401
        except ImportError:
            reexec_in_venv("`tokenizers` is not importable")

    texts = read_texts(args.inputs)
    if args.gpt2:
        tok = Gpt2Tiktoken()
        how = tok.describe()
    elif args.tokenizer:
        tok, how = load_tokenizer(args.tokenizer)
    else:
        tok, how = train_bpe(texts, args.vocab_size)

    version = 1 if tok.vocab_size <= 65536 else 2
    train, val, sources = [], [], []
    for path, raw, text in texts:
        ids = [tok.eot] + tok.encode(text)
        n_val = math.ceil(args.val_fraction * len(ids)) if args.val_fraction > 0 else 0
        train += ids[:len(ids) - n_val]
        val += ids[len(ids) - n_val:]
        sources.append({"path": os.path.abspath(path), "bytes": len(raw), "sha256": sha256_bytes(raw),
                        "tokens": len(ids), "val_tokens": n_val})
    if max(train, default=0) >= tok.vocab_size or max(val, default=0) >= tok.vocab_size:
        sys.exit("prepare-data: the tokenizer produced an id outside its vocabulary")

    pieces = [(split, i, piece) for split, tokens in (("train", train), ("val", val))
              for i, piece in enumerate(split_evenly(tokens, args.shard_tokens))]
    for split, i, piece in pieces:  # checked before anything is written
        if args.context and len(piece) < args.context + 1:
            sys.exit(f"prepare-data: {split} shard {i} would have {len(piece)} tokens, fewer than "
                     f"one window of --context + 1 = {args.context + 1}: use more text, another "
                     "--val-fraction or larger --shard-tokens")
    os.makedirs(args.out, exist_ok=True)
    shards = []
    for split, i, piece in pieces:
        name = f"{split}_{i:06d}.bin"
        data = shard_bytes(piece, version)
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(data)
        shards.append({"name": name, "split": split, "tokens": len(piece),
                       "sha256": sha256_bytes(data)})
    if args.gpt2:
        tok_file = None
    else:
        tok_file = os.path.join(args.out, "tokenizer.json")
        tok.save(tok_file)
    meta = {
        "format": "llm.c",
        "version": version,
        "dtype": "uint16" if version == 1 else "uint32",
        "vocab_size": tok.vocab_size,
        "eot_id": tok.eot,
        "tokenizer": how,
        "val_fraction": args.val_fraction,
        "val_split": "the last ceil(val_fraction * n) tokens of each file",
        "train_tokens": len(train),
        "val_tokens": len(val),
        "sources": sources,
        "shards": shards,
    }
    if tok_file:
        with open(tok_file, "rb") as f:
            meta["tokenizer"]["sha256"] = sha256_bytes(f.read())
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
    n_train = sum(1 for s in shards if s["split"] == "train")
    print(f"prepare-data: {len(train)} training tokens in {n_train} shard(s), {len(val)} "
          f"validation tokens in {len(shards) - n_train}, vocab {tok.vocab_size} "
          f"({meta['dtype']}), in {args.out}")


if __name__ == "__main__":
    main()
