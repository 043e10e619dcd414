#!/usr/bin/env python3
"""Checkpoints as other tools see them.

Trains the example-sized GPT with checkpoints through `batonctl train-local` (reference
trainer, then resumed as a 2-stage pipeline), exports the weights with `batonctl export`, and
reads everything with the Python `safetensors` package (the one PyTorch and Hugging Face
use), not with baton's own reader:
  * every block file loads, its manifest SHA-256 matches hashlib's, its metadata says what
    it holds, and it carries the optimizer's moments beside the weights;
  * the export holds exactly the blocks' weights, tensor for tensor and bit for bit;
  * the weights digest recomputed in Python from the exported tensors (the scheme in
    docs/architecture.md) equals the digest train-local printed.
Usage: checkpoint_interop_test.py --batonctl PATH --python PYTHON_WITH_SAFETENSORS
(re-executes itself under that Python).
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

SPEC = {
    "model": {"gpt": {"vocabSize": 40, "context": 16, "dModel": 32, "heads": 2, "layers": 3}},
    "data": {"text": {"inlineText": "checkpoints must load anywhere, bit for bit, always."},
             "batchSize": 8},
    "pipeline": {"microbatches": 2, "stages": 2},
    "optimizer": {"adamw": {"learningRate": 0.003}},
    "steps": 6,
    "seed": 5,
}


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p.stdout + p.stderr


def digest_of(output):
    m = re.search(r"weights digest ([0-9a-f]{64})", output)
    if not m:
        sys.exit(f"FAIL: no weights digest in\n{output}")
    return m.group(1)


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")
    print(f"ok: {what}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batonctl", required=True)
    ap.add_argument("--python", help="a Python with safetensors and numpy")
    args = ap.parse_args()
    if args.python and os.environ.get("CHECKPOINT_INTEROP_REEXEC") != "1":
        # A virtual environment's python links to the system one: compare by environment.
        os.environ["CHECKPOINT_INTEROP_REEXEC"] = "1"
        os.execv(args.python, [args.python, __file__, "--batonctl", args.batonctl])
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file

    with tempfile.TemporaryDirectory() as tmp:
        spec = dict(SPEC, checkpoint={"everySteps": 3, "dir": tmp, "keep": 2})
        spec_path = os.path.join(tmp, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        straight = digest_of(run([args.batonctl, "train-local", "-f", spec_path,
                                  "--job-id", "straight"]))
        # Resume the reference trainer's step-3 checkpoint on a 2-stage pipeline.
        resumed_out = run([args.batonctl, "train-local", "-f", spec_path, "--pipeline",
                           "--job-id", "resumed", "--resume-from",
                           os.path.join(tmp, "straight") + "@3"])
        check(digest_of(resumed_out) == straight,
              "a pipeline resumed from the reference trainer's checkpoint ends with its digest")

        step_dir = os.path.join(tmp, "resumed", "step-6")
        manifests = sorted(f for f in os.listdir(step_dir) if f.startswith("manifest."))
        check(manifests == ["manifest.rank-0.json", "manifest.rank-1.json"],
              f"one manifest per pipeline rank ({manifests})")
        blocks = {}
        for m in manifests:
            with open(os.path.join(step_dir, m)) as f:
                doc = json.load(f)
            check(doc["step"] == 6 and doc["num_blocks"] == 5, f"{m} names step 6 of 5 blocks")
            for b in doc["blocks"]:
                blocks[b["index"]] = b
        check(sorted(blocks) == list(range(5)), "the manifests cover every block once")
        weights = {}
        for i in range(5):
            b = blocks[i]
            path = os.path.join(step_dir, b["file"])
            with open(path, "rb") as f:
                data = f.read()
            check(hashlib.sha256(data).hexdigest() == b["sha256"] and len(data) == b["bytes"],
                  f"{b['file']}: SHA-256 and size match the manifest")
            with safe_open(path, framework="numpy") as f:
                meta = f.metadata()
                names = list(f.keys())
            check(meta["block"] == b["block"] and meta["step"] == "6" and
                  meta["job"] == "resumed" and meta["optimizer_steps"] == "6",
                  f"{b['file']}: metadata {meta}")
            tensors = load_file(path)
            params = [n for n in names if not n.startswith("optimizer.")]
            check(params and all(n.startswith(b["block"] + ".") for n in params),
                  f"{b['file']}: {len(params)} parameters named under {b['block']}")
            slots = [f"optimizer.{slot}.{p}" for p in params for slot in ("exp_avg", "exp_avg_sq")]
            check(sorted(slots + params) == sorted(names) and
                  all(tensors[f"optimizer.exp_avg.{p}"].shape == tensors[p].shape for p in params),
                  f"{b['file']}: each parameter has its AdamW moments beside it, nothing else")
            for p in params:
                weights[p] = tensors[p]
            check(all(t.dtype == np.float32 for t in tensors.values()), f"{b['file']}: all F32")

        export = os.path.join(tmp, "model.safetensors")
        run([args.batonctl, "export", "--from", os.path.join(tmp, "resumed"), "-o", export])
        exported = load_file(export)
        with safe_open(export, framework="numpy") as f:
            order = list(f.keys())
            meta = f.metadata()
        check(meta["step"] == "6", f"the export is of step 6 ({meta})")
        check(set(exported) == set(weights), "the export holds every weight and nothing else")
        check(all(np.array_equal(exported[n].view(np.uint32), weights[n].view(np.uint32))
                  for n in weights), "every exported tensor equals its block file's, bit for bit")

        # The weights digest, recomputed: per block SHA-256 over its parameters' float32
        # little-endian bytes in declared order (the block file's order), then SHA-256 over
        # the concatenated block digests in block order.
        block_digests = b""
        for i in range(5):
            path = os.path.join(step_dir, blocks[i]["file"])
            with safe_open(path, framework="numpy") as f:
                params = [n for n in f.keys() if not n.startswith("optimizer.")]
            # safe_open lists keys sorted; the declared order is the data order in the file.
            header_len = int.from_bytes(open(path, "rb").read(8), "little")
            header = json.loads(open(path, "rb").read(8 + header_len)[8:])
            params.sort(key=lambda n: header[n]["data_offsets"][0])
            h = hashlib.sha256()
            for p in params:
                h.update(exported[p].astype("<f4").tobytes())
            block_digests += h.digest()
        check(hashlib.sha256(block_digests).hexdigest() == straight,
              "the digest recomputed from the export equals train-local's")
    print("checkpoint_interop_test: all checks passed")


if __name__ == "__main__":
    main()
