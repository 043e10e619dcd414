"""baton's GPT, its character data and its initial weights, in PyTorch, for the peer benchmark.

Imported by bench/peer/torch_train.py and bench/peer/accuracy.py; not a program. What it
replicates, so that PyTorch trains the model baton trains, on the batches baton reads,
from the weights baton starts from:

- RngStream (common/core/rng.h): Philox4x32-10 keyed by SplitMix64(seed ^ FNV-1a(name)),
  Bits, Bits64, UniformInt (multiply-shift) and Normal (Box-Muller in double, cos branch
  for even indices, sin for odd, rounded to float).
- TextDataset (common/data/dataset.h): the vocabulary is the text's distinct bytes in
  ascending order; sample i of step s (0-based) starts at
  RngStream(seed, "data/text/step/" + s).UniformInt(i, len - context) and is context + 1
  consecutive ids, inputs the first context, targets the last.
- The gpt model (common/nn/model.cc, transformer.cc, layers.cc): token + position
  embedding (std 0.02 and 0.01), pre-LN GPT-2 blocks (LayerNorm eps 1e-5, qkv and mlp.fc
  std 0.02, attn.proj and mlp.proj std 0.02 / sqrt(2 layers), zero biases, GELU with the
  tanh approximation, softmax attention with the causal mask), a final LayerNorm and a
  bias-free output projection, tied to the token embedding unless the spec says
  tieEmbeddings: false. Every parameter is drawn from (seed, its baton name).
- AdamW (common/optim): decoupled weight decay on the weight matrices only
  (WEIGHT_DECAY_SCOPE_MATRICES: not the embeddings, not a tied output projection, not
  norms or biases); baton's defaults beta1 0.9, beta2 0.999, epsilon 1e-8, weight decay
  0.01; constant learning rate (the specs here have no lr_schedule).

The block is bench/pytorch_gpt.py's (the same module the single-core GPT benchmark uses);
only the embedding tie and the initialisation differ from that file's Gpt.
"""

import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import pytorch_gpt  # noqa: E402  (bench/pytorch_gpt.py: Block, CausalSelfAttention)

M32 = 0xFFFFFFFF
M64 = 0xFFFFFFFFFFFFFFFF
_PHILOX_M0, _PHILOX_M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_PHILOX_W0, _PHILOX_W1 = 0x9E3779B9, 0xBB67AE85


def fnv1a64(s):
    h = 0xCBF29CE484222325
    for ch in s.encode():
        h = ((h ^ ch) * 0x100000001B3) & M64
    return h


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def philox4x32(blocks, key):
    """Philox4x32-10 of the counters (block lo, block hi, 0, 0) for every block index in
    `blocks` (uint64 array) under key (k0, k1): a [n, 4] uint64 array of 32-bit words."""
    mask = np.uint64(M32)
    blocks = np.asarray(blocks, dtype=np.uint64)
    c0 = blocks & mask
    c1 = blocks >> np.uint64(32)
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    k0, k1 = key
    for _ in range(10):
        p0 = _PHILOX_M0 * c0  # < 2^64: exact in uint64
        p1 = _PHILOX_M1 * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & mask
        hi1, lo1 = p1 >> np.uint64(32), p1 & mask
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint64(k0), lo1, hi0 ^ c3 ^ np.uint64(k1), lo0
        k0 = (k0 + _PHILOX_W0) & M32
        k1 = (k1 + _PHILOX_W1) & M32
    return np.stack([c0, c1, c2, c3], axis=1)


