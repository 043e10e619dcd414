#!/usr/bin/env python3
"""PyTorch eager baseline for bench/gpt_bench.cc: the same GPT on one core, or on a GPU.

The model is baton's gpt (common/nn/transformer.h, common/nn/model.h) written in plain
PyTorch eager mode, with the shapes of a baton job spec (default client/examples/gpt.json):

  token + position embedding
  per layer (pre-LN GPT-2 block):
    x = x + proj(causal_softmax_attention(qkv(LN1(x))))      qkv: Linear(C, 3C), proj: Linear(C, C)
    x = x + mlp.proj(GELU_tanh(mlp.fc(LN2(x))))               fc: Linear(C, 4C), proj: Linear(4C, C)
  final LN, Linear(C, V, bias=False), cross-entropy (mean over the B*T positions)

float32, eager (no torch.compile). On the CPU (--device cpu, the default) with
torch.set_num_threads(1); on a GPU (--device cuda) with TF32 off for matrix products and
convolutions, as baton computes (full fp32, cuBLAS pedantic math), and the device
synchronised before each clock read. What is timed, each per iteration with
time.perf_counter after a warm-up, reporting the median and the best wall time, and the
mean process CPU time (robust when other jobs share the cores):

  fwd_bwd  one micro-batch (batch_size / microbatches sequences of `context` tokens): forward,
           loss.backward(); grads are reset with zero_grad(set_to_none=True) before each.
  fwd      the forward alone, in grad mode (a training forward that records the graph).
  step     one training step: zero_grad, every micro-batch of the global batch (loss scaled
           by 1/M), then AdamW (torch.optim.AdamW, the spec's hyper-parameters).

Attention is measured in two variants (--variants, default both): "explicit", the softmax
attention written out (q k^T, mask, softmax, att v) as baton computes it, and "sdpa",
F.scaled_dot_product_attention(is_causal=True). Prints one JSON object per variant on stdout.

Usage: python3 bench/pytorch_gpt.py [--spec client/examples/gpt.json] [--min-time 3]
                                    [--variants explicit,sdpa] [--device cpu|cuda]
                                    [--measure fwd_bwd,fwd,step]
"""

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, C, H, T, sdpa):
        super().__init__()
        self.H = H
        self.sdpa = sdpa
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)))

    def forward(self, x):
        B, T, C = x.shape
        H, D = self.H, C // self.H
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, H, D).transpose(1, 2)
        k = k.view(B, T, H, D).transpose(1, 2)
        v = v.view(B, T, H, D).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
            att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, C, H, T, sdpa):
        super().__init__()
        self.ln1 = nn.LayerNorm(C)
        self.attn = CausalSelfAttention(C, H, T, sdpa)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.gelu = nn.GELU(approximate="tanh")
        self.mproj = nn.Linear(4 * C, C)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.mproj(self.gelu(self.fc(self.ln2(x))))
        return x


class Gpt(nn.Module):
    def __init__(self, V, T, C, H, L, sdpa):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block(C, H, T, sdpa) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        self.head = nn.Linear(C, V, bias=False)
        self.register_buffer("pos", torch.arange(T))
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(self.pos[:T])
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))


def load_spec(path):
    with open(path) as f:
        spec = json.load(f)
    g = spec["model"]["gpt"]
    pipe = spec.get("pipeline", {})
    opt = spec.get("optimizer", {}).get("adamw", {})

    def get(d, camel, snake, default=None):
        return d.get(camel, d.get(snake, default))

    return dict(
        V=get(g, "vocabSize", "vocab_size"),
        T=g["context"],
        C=get(g, "dModel", "d_model"),
        H=g["heads"],
        L=g["layers"],
        batch=get(spec["data"], "batchSize", "batch_size"),
        M=pipe.get("microbatches", 1),
        lr=get(opt, "learningRate", "learning_rate", 1e-3),
        beta1=opt.get("beta1", 0.9),
        beta2=opt.get("beta2", 0.999),
        eps=opt.get("epsilon", 1e-8),
        wd=get(opt, "weightDecay", "weight_decay", 0.01),
        seed=spec.get("seed", 0),
    )


