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
import re
import statistics
import sys
import tempfile
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import cluster_test  # noqa: E402  (the test harness's Cluster: processes, batonctl)

ROOT = os.path.join(HERE, "..")


def example_gpt(layers=None, name="gpt-example"):
    with open(os.path.join(ROOT, "client", "examples", "gpt.json")) as f:
        spec = json.load(f)
    spec["name"] = name
    if layers is not None:
        spec["model"]["gpt"]["layers"] = layers
    return spec


def scrape_memory(address):
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for state in ("peak", "in_use"):
        m = re.search(r'^baton_worker_device_memory_bytes\{[^}]*state="%s"[^}]*\} (\S+)$' % state,
                      text, re.M)
        out[state] = float(m.group(1)) if m else float("nan")
    return out


def run(bin_dir, spec, stages, recompute, steps):
    with tempfile.TemporaryDirectory(prefix="baton-recompute-") as tmp:
        c = cluster_test.Cluster(bin_dir, os.path.join(ROOT, "client", "examples"), tmp)
        c.worker_flags = lambda wid: ["--metrics_listen", "127.0.0.1:0", "--metrics_port_file",
                                      os.path.join(tmp, f"{wid}.metrics")]
        try:
            c.start_coordinator()
            for i in range(stages):
                c.start_worker(f"w-{i + 1}")
            c.wait_idle(stages)
            path = c.write_spec(spec)
            r = c.ctl("submit", "-f", path, "--stages", str(stages), "--steps", str(steps),
                      "--recompute", recompute, "--watch", "--output", "json", timeout=900)
            lines = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
            job = c.get(lines[0]["id"])
            if job["state"] != "JOB_STATE_SUCCEEDED":
                raise SystemExit(f"job failed: {cluster_test.last_reason(job)}")
            durations = [float(e["step"]["duration"].rstrip("s")) for e in lines[1:]
                         if "step" in e]
            ranks = {}
            for wid in job.get("workers", []):
                with open(os.path.join(tmp, f"{wid}.metrics")) as f:
                    ranks[wid] = scrape_memory(f.read().strip())
            return {
                "step_s": statistics.median(durations[2:] or durations),
                "ranks": [ranks[w] for w in job.get("workers", [])],
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
