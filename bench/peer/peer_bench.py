#!/usr/bin/env python3
"""baton against PyTorch on the CPU, in alternating rounds: the peer benchmark.

Trains the same GPT (bench/peer/gpt4-s2-1f1b.json: 4 layers, d_model 128, 4 heads,
context 64, character data of the GPL-3 text, vocab 96, batch 32 in 4 micro-batches,
AdamW lr 3e-3), from the same initial weights on the same batches (bench/peer/baton_gpt.py
replicates baton's initialisation and data sampler), with both sides, one kind after the
other, baton first, PyTorch second, round after round:

  fp32      `batonctl train-local --blas-threads 1` vs PyTorch eager, torch.set_num_threads(1)
  bf16      `batonctl train-local --precision bf16` vs torch.autocast("cpu", torch.bfloat16)
  pipeline  a baton cluster (a coordinator and 2 workers on loopback, 1 GEMM thread each;
            the job submitted with 2 stages, 1F1B, 4 micro-batches) vs
            torch.distributed.pipelining (PipelineStage + Schedule1F1B, gloo, 2 processes
            of 1 thread); and, as a third figure, `batonctl train-local --pipeline` (the
            same schedule on 2 stage threads in one process)

Every run is a fresh process (the cluster is started once and gets a new job per round).
Throughput is measured the same way on both sides: each side times its own steps (baton:
the step durations train-local reports, or that the coordinator records from the last
rank; PyTorch: time.perf_counter around each step, the last stage's in a pipeline), the
first --warmup steps are dropped, and tokens/s = tokens of the remaining steps / the sum
of their durations. Start-up (process start, imports, model build, cluster placement) is
in neither figure. /proc/loadavg is read before and after each round: the machine may be
shared, and a round under load is slower for whichever side it hits.

Prints a markdown report (per kind: each round's baton and PyTorch tokens/s and their
ratio baton / PyTorch, then the medians and the median ratio; the CPU, both sides'
kernels, the load) and, with --json, writes everything, every step's duration included.
Exits non-zero only when a run fails (or its losses are not finite), never on speed.

Usage: python3 bench/peer/peer_bench.py [--rounds 3] [--steps 30] [--warmup 5]
           [--kinds fp32,bf16,pipeline] [--smoke] [--json out.json]
           [--bin build/bin] [--spec bench/peer/gpt4-s2-1f1b.json]
Normally run through bench/peer/run.sh, which makes or reuses the PyTorch virtualenv.
"""

import argparse
import csv
import ctypes
import datetime
import hashlib
import io
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
KINDS = ("fp32", "bf16", "pipeline")


class RunFailed(Exception):
    pass


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def cpu_ticks():
    """The machine's CPU time so far from /proc/stat: (busy, steal, total) in ticks."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (v + [0] * 8)[:8]
    return user + nice + system + irq + softirq, steal, sum(v[:8])


def cpu_share(before, after):
    """The busy and stolen shares of all CPUs' time between two cpu_ticks() readings."""
    total = max(1, after[2] - before[2])
    return dict(busy=(after[0] - before[0]) / total, steal=(after[1] - before[1]) / total)


def cpu_info():
    fields = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if not line.strip():
                break  # the first processor is enough
            k, _, v = line.partition(":")
            fields[k.strip()] = v.strip()
    flags = set(fields.get("flags", "").split())
    wanted = ["avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"]
    mem = None
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = round(int(line.split()[1]) / 2**20, 1)
    return dict(
        model_name=fields.get("model name"), vendor=fields.get("vendor_id"),
        family=fields.get("cpu family"), model=fields.get("model"),
        stepping=fields.get("stepping"), flags=[f for f in wanted if f in flags],
        hypervisor="hypervisor" in flags, cpus=os.cpu_count(),
        usable_cpus=len(os.sched_getaffinity(0)), memory_gib=mem,
        kernel=platform.release())


def binary_ids(paths):
    """The first 16 hex digits of each binary's SHA-256: which build ran."""
    out = {}
    for p in paths:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        out[os.path.basename(p)] = h.hexdigest()[:16]
    return out