class RngStream:
    """common/core/rng.h's RngStream: value n of stream (seed, name)."""

    def __init__(self, seed, name):
        k = splitmix64((seed & M64) ^ fnv1a64(name))
        self.key = (k & M32, k >> 32)

    def bits(self, count):
        """Bits(0 .. count-1) as a uint64 array."""
        blocks = np.arange((count + 3) // 4, dtype=np.uint64)
        return philox4x32(blocks, self.key).reshape(-1)[:count]

    def uniform_int(self, n, bound):
        """UniformInt(n, bound) = (Bits64(n) * bound) >> 64 (exact, Python ints)."""
        w = philox4x32(np.array([n // 2], dtype=np.uint64), self.key)[0]
        lo, hi = (int(w[0]), int(w[1])) if n % 2 == 0 else (int(w[2]), int(w[3]))
        return (((hi << 32) | lo) * bound) >> 64

    def normal(self, count):
        """Normal(0 .. count-1) as float32: Box-Muller in double, rounded once."""
        pairs = (count + 1) // 2
        b = self.bits(2 * pairs).reshape(pairs, 2).astype(np.float64)
        u1 = (b[:, 0] + 1.0) * (1.0 / 4294967296.0)
        u2 = b[:, 1] * (1.0 / 4294967296.0)
        r = np.sqrt(-2.0 * np.log(u1))
        theta = 2.0 * math.pi * u2
        out = np.empty(2 * pairs, dtype=np.float64)
        out[0::2] = r * np.cos(theta)
        out[1::2] = r * np.sin(theta)
        return out[:count].astype(np.float32)

    def fill_normal(self, shape, stddev):
        """FillNormal(out, n, 0, stddev): 0 + stddev * Normal(i) in float32."""
        n = int(np.prod(shape))
        return (np.float32(0.0) + np.float32(stddev) * self.normal(n)).reshape(shape)


def _get(d, camel, snake, default=None):
    return d.get(camel, d.get(snake, default))


def load_spec(path):
    """The fields of a gpt job spec this benchmark uses, with baton's defaults."""
    with open(path) as f:
        spec = json.load(f)
    g = spec["model"]["gpt"]
    pipe = spec.get("pipeline", {})
    opt = spec.get("optimizer", {})
    adamw = opt.get("adamw")
    if adamw is None:
        raise SystemExit(f"{path}: the peer benchmark needs optimizer.adamw")
    scope = _get(opt, "weightDecayScope", "weight_decay_scope", "WEIGHT_DECAY_SCOPE_MATRICES")
    if scope not in ("WEIGHT_DECAY_SCOPE_MATRICES", "WEIGHT_DECAY_SCOPE_UNSPECIFIED"):
        raise SystemExit(f"{path}: only WEIGHT_DECAY_SCOPE_MATRICES is replicated, not {scope}")
    for unsupported in ("lrSchedule", "lr_schedule", "clipGradNorm", "clip_grad_norm"):
        if opt.get(unsupported):
            raise SystemExit(f"{path}: optimizer.{unsupported} is not replicated here")
    text = spec["data"].get("text", {})
    if "path" not in text:
        raise SystemExit(f"{path}: the peer benchmark needs data.text.path (character data)")
    # The model and optimizer fields bench/pytorch_gpt.py reads, and what this one adds.
    s = pytorch_gpt.load_spec(path)
    s.update(
        name=spec.get("name", "job"),
        tied=_get(g, "tieEmbeddings", "tie_embeddings", True),
        text_path=text["path"],
        S=pipe.get("stages", 1),
        schedule=pipe.get("schedule", "SCHEDULE_GPIPE"),
        steps=spec.get("steps", 1),
        seed=int(s["seed"]),
    )
    return s


class TextData:
    """common/data's TextDataset: batches of a step as baton draws them."""

    def __init__(self, path, context, vocab, batch, seed):
        with open(path, "rb") as f:
            raw = f.read()
        alphabet = sorted(set(raw))
        if len(alphabet) > vocab:
            raise SystemExit(f"{path}: {len(alphabet)} distinct bytes, more than vocab {vocab}")
        rank = np.zeros(256, dtype=np.int64)
        rank[alphabet] = np.arange(len(alphabet))
        self.ids = torch.from_numpy(rank[np.frombuffer(raw, dtype=np.uint8)])
        self.T, self.batch, self.seed = context, batch, seed
        self.bound = len(raw) - context
        self.num_chars = len(alphabet)

    def offsets(self, step):
        rng = RngStream(self.seed, f"data/text/step/{step}")
        return [rng.uniform_int(i, self.bound) for i in range(self.batch)]

    def batch_of(self, offsets):
        """inputs, targets: int64 [len(offsets), T]."""
        idx = torch.tensor(offsets, dtype=torch.int64)[:, None] + torch.arange(self.T + 1)
        w = self.ids[idx]
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def step_batch(self, step):
        return self.batch_of(self.offsets(step))


class Embed(nn.Module):
    def __init__(self, V, T, C):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.register_buffer("pos", torch.arange(T), persistent=False)

    def forward(self, idx):
        return self.wte(idx) + self.wpe(self.pos[: idx.shape[1]])


class Head(nn.Module):
    """Final LayerNorm and the bias-free projection to the logits."""

    def __init__(self, V, C):
        super().__init__()
        self.ln_f = nn.LayerNorm(C)
        self.logits = nn.Linear(C, V, bias=False)

    def forward(self, x):
        return self.logits(self.ln_f(x))


class BatonGpt(nn.Module):
    """baton's gpt as a list of its blocks: embed, block.0 .. block.{L-1}, head."""

    def __init__(self, s, sdpa=False):
        super().__init__()
        V, T, C, H, L = s["V"], s["T"], s["C"], s["H"], s["L"]
        self.embed = Embed(V, T, C)
        self.blocks = nn.ModuleList([pytorch_gpt.Block(C, H, T, sdpa) for _ in range(L)])
        self.head = Head(V, C)
        self.tied = s["tied"]
        init_like_baton(self, s)
        if self.tied:
            self.head.logits.weight = self.embed.wte.weight  # one tensor: grads summed

    def forward(self, idx, targets=None):
        x = self.embed(idx)
        for b in self.blocks:
            x = b(x)
        logits = self.head(x)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.reshape(-1))


def baton_names(model_or_stage, s, first_layer=0):
    """(baton parameter name, torch parameter) pairs of a BatonGpt or a pipeline stage."""
    out = []
    for name, p in model_or_stage.named_parameters(remove_duplicate=False):
        parts = name.split(".")
        if parts[0] == "embed":
            out.append(("embed.token" if parts[1] == "wte" else "embed.position", p))
        elif parts[0] == "head":
            out.append(("head.ln." + parts[-1] if parts[1] == "ln_f"
                        else "head.logits.weight", p))
        elif parts[0] == "blocks":
            b = f"block.{int(parts[1]) + first_layer}"
            rest = ".".join(parts[2:])
            mapping = {"ln1.weight": "ln1.weight", "ln1.bias": "ln1.bias",
                       "ln2.weight": "ln2.weight", "ln2.bias": "ln2.bias",
                       "attn.qkv.weight": "attn.qkv.weight", "attn.qkv.bias": "attn.qkv.bias",
                       "attn.proj.weight": "attn.proj.weight",
                       "attn.proj.bias": "attn.proj.bias",
                       "fc.weight": "mlp.fc.weight", "fc.bias": "mlp.fc.bias",
                       "mproj.weight": "mlp.proj.weight", "mproj.bias": "mlp.proj.bias"}
            out.append((f"{b}.{mapping[rest]}", p))
        else:
            raise ValueError(f"unexpected parameter {name}")
    return out


def init_like_baton(module, s, first_layer=0):
    """Every parameter as baton draws it from (seed, name): common/nn/layers.cc."""
    L = s["L"]
    resid = np.float32(0.02) / np.sqrt(np.float32(2.0) * np.float32(L))
    with torch.no_grad():
        for name, p in baton_names(module, s, first_layer):
            if name.endswith((".ln1.weight", ".ln2.weight", "head.ln.weight")):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                std, draw = np.float32(0.02), name
                if name == "embed.position":
                    std = np.float32(0.01)
                elif name.endswith(("attn.proj.weight", "mlp.proj.weight")):
                    std = resid
                elif name == "head.logits.weight" and s["tied"]:
                    draw = "embed.token"  # the tied projection starts as the embedding
                p.copy_(torch.from_numpy(RngStream(s["seed"], draw).fill_normal(tuple(p.shape), std)))


def decays(name, tied):
    """WEIGHT_DECAY_SCOPE_MATRICES: docs/training.md."""
    if name in ("embed.token", "embed.position"):
        return False
    if name == "head.logits.weight":
        return not tied
    return name.endswith(".weight") and not name.endswith(("ln1.weight", "ln2.weight",
                                                           "head.ln.weight"))


def make_adamw(module, s, first_layer=0):
    """torch.optim.AdamW with baton's parameter groups (decay on the matrices only)."""
    seen, decay, no_decay = set(), [], []
    for name, p in baton_names(module, s, first_layer):
        if id(p) in seen:
            continue  # a tied tensor appears twice
        seen.add(id(p))
        (decay if decays(name, s["tied"]) else no_decay).append(p)
    groups = [dict(params=decay, weight_decay=s["wd"]), dict(params=no_decay, weight_decay=0.0)]
    return torch.optim.AdamW(groups, lr=s["lr"], betas=(s["beta1"], s["beta2"]), eps=s["eps"])


def self_test():
    """Known answers of common/core/rng_test.cc."""
    w = philox4x32(np.array([0], dtype=np.uint64), (0, 0))[0]
    assert [int(x) for x in w] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8], w
    assert fnv1a64("foobar") == 0x85944171F73967E8
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(1) == 0x910A2DEC89025CC1


self_test()
