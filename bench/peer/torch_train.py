#!/usr/bin/env python3
"""PyTorch's side of the peer benchmark: train baton's GPT for N steps and report each step.

The model, its initial weights, the batches of every step and AdamW's parameter groups
are baton's (bench/peer/baton_gpt.py replicates them from the spec and seed), so with
--precision fp32 the losses follow `batonctl train-local`'s to float rounding. Three ways
to run it:

  one process (default): torch.set_num_threads(--threads, default 1), eager mode. A step
      is what baton's reference trainer does: zero the grads, the spec's M micro-batches
      forward and backward (loss / M), AdamW. --precision bf16 puts each forward under
      torch.autocast("cpu", dtype=torch.bfloat16): bf16 matrix products, float32 master
      weights, gradients and optimizer state.
  --pipeline: the spec's pipeline (stages S, micro-batches M, SCHEDULE_1F1B or
      SCHEDULE_GPIPE) with torch.distributed.pipelining: one process per stage (gloo on
      loopback, --threads each), PipelineStage + Schedule1F1B / ScheduleGPipe. Stage 0
      holds the embedding and the first layers, the last stage the last layers and the
      head; with S = 2 and 4 layers that is baton's split (blocks 0-2 | 3-5). A tied
      embedding lives on the first and the last stage, and its two gradients are summed
      by an all_reduce after each step's schedule, as baton's TIE_GRAD does; each stage
      then steps its own AdamW. fp32 only.
  --info: what this PyTorch computes with, as JSON (version, BLAS/MKL/oneDNN, CPU
      capability, and which kernels an fp32 and a bf16-autocast Linear really run, read
      from MKL_VERBOSE and ONEDNN_VERBOSE in a child process).

Each step is timed with time.perf_counter from before its batch is cut from the text to
after the optimizer step (the batches' offsets are drawn before the first step). In a
pipeline, the last stage's times are the step times, as the baton coordinator reports the
last rank's. Prints (or writes to -o) one JSON object:
  {"steps": [{"step": 1, "loss": ..., "seconds": ...}, ...], "tokens_per_step": ..., ...}

Usage: python3 bench/peer/torch_train.py --spec bench/peer/gpt4-s2-1f1b.json [--steps 30]
           [--seed S] [--precision fp32|bf16] [--attention explicit|sdpa] [--threads 1]
           [--pipeline] [-o out.json]
       python3 bench/peer/torch_train.py --info
"""

import argparse
import ctypes
import datetime
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SPEC = os.path.join(HERE, "gpt4-s2-1f1b.json")


def set_threads(n):
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:
        pass


def train_one_process(s, steps, precision, sdpa, threads):
    """Trains in this process; returns the per-step report."""
    import baton_gpt as bg
    set_threads(threads)
    model = bg.BatonGpt(s, sdpa=sdpa)
    model.train()
    opt = bg.make_adamw(model, s)
    data = bg.TextData(s["text_path"], s["T"], s["V"], s["batch"], s["seed"])
    offsets = [data.offsets(k) for k in range(steps)]  # drawn before the clock starts
    M = s["M"]
    bf16 = precision == "bf16"
    out = []
    for k in range(steps):
        t0 = time.perf_counter()
        x, y = data.batch_of(offsets[k])
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for mx, my in zip(x.chunk(M), y.chunk(M)):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(mx, my)
            (loss / M).backward()
            total += loss.item()
        opt.step()
        out.append(dict(step=k + 1, loss=total / M, seconds=time.perf_counter() - t0))
    return out


class Stage(nn.Module):
    """Layers [first, last) of the GPT, with the embedding on the first stage and the head
    on the last."""

    def __init__(self, s, first, last, with_embed, with_head, sdpa):
        import baton_gpt as bg
        import pytorch_gpt
        super().__init__()
        self.embed = bg.Embed(s["V"], s["T"], s["C"]) if with_embed else None
        self.blocks = nn.ModuleList(
            [pytorch_gpt.Block(s["C"], s["H"], s["T"], sdpa) for _ in range(first, last)])
        self.head = bg.Head(s["V"], s["C"]) if with_head else None
        bg.init_like_baton(self, s, first_layer=first)

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x) if self.head is not None else x


def stage_layers(L, S, rank):
    """Transformer layers [first, last) of stage `rank`: an even split, the remainder to the
    first stages."""
    base, extra = divmod(L, S)
    first = rank * base + min(rank, extra)
    return first, first + base + (1 if rank < extra else 0)