def die_with_parent():
    """In a child before exec: SIGKILL when this process dies (Linux PR_SET_PDEATHSIG), so
    that no service outlives a killed benchmark."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def seconds_of(duration):
    """A protobuf JSON Duration ("0.172439514s") in seconds."""
    return float(duration.rstrip("s"))


def throughput(steps, warmup, tokens_per_step):
    """tokens/s over the steps after the warm-up, from each step's own duration."""
    kept = steps[warmup:]
    if not kept:
        raise RunFailed(f"no step left after a warm-up of {warmup} (of {len(steps)} steps)")
    seconds = sum(s["seconds"] for s in kept)
    return tokens_per_step * len(kept) / seconds


def check_losses(who, steps):
    bad = [s for s in steps if "loss" in s and not math.isfinite(s["loss"])]
    if bad:
        raise RunFailed(f"{who}: non-finite loss at step {bad[0]['step']}")


def run(cmd, what, timeout, env=None, stdout=None):
    # A binary that cannot be executed right now (being relinked: EACCES, ETXTBSY) is
    # retried for up to a minute; the report warns when the binaries changed.
    for attempt in range(13):
        t0 = time.perf_counter()
        try:
            r = subprocess.run(cmd, env=env, stdout=stdout or subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, timeout=timeout,
                               preexec_fn=die_with_parent)
            break
        except subprocess.TimeoutExpired:
            raise RunFailed(f"{what}: timed out after {timeout} s: {' '.join(cmd)}")
        except OSError as e:
            if attempt == 12:
                raise RunFailed(f"{what}: cannot run {cmd[0]}: {e}")
            print(f"peer_bench: cannot run {cmd[0]} ({e.strerror}); retrying in 5 s",
                  file=sys.stderr, flush=True)
            time.sleep(5)
    if r.returncode != 0:
        raise RunFailed(f"{what}: exit {r.returncode}: {' '.join(cmd)}\n{r.stderr[-3000:]}")
    return r, time.perf_counter() - t0


