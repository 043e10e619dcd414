#!/usr/bin/env python3
"""bf16 against fp32 training loss, in baton and in PyTorch: the peer benchmark's accuracy half.

For each seed, trains the peer benchmark's GPT (bench/peer/gpt4-s2-1f1b.json: 4 layers,
d_model 128, character data of the GPL-3 text, batch 32 in 4 micro-batches, AdamW lr 3e-3)
four times for --steps steps (default 100):

  baton fp32     batonctl train-local --precision fp32 --seed S   (its per-step losses)
  baton bf16     batonctl train-local --precision bf16 --seed S   (docs/precision.md)
  PyTorch fp32   eager, in this process (bench/peer/torch_train.py's loop)
  PyTorch bf16   the same under torch.autocast("cpu", dtype=torch.bfloat16)

PyTorch starts from baton's initial weights for that seed and reads baton's batches
(bench/peer/baton_gpt.py replicates baton's Philox streams, its character sampler and its
initialisation), so the four runs of a seed see the same data in the same order from the
same weights; the fp32 pair differs only by float rounding (the report shows how much).

Reports, per seed and averaged over the seeds, each run's mean training loss over the
last --window steps (default 20: steps 81-100 of 100), and bf16 - fp32 for each side. The
step loss is each side's own: the mean over the step's micro-batches of the mean
cross-entropy of their tokens, computed before that step's update. Prints markdown; --json
writes every step's loss too. Exits non-zero only when a run fails.

Usage: python3 bench/peer/accuracy.py [--seeds 1,2,3,4,5] [--steps 100] [--window 20]
           [--json acc.json] [--bin build/bin] [--spec bench/peer/gpt4-s2-1f1b.json]
Normally run as bench/peer/run.sh --accuracy [flags], which provides PyTorch.
"""

import argparse
import datetime
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

import baton_gpt  # noqa: E402
import torch_train  # noqa: E402

CONFIGS = ("baton fp32", "baton bf16", "torch fp32", "torch bf16")


