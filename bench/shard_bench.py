#!/usr/bin/env python3
"""The optimizer sharded across data-parallel replicas (optimizer.shard), measured on a real
cluster against the same job unsharded: step time, per-rank memory, bytes sent.

One stage, D replicas (D workers), so a worker is one rank and everything it sends goes to
its replica group. Each run starts a fresh coordinator and D workers (so each worker's
allocator peak is that job's), submits the spec with --watch, and reads:
  * step time: the median StepProgress.duration after the first two steps;
  * per rank: baton_worker_device_memory_bytes{state="peak"} (live tensors' high-water mark
    over the job) and {state="in_use"} after the last step (weights, gradients, optimizer
    state), against the planner's per-rank peak (`batonctl plan -f SPEC --output json`);
  * bytes sent per step per rank: the worker process's written bytes (/proc/PID/io wchar:
    its sockets, nearly all of it the group's collectives; the job writes no files) over
    the run, divided by the steps;
  * the sharded weights' all-gather, which STEP waits for at the end of the step: its time
    in the last step's trace (`batonctl trace`), mean over the ranks, against that step.
Unsharded and sharded runs alternate, R rounds; the report gives medians and each round's
ratio. Both must end with the same weights digest (checked).

    python3 bench/shard_bench.py --bin-dir build/bin [--replicas 1,2,4] [--rounds 3] [--steps 20]
                                 [--precision fp32|bf16] [--layers 2]

In bf16 a sharded replica keeps the Linear weights it does not own as bf16 bits; the
report adds each rank's bytes per parameter between steps (weights, gradients, optimizer
state: the allocator's in_use over the model's parameters).
"""
import argparse
import json
import os
import re
import statistics
import tempfile

from cluster_bench import ROOT, fresh_cluster, watch_job, worker_memory


def example_gpt(replicas, shard, steps, precision, layers):
    with open(os.path.join(ROOT, "client", "examples", "gpt.json")) as f:
        spec = json.load(f)
    spec["name"] = f"shard-bench-{precision}-d{replicas}{'-sharded' if shard else ''}"
    spec["model"]["gpt"]["layers"] = layers
    spec["precision"] = "PRECISION_BF16" if precision == "bf16" else "PRECISION_FP32"
    spec["pipeline"] = {"stages": 1, "microbatches": 4, "schedule": "SCHEDULE_1F1B",
                        "dataParallel": replicas}
    spec["optimizer"]["shard"] = shard
    spec["steps"] = steps
    return spec


def written_bytes(pid):
    with open(f"/proc/{pid}/io") as f:
        return int(re.search(r"^wchar: (\d+)$", f.read(), re.M).group(1))