def time_it(fn, min_time, warmup, sync):
    """Per-iteration wall-clock and process CPU times after `warmup` untimed calls; `sync`
    waits for the device's queued work (a no-op on the CPU)."""
    for _ in range(warmup):
        fn()
    sync()
    wall, cpu = [], []
    start = time.perf_counter()
    while time.perf_counter() - start < min_time or len(wall) < 5:
        c0 = time.process_time()
        t0 = time.perf_counter()
        fn()
        sync()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def run_variant(s, sdpa, min_time, warmup, device, measure, bf16=False):
    torch.manual_seed(s["seed"])
    model = Gpt(s["V"], s["T"], s["C"], s["H"], s["L"], sdpa).to(device)
    model.train()
    b = s["batch"] // s["M"]
    g = torch.Generator().manual_seed(s["seed"])
    mbs = [
        (torch.randint(0, s["V"], (b, s["T"]), generator=g).to(device),
         torch.randint(0, s["V"], (b, s["T"]), generator=g).to(device))
        for _ in range(s["M"])
    ]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    opt = torch.optim.AdamW(model.parameters(), lr=s["lr"], betas=(s["beta1"], s["beta2"]),
                            eps=s["eps"], weight_decay=s["wd"])
    idx, tgt = mbs[0]
    tokens_mb = b * s["T"]

    def forward(i, t):
        # --precision bf16: autocast, fp32 master weights and optimizer (the anchors' recipe).
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            return model(i, t)

    def fwd_bwd():
        model.zero_grad(set_to_none=True)
        loss = forward(idx, tgt)
        loss.backward()

    def fwd():
        forward(idx, tgt)

    def step():
        opt.zero_grad(set_to_none=True)
        for i, t in mbs:
            loss = forward(i, t) / s["M"]
            loss.backward()
        opt.step()

    out = {}
    for name, fn, tokens in (("fwd_bwd", fwd_bwd, tokens_mb), ("fwd", fwd, tokens_mb),
                             ("step", step, tokens_mb * s["M"])):
        if name not in measure:
            continue
        wall, cpu = time_it(fn, min_time, warmup, sync)
        med = statistics.median(wall)
        best = min(wall)
        cpu_mean = sum(cpu) / len(cpu)  # process_time ticks coarsely: use the mean
        out[name] = dict(
            iterations=len(wall),
            median_ms=med * 1e3,
            best_ms=best * 1e3,
            cpu_ms=cpu_mean * 1e3,
            tokens_per_iter=tokens,
            tokens_per_second_median=tokens / med,
            tokens_per_second_best=tokens / best,
            tokens_per_cpu_second=tokens / cpu_mean,
        )
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", default=os.path.join(here, "..", "client", "examples", "gpt.json"))
    ap.add_argument("--min-time", type=float, default=3.0, help="seconds per measurement")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--variants", default="explicit,sdpa",
                    help="comma-separated: explicit (softmax attention), sdpa")
    ap.add_argument("--device", default="cpu", help="cpu (one thread) or cuda[:N]")
    ap.add_argument("--measure", default="fwd_bwd,fwd,step",
                    help="comma-separated: fwd_bwd, fwd, step")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                    help="bf16: torch.autocast(bfloat16) around the forward")
    args = ap.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print(f"pytorch_gpt: --device {args.device}: torch {torch.__version__} sees no CUDA "
                  "device", file=sys.stderr)
            return 1
        # baton's CUDA backend computes in full fp32: no TF32 on either side.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    else:
        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass
    measure = set(args.measure.split(","))
    s = load_spec(args.spec)
    for variant in args.variants.split(","):
        sdpa = variant == "sdpa"
        if sdpa and not hasattr(F, "scaled_dot_product_attention"):
            continue
        res = run_variant(s, sdpa, args.min_time, args.warmup, device, measure,
                          bf16=args.precision == "bf16")
        print(json.dumps(dict(
            framework="pytorch-eager",
            torch=torch.__version__,
            device=(torch.cuda.get_device_name(device) if device.type == "cuda"
                    else platform.processor() or "cpu"),
            python=platform.python_version(),
            threads=torch.get_num_threads(),
            attention=variant,
            precision=args.precision,
            spec=os.path.relpath(args.spec),
            model=dict(vocab=s["V"], context=s["T"], d_model=s["C"], heads=s["H"],
                       layers=s["L"]),
            micro_batch_sequences=s["batch"] // s["M"],
            microbatches=s["M"],
            **res,
        )), flush=True)


if __name__ == "__main__":
    sys.exit(main())