def pipeline_rank(args, s):
    """One stage of the pipeline (run in its own process by --pipeline)."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    import baton_gpt as bg
    set_threads(args.threads)
    rank, S = args.pipeline_rank, s["S"]
    dist.init_process_group("gloo", rank=rank, world_size=S,
                            timeout=datetime.timedelta(seconds=120))
    first, last = stage_layers(s["L"], S, rank)
    module = Stage(s, first, last, rank == 0, rank == S - 1, args.attention == "sdpa")
    module.train()
    opt = bg.make_adamw(module, s, first_layer=first)
    tie_group = dist.new_group([0, S - 1]) if s["tied"] else None
    tied = None
    if s["tied"] and rank == 0:
        tied = module.embed.wte.weight
    elif s["tied"] and rank == S - 1:
        tied = module.head.logits.weight
    stage = PipelineStage(module, rank, S, torch.device("cpu"))

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    cls = {"SCHEDULE_1F1B": Schedule1F1B, "SCHEDULE_GPIPE": ScheduleGPipe}[s["schedule"]]
    sched = cls(stage, s["M"], loss_fn=loss_fn)
    data = bg.TextData(s["text_path"], s["T"], s["V"], s["batch"], s["seed"])
    offsets = [data.offsets(k) for k in range(args.steps)]
    out = []
    dist.barrier()
    for k in range(args.steps):
        t0 = time.perf_counter()
        x, y = data.batch_of(offsets[k])
        opt.zero_grad(set_to_none=True)
        losses = []
        if rank == 0:
            sched.step(x)
        elif rank == S - 1:
            sched.step(target=y, losses=losses)
        else:
            sched.step()
        if tied is not None:
            dist.all_reduce(tied.grad, group=tie_group)  # TIE_GRAD: embedding + projection
        opt.step()
        rec = dict(step=k + 1, seconds=time.perf_counter() - t0)
        if losses:
            rec["loss"] = float(torch.stack([l.detach() for l in losses]).mean())
        out.append(rec)
    dist.barrier()
    dist.destroy_process_group()
    with open(args.rank_output, "w") as f:
        json.dump(dict(rank=rank, layers=[first, last], steps=out), f)
    return 0


def die_with_parent():
    """In a child before exec: SIGKILL when the parent dies (Linux prctl PR_SET_PDEATHSIG),
    so that no rank outlives a killed benchmark."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train_pipeline(args, s):
    """Starts one process per stage and merges their reports."""
    if s["schedule"] not in ("SCHEDULE_1F1B", "SCHEDULE_GPIPE"):
        raise SystemExit(f"torch_train: schedule {s['schedule']}: only 1F1B and GPipe here")
    if s["batch"] % s["M"]:
        raise SystemExit("torch_train: the batch must split into the micro-batches")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` runs
    procs = []
    with tempfile.TemporaryDirectory(prefix="peer-pipeline-") as tmp:
        outs = [os.path.join(tmp, f"rank{r}.json") for r in range(s["S"])]
        try:
            for r, out in enumerate(outs):
                cmd = [sys.executable, os.path.abspath(__file__), "--spec", args.spec,
                       "--steps", str(args.steps), "--threads", str(args.threads),
                       "--attention", args.attention, "--pipeline-rank", str(r),
                       "--rank-output", out]
                if args.seed is not None:
                    cmd += ["--seed", str(args.seed)]
                procs.append(subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent))
            deadline = time.time() + args.timeout
            while any(p.poll() is None for p in procs):
                if any(p.poll() not in (None, 0) for p in procs) or time.time() > deadline:
                    raise SystemExit(f"torch_train: pipeline ranks failed or timed out (exit "
                                     f"codes {[p.poll() for p in procs]})")
                time.sleep(0.05)
            if any(p.returncode != 0 for p in procs):
                raise SystemExit(f"torch_train: pipeline ranks failed (exit codes "
                                 f"{[p.returncode for p in procs]})")
        finally:
            for p in procs:  # on any failure: no rank outlives this process
                if p.poll() is None:
                    p.kill()
                    p.wait()
        ranks = []
        for out in outs:
            with open(out) as f:
                ranks.append(json.load(f))
    last = ranks[-1]
    return last["steps"], dict(
        stages=s["S"], schedule=s["schedule"], microbatches=s["M"],
        stage_layers=[r["layers"] for r in ranks],
        rank_step_seconds=[[st["seconds"] for st in r["steps"]] for r in ranks],
        backend="gloo")


def probe():
    """Runs under MKL_VERBOSE / ONEDNN_VERBOSE (set by info()): an fp32 and a bf16-autocast
    Linear forward and backward at the model's shapes."""
    set_threads(1)
    lin = torch.nn.Linear(128, 512)
    x = torch.randn(512, 128, requires_grad=True)
    print("PROBE fp32", flush=True)
    lin(x).sum().backward()
    print("PROBE bf16", flush=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x)
    y.float().sum().backward()
    print("PROBE end", flush=True)
    return 0


def info():
    config = torch.__config__.show().splitlines()
    keep = [l.strip(" -") for l in config if not l.strip(" -").startswith("Build settings")
            and re.search(r"Math Kernel|MKL-DNN|oneDNN|OpenMP|LAPACK|CPU capability|NNPACK", l)]
    blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    env = dict(os.environ, MKL_VERBOSE="1", ONEDNN_VERBOSE="1")
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe"], env=env,
                       capture_output=True, text=True, timeout=120)
    section, fp32, bf16, mkl_isa, onednn_isa = None, set(), set(), None, None
    for line in (r.stdout + r.stderr).splitlines():
        if line.startswith("PROBE "):
            section = line.split()[1]
            continue
        if line.startswith("MKL_VERBOSE") and "Intel(R) 64 architecture" in line:
            mkl_isa = line.split("architecture", 1)[1].split(", Lnx")[0].strip()
        if line.startswith("onednn_verbose") and ",info,cpu,isa:" in line:
            onednn_isa = line.split("isa:", 1)[1].strip()
        kernels = fp32 if section == "fp32" else bf16 if section == "bf16" else None
        if kernels is None:
            continue
        m = re.match(r"MKL_VERBOSE (\w+)\(", line)
        if m:
            kernels.add(f"MKL {m.group(1)}")
        if line.startswith("onednn_verbose") and ",primitive,exec," in line:
            f = line.split(",")
            kernels.add(f"oneDNN {f[5]} {f[6]}")  # primitive, implementation
    return dict(
        torch=torch.__version__,
        blas=blas.group(1) if blas else None,
        config=keep,
        mkldnn_available=torch.backends.mkldnn.is_available(),
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        mkl_isa=mkl_isa,
        onednn_isa=onednn_isa,
        fp32_linear_kernels=sorted(fp32),
        bf16_linear_kernels=sorted(bf16),
        bf16_on_amx=any("amx" in k for k in bf16),
        probe_rc=r.returncode,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", default=DEFAULT_SPEC)
    ap.add_argument("--steps", type=int, default=None, help="default: the spec's")
    ap.add_argument("--seed", type=int, default=None, help="default: the spec's")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--attention", default="explicit", choices=["explicit", "sdpa"],
                    help="explicit: softmax attention written out, as baton computes it")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--pipeline", action="store_true", help="one process per stage")
    ap.add_argument("--timeout", type=float, default=600, help="--pipeline: seconds")
    ap.add_argument("-o", "--output", help="write the JSON here (default: stdout)")
    ap.add_argument("--info", action="store_true", help="print PyTorch's kernels as JSON")
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pipeline-rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rank-output", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, HERE)

    if args.probe:
        return probe()
    if args.info:
        text = json.dumps(info(), indent=1)
    else:
        import baton_gpt as bg
        s = bg.load_spec(args.spec)
        if args.seed is not None:
            s["seed"] = args.seed
        args.steps = args.steps if args.steps is not None else s["steps"]
        if args.pipeline_rank is not None:
            return pipeline_rank(args, s)
        extra = {}
        if args.pipeline:
            if args.precision != "fp32":
                raise SystemExit("torch_train: --pipeline runs fp32 only")
            steps, extra = train_pipeline(args, s)
        else:
            steps = train_one_process(s, args.steps, args.precision,
                                      args.attention == "sdpa", args.threads)
        import torch
        text = json.dumps(dict(
            framework="pytorch-eager", torch=torch.__version__, spec=os.path.relpath(args.spec),
            seed=s["seed"], precision=args.precision, attention=args.attention,
            threads=args.threads, tokens_per_step=s["batch"] * s["T"],
            pipeline=extra or None, steps=steps))
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
