#!/usr/bin/env python3
"""Activation recomputation, measured on a real cluster: peak memory per rank and step time
with pipeline.recompute NONE and FULL.

Each run starts a fresh coordinator and S workers (so each worker's allocator peak is that
job's), submits the spec with --watch, and reads:
  * step time: the median StepProgress.duration after the first two steps;
  * per rank: baton_worker_device_memory_bytes{state="peak"} (live tensors' high-water mark
    over the job) and {state="in_use"} at the last step's end (weights, gradients and
    optimizer state); their difference is what a step holds on top: stashed activations,
    in-flight tensors and temporaries.
Both modes must end with the same weights digest (checked).

    python3 bench/recompute_bench.py --bin-dir build/bin [--steps 12]
"""
import argparse
import json
import os
import statistics
import tempfile

from cluster_bench import ROOT, fresh_cluster, watch_job, worker_memory


def example_gpt(layers=None, name="gpt-example"):
    with open(os.path.join(ROOT, "client", "examples", "gpt.json")) as f:
        spec = json.load(f)
    spec["name"] = name
    if layers is not None:
        spec["model"]["gpt"]["layers"] = layers
    return spec


def run(bin_dir, spec, stages, recompute, steps):
    with tempfile.TemporaryDirectory(prefix="baton-recompute-") as tmp:
        c = fresh_cluster(bin_dir, tmp, stages)
        try:
            job, durations = watch_job(c, c.write_spec(spec), "--stages", str(stages),
                                       "--steps", str(steps), "--recompute", recompute)
            return {
                "step_s": statistics.median(durations[2:] or durations),
                "ranks": [worker_memory(tmp, w) for w in job.get("workers", [])],
                "digest": job["weights_digest"],
            }
        finally:
            c.stop_all()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    mib = 1 << 20
    configs = [
        ("example GPT (gpt.json: 2 layers, d 128, ctx 64, batch 32, 1F1B S=4 M=4)",
         example_gpt(), 4),
        ("deeper GPT (same, 8 layers)", example_gpt(layers=8, name="gpt-deeper"), 4),
    ]
    for title, spec, stages in configs:
        results = {mode: run(args.bin_dir, spec, stages, mode, args.steps)
                   for mode in ("none", "full")}
        same = results["none"]["digest"] == results["full"]["digest"]
        print(f"\n{title}")
        print(f"  digests equal: {same} ({results['none']['digest'][:16]}...)")
        print("  rank | state MiB | step peak above state, MiB: none -> full (ratio)")
        for r, (a, b) in enumerate(zip(results["none"]["ranks"], results["full"]["ranks"])):
            extra_a = a["peak"] - a["in_use"]
            extra_b = b["peak"] - b["in_use"]
            print(f"  {r:4d} | {a['in_use'] / mib:9.2f} | {extra_a / mib:7.2f} -> {extra_b / mib:7.2f}"
                  f" ({extra_b / extra_a:.2f}x)")
        ta, tb = results["none"]["step_s"], results["full"]["step_s"]
        print(f"  step time (median): none {ta * 1e3:.1f} ms, full {tb * 1e3:.1f} ms "
              f"({tb / ta:.2f}x)")
        if not same:
            raise SystemExit("recomputation changed the weights")


if __name__ == "__main__":
    main()