def run(bin_dir, spec, replicas, steps):
    with tempfile.TemporaryDirectory(prefix="baton-shard-") as tmp:
        c = fresh_cluster(bin_dir, tmp, replicas)
        try:
            path = c.write_spec(spec)
            plan = json.loads(c.ctl_ok("plan", "-f", path, "--output", "json").stdout)
            predicted = plan["footprint"]["ranks"][0]["peak_bytes"]
            parameters = sum(st["parameters"] for st in plan["footprint"]["stages"])
            before = {w: written_bytes(c.procs[w].pid) for w in c.procs if w.startswith("w-")}
            job, durations = watch_job(c, path)
            # The last step's timeline: the collectives STEP waits for (the sharded weights'
            # all-gather; nothing unsharded), per rank, against the step.
            trace_path = os.path.join(tmp, "trace.json")
            c.ctl_ok("trace", job["id"], "--step", str(steps), "-o", trace_path)
            with open(trace_path) as f:
                events = json.load(f)
            events = events["traceEvents"] if isinstance(events, dict) else events
            gather = [e["dur"] / 1e6 for e in events
                      if e.get("ph") == "X" and e.get("name") == "all-reduce STEP"]
            ranks = []
            for wid in job.get("workers", []):
                m = worker_memory(tmp, wid)
                m["sent_per_step"] = (written_bytes(c.procs[wid].pid) - before[wid]) / steps
                ranks.append(m)
            return {
                "step_s": statistics.median(durations[2:] or durations),
                "last_step_s": durations[-1],
                "gather_s": statistics.mean(gather) if gather else 0.0,
                "ranks": ranks,
                "predicted": predicted,
                "parameters": parameters,
                "digest": job["weights_digest"],
            }
        finally:
            c.stop_all()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--replicas", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--layers", type=int, default=2, help="the example GPT's blocks")
    args = ap.parse_args()
    gpt = lambda d, shard: example_gpt(d, shard, args.steps, args.precision, args.layers)  # noqa: E731
    mib = 1 << 20
    print(f"cpu: {cpu_model()}; load before: {os.getloadavg()}")
    for d in [int(x) for x in args.replicas.split(",")]:
        if d == 1:  # nothing to shard across: the unsharded figures alone, for reference
            res = run(args.bin_dir, gpt(1, False), 1, args.steps)
            m = res["ranks"][0]
            print(f"\nexample GPT, 1 stage, D=1 (no sharding): step {res['step_s'] * 1e3:.1f} ms, "
                  f"state {m['in_use'] / mib:.3f} MiB, peak {m['peak'] / mib:.3f} MiB, planner "
                  f"{res['predicted'] / mib:.3f} MiB ({m['peak'] / res['predicted']:.3f}), sent "
                  f"{m['sent_per_step'] / 1024:.1f} KiB/step")
            continue
        rounds = []
        for _ in range(args.rounds):
            a = run(args.bin_dir, gpt(d, False), d, args.steps)
            b = run(args.bin_dir, gpt(d, True), d, args.steps)
            if a["digest"] != b["digest"]:
                raise SystemExit(f"D={d}: sharding changed the weights")
            rounds.append((a, b))
        print(f"\nexample GPT (gpt.json, {args.layers} layers: d 128, ctx 64, batch 32), 1 stage, D={d}, "
              f"1F1B M=4, AdamW, {args.precision}; digest {rounds[0][0]['digest'][:16]}... both ways")
        for i, (a, b) in enumerate(rounds):
            print(f"  round {i}: step {a['step_s'] * 1e3:.1f} ms unsharded, "
                  f"{b['step_s'] * 1e3:.1f} ms sharded ({b['step_s'] / a['step_s']:.3f}x)")
        ratios = [b["step_s"] / a["step_s"] for a, b in rounds]
        ta = statistics.median(a["step_s"] for a, _ in rounds)
        tb = statistics.median(b["step_s"] for _, b in rounds)
        print(f"  median step: {ta * 1e3:.1f} ms -> {tb * 1e3:.1f} ms; median ratio "
              f"{statistics.median(ratios):.3f}")
        shares = [b["gather_s"] / b["last_step_s"] for _, b in rounds]
        print(f"  the weights' all-gather at the end of the last step (sharded, mean over ranks): "
              + ", ".join(f"{b['gather_s'] * 1e3:.1f} ms" for _, b in rounds)
              + f" of the step: {', '.join(f'{x:.1%}' for x in shares)}")
        print("  mode      | rank | state MiB | bytes/param | peak MiB | planner MiB | peak/planner |"
              " sent/step KiB")
        for mode, res in (("unsharded", rounds[-1][0]), ("sharded", rounds[-1][1])):
            for r, m in enumerate(res["ranks"]):
                print(f"  {mode:9s} | {r:4d} | {m['in_use'] / mib:9.3f} |"
                      f" {m['in_use'] / res['parameters']:11.2f} | {m['peak'] / mib:8.3f} |"
                      f" {res['predicted'] / mib:11.3f} | {m['peak'] / res['predicted']:12.3f} |"
                      f" {m['sent_per_step'] / 1024:13.1f}")
    print(f"\nload after: {os.getloadavg()}")


def cpu_model():
    with open("/proc/cpuinfo") as f:
        m = re.search(r"^model name\s*: (.*)$", f.read(), re.M)
    return f"{m.group(1) if m else 'unknown'}, {os.cpu_count()} cores"


if __name__ == "__main__":
    main()