def sha256_prefix(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def baton_losses(batonctl, spec, steps, seed, precision, timeout):
    cmd = [batonctl, "train-local", "-f", spec, "--steps", str(steps), "--seed", str(seed),
           "--precision", precision, "--blas-threads", "1", "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"accuracy: {' '.join(cmd)}: exit {r.returncode}\n{r.stderr[-3000:]}")
    rep = json.loads(r.stdout)
    losses = [s["loss"] for s in rep["steps"]]
    if len(losses) != steps:
        raise SystemExit(f"accuracy: train-local reported {len(losses)} steps, {steps} asked")
    return losses, rep.get("kernels")


def torch_losses(s, steps, seed, precision, sdpa, threads):
    s = dict(s, seed=seed)
    return [st["loss"] for st in torch_train.train_one_process(s, steps, precision, sdpa,
                                                                threads)]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", default=os.path.join(HERE, "gpt4-s2-1f1b.json"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--seeds", default="1,2,3,4,5", help="comma-separated seeds")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--window", type=int, default=20, help="mean over the last W steps")
    ap.add_argument("--attention", default="explicit", choices=["explicit", "sdpa"])
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per baton run")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    seeds = [int(x) for x in a.seeds.split(",") if x]
    if not seeds:
        ap.error("--seeds: none given")
    if not 1 <= a.window <= a.steps:
        ap.error("--window must be in [1, --steps]")
    batonctl = os.path.join(a.bin, "batonctl")
    if not os.access(batonctl, os.X_OK):
        print(f"accuracy: {batonctl} is not built", file=sys.stderr)
        return 1
    spec = os.path.abspath(a.spec)
    s = baton_gpt.load_spec(spec)
    build_before = sha256_prefix(batonctl)
    first = a.steps - a.window + 1
    started = time.perf_counter()

    runs, kernels, run_kernels = {}, set(), {}
    for seed in seeds:
        for cfg in CONFIGS:
            side, precision = cfg.split()
            t0 = time.perf_counter()
            if side == "baton":
                losses, k = baton_losses(batonctl, spec, a.steps, seed, precision, a.timeout)
                kernels.add(k)
                run_kernels[(seed, cfg)] = k
            else:
                losses = torch_losses(s, a.steps, seed, precision, a.attention == "sdpa",
                                      a.threads)
            if not all(math.isfinite(x) for x in losses):
                raise SystemExit(f"accuracy: {cfg}, seed {seed}: a non-finite loss")
            runs[(seed, cfg)] = dict(losses=losses, mean=statistics.fmean(losses[first - 1:]),
                                     seconds=time.perf_counter() - t0)
            print(f"accuracy: seed {seed} {cfg}: mean loss steps {first}-{a.steps} "
                  f"{runs[(seed, cfg)]['mean']:.4f} ({runs[(seed, cfg)]['seconds']:.0f} s)",
                  file=sys.stderr, flush=True)

    build_after = sha256_prefix(batonctl)

    def mean_of(cfg):
        return statistics.fmean(runs[(seed, cfg)]["mean"] for seed in seeds)

    out = sys.stdout.write
    out(f"# bf16 vs fp32 training loss, baton and PyTorch "
        f"({datetime.date.today().isoformat()})\n\n")
    out(f"Model {os.path.relpath(spec, ROOT)}; {a.steps} steps at lr {s['lr']:g}; mean training "
        f"loss over steps {first}-{a.steps}; seeds {', '.join(map(str, seeds))}. Both sides "
        "start from baton's initial weights of the seed and read baton's batches. baton: "
        f"train-local ({' | '.join(sorted(k for k in kernels if k))}). PyTorch "
        f"{torch_train.torch.__version__} eager, {a.attention} attention, {a.threads} "
        "thread(s); bf16 = torch.autocast(cpu, bfloat16) with float32 master weights.\n\n")
    out("| seed | baton fp32 | baton bf16 | baton bf16 − fp32 | PyTorch fp32 | PyTorch bf16 | "
        "PyTorch bf16 − fp32 | fp32: baton − PyTorch |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|\n")
    rows = []
    for seed in seeds:
        m = {cfg: runs[(seed, cfg)]["mean"] for cfg in CONFIGS}
        rows.append(dict(seed=seed, **{cfg.replace(" ", "_"): m[cfg] for cfg in CONFIGS},
                         baton_delta=m["baton bf16"] - m["baton fp32"],
                         torch_delta=m["torch bf16"] - m["torch fp32"],
                         fp32_gap=m["baton fp32"] - m["torch fp32"]))
        r = rows[-1]
        out(f"| {seed} | {m['baton fp32']:.4f} | {m['baton bf16']:.4f} | "
            f"{r['baton_delta']:+.4f} | {m['torch fp32']:.4f} | {m['torch bf16']:.4f} | "
            f"{r['torch_delta']:+.4f} | {r['fp32_gap']:+.5f} |\n")
    avg = {cfg: mean_of(cfg) for cfg in CONFIGS}
    d_b = statistics.fmean(r["baton_delta"] for r in rows)
    d_t = statistics.fmean(r["torch_delta"] for r in rows)
    gap = statistics.fmean(r["fp32_gap"] for r in rows)
    sd = (lambda key: statistics.stdev(r[key] for r in rows)) if len(rows) > 1 else (
        lambda key: float("nan"))
    out(f"| **mean** | **{avg['baton fp32']:.4f}** | **{avg['baton bf16']:.4f}** | "
        f"**{d_b:+.4f}** | **{avg['torch fp32']:.4f}** | **{avg['torch bf16']:.4f}** | "
        f"**{d_t:+.4f}** | **{gap:+.5f}** |\n")
    n = len(rows)
    if n > 1:
        out(f"| std over seeds | | | {sd('baton_delta'):.4f} | | | {sd('torch_delta'):.4f} | "
            f"{sd('fp32_gap'):.5f} |\n")
    out("\n")
    step1 = max(abs(runs[(seed, 'baton fp32')]["losses"][0]
                    - runs[(seed, 'torch fp32')]["losses"][0]) for seed in seeds)
    out(f"fp32 step-1 loss, baton vs PyTorch (same weights, same batch): largest difference "
        f"over the seeds {step1:.2e}.\n\n")

    def se(key):
        return f" ± {sd(key) / math.sqrt(n):.4f}" if n > 1 else ""
    out(f"Reading it: the two fp32 runs of a seed differ only in float rounding, and their "
        f"window means differ by {statistics.fmean(abs(r['fp32_gap']) for r in rows):.4f} on "
        f"average (largest {max(abs(r['fp32_gap']) for r in rows):.4f}): that is how far "
        "rounding alone moves this window after these steps, the noise floor a bf16 − fp32 "
        f"difference must rise above. Means over {n} seed(s)"
        f"{' ± their standard error' if n > 1 else ''}: baton bf16 − fp32 "
        f"{d_b:+.4f}{se('baton_delta')}, PyTorch bf16 − fp32 {d_t:+.4f}{se('torch_delta')}.\n")
    out(f"\nbatonctl: SHA-256 {build_before}.\n")
    if build_after != build_before:
        out(f"\n**Warning:** batonctl changed during the run ({build_before} → {build_after}): "
            "the seeds may have run different builds.\n")
    if len(kernels) > 1:
        out("\n**Warning:** baton's runs reported different kernels (were the binaries "
            "rebuilt during the run?); --json has each run's.\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(
                date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                spec=os.path.relpath(spec, ROOT), steps=a.steps, window=[first, a.steps],
                seeds=seeds, attention=a.attention, threads=a.threads,
                baton_kernels=sorted(k for k in kernels if k), torch=torch_train.torch.__version__,
                per_seed=rows, mean=dict(avg, baton_delta=d_b, torch_delta=d_t, fp32_gap=gap),
                losses={f"{seed} {cfg}": runs[(seed, cfg)]["losses"]
                        for seed in seeds for cfg in CONFIGS},
                batonctl_sha256=[build_before, build_after],
                baton_run_kernels={f"{seed} {cfg}": k for (seed, cfg), k in run_kernels.items()},
                total_seconds=time.perf_counter() - started), f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