class Bench:
    def __init__(self, args):
        self.a = args
        self.batonctl = os.path.join(args.bin, "batonctl")
        with open(args.spec) as f:
            spec = json.load(f)
        g = spec["model"]["gpt"]
        self.tokens_per_step = spec["data"].get("batchSize", spec["data"].get("batch_size")) \
            * g["context"]
        self.stages = spec.get("pipeline", {}).get("stages", 1)
        self.text_path = spec["data"]["text"]["path"]
        self.torch_env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                              PYTHONDONTWRITEBYTECODE="1")
        self.tmp = tempfile.mkdtemp(prefix="baton-peer-")
        self.cluster = None
        self.kernels = set()

    # ---- baton
    def baton_local(self, precision, pipeline=False):
        cmd = [self.batonctl, "train-local", "-f", self.a.spec, "--steps", str(self.a.steps),
               "--seed", str(self.a.seed), "--precision", precision, "--blas-threads", "1",
               "-o", "json"]
        if pipeline:
            cmd.append("--pipeline")
        what = "batonctl train-local" + (" --pipeline" if pipeline else "") + f" ({precision})"
        r, wall = run(cmd, what, self.a.timeout)
        rep = json.loads(r.stdout)
        steps = [dict(step=int(s["step"]), loss=s["loss"], seconds=seconds_of(s["duration"]))
                 for s in rep["steps"]]
        if len(steps) != self.a.steps:
            raise RunFailed(f"{what}: {len(steps)} steps reported, {self.a.steps} asked")
        check_losses(what, steps)
        self.kernels.add(rep.get("kernels", "?"))
        return dict(steps=steps, wall_s=wall, kernels=rep.get("kernels"),
                    weights_digest=rep.get("weights_digest"))

    def start_cluster(self):
        b = self.a.bin
        d = os.path.join(self.tmp, "cluster")
        os.makedirs(d)
        root = os.path.dirname(os.path.realpath(self.text_path))
        procs = []
        self.cluster = dict(dir=d, procs=procs)

        def start(name, cmd):
            log = open(os.path.join(d, name + ".log"), "w")
            procs.append((name, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                                 start_new_session=True,
                                                 preexec_fn=die_with_parent)))

        def wait_file(path, name):
            for _ in range(300):
                if os.path.exists(path) and os.path.getsize(path) > 0:
                    with open(path) as f:
                        return f.read().strip()
                for n, p in procs:
                    if p.poll() is not None:
                        raise RunFailed(f"cluster: {n} exited ({p.returncode}); "
                                        f"{self.cluster_logs()}")
                time.sleep(0.1)
            raise RunFailed(f"cluster: {name} did not write {path} within 30 s")

        start("coordinator", [os.path.join(b, "coordinator"), "--listen", "127.0.0.1:0",
                              "--db", os.path.join(d, "baton.db"),
                              "--port_file", os.path.join(d, "coordinator.port"),
                              "--metrics_listen", "127.0.0.1:0", "--checkpoint_root", d,
                              "--data_root", root])
        addr = wait_file(os.path.join(d, "coordinator.port"), "the coordinator")
        self.cluster["address"] = addr
        # A worker multiplies on all its cores unless told otherwise: one thread each, as
        # each PyTorch stage has.
        threads = ["--threads", "1"]
        for i in range(1, self.stages + 1):
            start(f"worker-{i}", [os.path.join(b, "worker"), "--coordinator", addr,
                                  "--listen", "127.0.0.1:0", "--worker_id", f"w-{i}",
                                  "--port_file", os.path.join(d, f"worker-{i}.port"),
                                  "--metrics_listen", "127.0.0.1:0", "--checkpoint_root", d,
                                  "--data_root", root] + threads)
            wait_file(os.path.join(d, f"worker-{i}.port"), f"worker w-{i}")
        for _ in range(300):
            r = subprocess.run([self.batonctl, "workers", "--coordinator", addr, "-o", "json"],
                               capture_output=True, text=True)
            if r.returncode == 0:
                ws = json.loads(r.stdout).get("workers", [])
                if sum(w.get("state") == "WORKER_STATE_IDLE" for w in ws) >= self.stages:
                    self.cluster["workers"] = [w.get("device", {}) for w in ws]
                    return
            time.sleep(0.1)
        raise RunFailed(f"cluster: fewer than {self.stages} workers registered within 30 s")

    def cluster_logs(self):
        out = []
        for name, _ in (self.cluster or {}).get("procs", []):
            path = os.path.join(self.cluster["dir"], name + ".log")
            try:
                with open(path) as f:
                    out.append(f"--- {name} ---\n" + "".join(f.readlines()[-10:]))
            except OSError:
                pass
        return "\n".join(out)

    def stop_cluster(self):
        if not self.cluster:
            return
        procs = self.cluster["procs"]
        for _, p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.time() + 10
        for name, p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                print(f"peer_bench: {name} did not stop on SIGTERM; killing it", file=sys.stderr)
                p.kill()
                p.wait()
        self.cluster = None

    def baton_cluster(self):
        addr = ["--coordinator", self.cluster["address"]]
        ctl = self.batonctl
        r, _ = run([ctl, "submit", "-f", self.a.spec, "--steps", str(self.a.steps),
                    "--seed", str(self.a.seed), "--stages", str(self.stages)] + addr,
                   "batonctl submit", 60)
        job = r.stdout.strip()
        t0 = time.perf_counter()
        try:
            run([ctl, "watch", job, "-o", "json", "--timeout", f"{int(self.a.timeout)}s"] + addr,
                f"batonctl watch {job}", self.a.timeout + 30)
        except RunFailed as e:
            raise RunFailed(f"{e}\n{self.cluster_logs()}")
        wall = time.perf_counter() - t0
        r, _ = run([ctl, "get", job, "-o", "json"] + addr, "batonctl get", 60)
        got = json.loads(r.stdout)
        if got.get("state") != "JOB_STATE_SUCCEEDED":
            raise RunFailed(f"cluster job {job}: {got.get('state')}: {got.get('history')}")
        r, _ = run([ctl, "history", job, "--csv"] + addr, "batonctl history", 60)
        steps = [dict(step=int(row["step"]), loss=float(row["loss"]),
                      seconds=float(row["step_seconds"]))
                 for row in csv.DictReader(io.StringIO(r.stdout))]
        if len(steps) != self.a.steps:
            raise RunFailed(f"cluster job {job}: {len(steps)} steps in its history, "
                            f"{self.a.steps} asked")
        check_losses(f"cluster job {job}", steps)
        pipe = got.get("pipeline", {})
        for k in pipe.get("kernels", []):
            self.kernels.add(k)
        return dict(steps=steps, wall_s=wall, job=job, weights_digest=got.get("weights_digest"),
                    schedule=pipe.get("schedule"), stage_blocks=pipe.get("stage_blocks"),
                    kernels=pipe.get("kernels"), links=[l.get("transport")
                                                        for l in pipe.get("links", [])])

    # ---- PyTorch
    def torch_run(self, precision, pipeline=False):
        out = os.path.join(self.tmp, "torch.json")
        cmd = [sys.executable, os.path.join(HERE, "torch_train.py"), "--spec", self.a.spec,
               "--steps", str(self.a.steps), "--seed", str(self.a.seed), "--precision",
               precision, "--attention", self.a.attention, "--threads", "1", "-o", out]
        if pipeline:
            cmd += ["--pipeline", "--timeout", str(self.a.timeout)]
        what = "torch_train.py" + (" --pipeline" if pipeline else "") + f" ({precision})"
        _, wall = run(cmd, what, self.a.timeout + 30, env=self.torch_env,
                      stdout=subprocess.DEVNULL)
        with open(out) as f:
            rep = json.load(f)
        steps = rep["steps"]
        check_losses(what, steps)
        return dict(steps=steps, wall_s=wall, pipeline=rep.get("pipeline"))

    # ---- the rounds
    def measure(self, kind):
        """One baton run, then one PyTorch run (then train-local --pipeline) of `kind`."""
        w, tps = self.a.warmup, self.tokens_per_step
        res = {}
        load_before = loadavg()
        if kind in ("fp32", "bf16"):
            res["baton"] = self.baton_local(kind)
            res["torch"] = self.torch_run(kind)
        else:
            res["baton"] = self.baton_cluster()
            res["torch"] = self.torch_run("fp32", pipeline=True)
            res["baton_local_pipeline"] = self.baton_local("fp32", pipeline=True)
        for r in res.values():
            r["tokens_per_second"] = throughput(r["steps"], w, tps)
        res["load_before"], res["load_after"] = load_before, loadavg()
        t = res["torch"]["tokens_per_second"]
        res["ratio"] = res["baton"]["tokens_per_second"] / t
        if "baton_local_pipeline" in res:
            res["ratio_local_pipeline"] = res["baton_local_pipeline"]["tokens_per_second"] / t
            # baton's headline, reported (not enforced here): the same weights, bit for bit.
            res["digests_equal"] = (res["baton"]["weights_digest"]
                                    == res["baton_local_pipeline"]["weights_digest"])
        res["step1_loss"] = dict(baton=res["baton"]["steps"][0]["loss"],
                                 torch=res["torch"]["steps"][0]["loss"])
        return res


def fmt(x, digits=0):
    return f"{x:,.{digits}f}"


def report_markdown(out, meta, rounds, kinds):
    w = out.write
    w(f"# baton vs PyTorch on the CPU ({meta['date']})\n\n")
    c = meta["cpu"]
    w(f"CPU: {c['model_name']} (vendor {c['vendor']}, family {c['family']}, model "
      f"{c['model']}, stepping {c['stepping']}; {', '.join(c['flags'])}"
      f"{'; under a hypervisor' if c['hypervisor'] else ''}), {c['usable_cpus']} usable of "
      f"{c['cpus']} CPUs, {c['memory_gib']} GiB, Linux {c['kernel']}\n\n")
    w("baton kernels: " + "; ".join(sorted(meta["baton_kernels"])) + "\n\n")
    b = meta["baton_binaries"]
    w("baton binaries (SHA-256 prefixes): " + ", ".join(
        f"{k} {v}" for k, v in b["before"].items()) + "\n\n")
    if b["before"] != b["after"]:
        changed = [k for k in b["before"] if b["before"][k] != b["after"].get(k)]
        w(f"**Warning:** {', '.join(changed)} changed during the benchmark (rebuilt?): the "
          "rounds may have run different builds.\n\n")
    if len(meta["baton_kernels"]) > 1:
        w("**Warning:** baton's runs reported different kernels (were the binaries rebuilt "
          "during the benchmark?): compare only the runs of one set (--json has each run's)."
          "\n\n")
    t = meta["torch"]
    w(f"PyTorch {t['torch']} (BLAS {t['blas']}; mkldnn available: {t['mkldnn_available']}; "
      f"CPU capability {t['cpu_capability']}); fp32 Linear runs "
      f"{', '.join(t['fp32_linear_kernels']) or '?'}; bf16 autocast Linear runs "
      f"{', '.join(t['bf16_linear_kernels']) or '?'} (AMX: "
      f"{'yes' if t['bf16_on_amx'] else 'no'}); oneDNN ISA: {t['onednn_isa']}\n\n")
    s = meta["settings"]
    w(f"Model: {s['spec']}; {s['steps']} steps per run, seed {s['seed']}, PyTorch attention "
      f"{s['attention']}. tokens/s = tokens of steps {s['warmup'] + 1}..{s['steps']} / the sum "
      f"of those steps' own durations (steps 1..{s['warmup']} are warm-up; start-up "
      f"is in neither side's figure). One thread per process on both sides.\n\n")
    for kind in kinds:
        rs = [r["kinds"][kind] for r in rounds]
        if kind == "pipeline":
            w("## pipeline (S=2, 1F1B, 4 micro-batches): baton cluster (coordinator + 2 "
              "workers) and train-local --pipeline vs torch.distributed.pipelining (gloo, 2 "
              "processes)\n\n")
            w("| round | load before → after | baton cluster tok/s | PyTorch tok/s | ratio | "
              "baton train-local --pipeline tok/s | ratio |\n|---|---|---:|---:|---:|---:|---:|\n")
            for i, (r, rr) in enumerate(zip(rs, rounds)):
                w(f"| {i + 1} | {rr['load_before'][0]:.2f} → {rr['load_after'][0]:.2f} | "
                  f"{fmt(r['baton']['tokens_per_second'])} | "
                  f"{fmt(r['torch']['tokens_per_second'])} | {r['ratio']:.2f} | "
                  f"{fmt(r['baton_local_pipeline']['tokens_per_second'])} | "
                  f"{r['ratio_local_pipeline']:.2f} |\n")
            m = meta["summary"][kind]
            w(f"| **median** | | **{fmt(m['baton'])}** | **{fmt(m['torch'])}** | "
              f"**{m['ratio']:.2f}** | **{fmt(m['baton_local_pipeline'])}** | "
              f"**{m['ratio_local_pipeline']:.2f}** |\n\n")
            eq = [r["digests_equal"] for r in rs]
            w(f"Weights digest of the cluster job equal to train-local --pipeline's: "
              f"{sum(eq)} of {len(eq)} rounds.\n\n")
        else:
            title = {"fp32": "fp32, one process: train-local vs PyTorch eager",
                     "bf16": "bf16, one process: train-local --precision bf16 vs "
                             "torch.autocast(cpu, bfloat16)"}[kind]
            w(f"## {title}\n\n| round | load before → after | baton tok/s | PyTorch tok/s | "
              "ratio baton / PyTorch |\n|---|---|---:|---:|---:|\n")
            for i, (r, rr) in enumerate(zip(rs, rounds)):
                w(f"| {i + 1} | {rr['load_before'][0]:.2f} → {rr['load_after'][0]:.2f} | "
                  f"{fmt(r['baton']['tokens_per_second'])} | "
                  f"{fmt(r['torch']['tokens_per_second'])} | {r['ratio']:.2f} |\n")
            m = meta["summary"][kind]
            w(f"| **median** | | **{fmt(m['baton'])}** | **{fmt(m['torch'])}** | "
              f"**{m['ratio']:.2f}** |\n\n")
        l1 = rs[0]["step1_loss"]
        w(f"Step-1 loss (same weights, same batch): baton {l1['baton']:.6f}, PyTorch "
          f"{l1['torch']:.6f}.\n\n")
    w("Load: the 1-minute /proc/loadavg before and after each round (all kinds of the "
      "round). It counts the benchmark's own processes (about 1 during a one-process run, 2 "
      "during a pipeline), so only what is above that is someone else's; a ratio from a "
      "loaded round is less trustworthy. Whole-machine CPU per round (/proc/stat, the "
      "benchmark included): " + ", ".join(
          f"round {r['round']}: {100 * r['cpu']['busy']:.0f}% busy, "
          f"{100 * r['cpu']['steal']:.1f}% stolen" for r in rounds) + ".\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", default=os.path.join(HERE, "gpt4-s2-1f1b.json"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"),
                    help="where batonctl, coordinator and worker are")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30, help="training steps per run")
    ap.add_argument("--warmup", type=int, default=5, help="steps not counted")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated: " +
                    ", ".join(KINDS))
    ap.add_argument("--attention", default="explicit", choices=["explicit", "sdpa"],
                    help="PyTorch's attention (explicit: written out, as baton computes)")
    ap.add_argument("--smoke", action="store_true",
                    help="1 round of 3 steps (1 warm-up): checks that everything runs")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--json", help="write the full results here")
    a = ap.parse_args()
    if a.smoke:
        a.rounds, a.steps, a.warmup = 1, 3, 1
    kinds = [k for k in a.kinds.split(",") if k]
    for k in kinds:
        if k not in KINDS:
            ap.error(f"--kinds: unknown kind {k!r} (known: {', '.join(KINDS)})")
    if a.warmup >= a.steps:
        ap.error("--warmup must be below --steps")
    a.spec = os.path.abspath(a.spec)
    needed = ["batonctl"] + (["coordinator", "worker"] if "pipeline" in kinds else [])
    for b in needed:
        if not os.access(os.path.join(a.bin, b), os.X_OK):
            print(f"peer_bench: {os.path.join(a.bin, b)} is not built", file=sys.stderr)
            return 1

    # On SIGTERM too, stop the cluster (the finally below) before exiting.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    bench = Bench(a)
    binaries = [os.path.join(a.bin, b) for b in needed]
    builds_before = binary_ids(binaries)
    rounds = []
    started = time.perf_counter()
    try:
        r, _ = run([sys.executable, os.path.join(HERE, "torch_train.py"), "--info"],
                   "torch_train.py --info", 300, env=bench.torch_env)
        torch_info = json.loads(r.stdout)
        if "pipeline" in kinds:
            bench.start_cluster()
        for i in range(a.rounds):
            rec = dict(round=i + 1, load_before=loadavg(), kinds={})
            ticks = cpu_ticks()
            for kind in kinds:
                rec["kinds"][kind] = bench.measure(kind)
            rec["load_after"] = loadavg()
            rec["cpu"] = cpu_share(ticks, cpu_ticks())
            rounds.append(rec)
            print(f"peer_bench: round {i + 1}/{a.rounds} done (load {rec['load_before'][0]:.2f}"
                  f" → {rec['load_after'][0]:.2f})", file=sys.stderr, flush=True)
    except (RunFailed, OSError) as e:
        print(f"peer_bench: FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        bench.stop_cluster()
        shutil.rmtree(bench.tmp, ignore_errors=True)

    builds_after = binary_ids(binaries)
    summary = {}
    for kind in kinds:
        rs = [r["kinds"][kind] for r in rounds]
        summary[kind] = dict(
            baton=statistics.median(r["baton"]["tokens_per_second"] for r in rs),
            torch=statistics.median(r["torch"]["tokens_per_second"] for r in rs),
            ratio=statistics.median(r["ratio"] for r in rs))
        if kind == "pipeline":
            summary[kind]["baton_local_pipeline"] = statistics.median(
                r["baton_local_pipeline"]["tokens_per_second"] for r in rs)
            summary[kind]["ratio_local_pipeline"] = statistics.median(
                r["ratio_local_pipeline"] for r in rs)
    meta = dict(
        date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        cpu=cpu_info(),
        baton_kernels=sorted(bench.kernels),
        baton_binaries=dict(before=builds_before, after=builds_after),
        torch=torch_info,
        settings=dict(spec=os.path.relpath(a.spec, ROOT), steps=a.steps, warmup=a.warmup,
                      seed=a.seed, rounds=a.rounds, kinds=kinds, attention=a.attention,
                      tokens_per_step=bench.tokens_per_step, smoke=a.smoke,
                      baton_blas_threads=1, torch_threads=1,
                      worker_threads=1 if "pipeline" in kinds else None,
                      measure="tokens of the steps after the warm-up / the sum of their "
                              "own durations (baton: train-local's step durations, or the "
                              "coordinator's from the last rank; PyTorch: perf_counter per "
                              "step, the last stage's in a pipeline)"),
        summary=summary,
        total_seconds=time.perf_counter() - started,
    )
    report_markdown(sys.stdout, meta, rounds, kinds)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(meta, rounds=rounds), f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
