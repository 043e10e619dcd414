#!/usr/bin/env bash
# Runs baton's GPT benchmark and the PyTorch CPU eager baseline on the same machine in the
# same run, and prints both throughputs and their ratio (baton / PyTorch). Builds nothing.
#
#   bench/run_gpt_bench.sh [path/to/gpt_bench] [--rounds N] [--spec FILE] [--out FILE]
#
#   path/to/gpt_bench  default build/bin/gpt_bench
#   --rounds N         alternate baton and PyTorch N times (default 3); each side's number is
#                      its best round (least disturbed by other jobs: a round whose wall time
#                      exceeds its CPU time by over 10% is marked as disturbed)
#   --spec FILE        job spec both sides read their shapes from (client/examples/gpt.json)
#   --out FILE         also write every raw result as JSON
#   PYTHON             interpreter with torch installed (default python3)
#
# Both sides run on one core (OpenBLAS / torch pinned to one thread). Tokens/s is reported
# from wall-clock time (the headline) and from CPU time (robust when other jobs share the
# cores). See docs/benchmarks.md.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
bench="$root/build/bin/gpt_bench"
rounds=3
spec="$root/client/examples/gpt.json"
out=""
python="${PYTHON:-python3}"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --spec) spec="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) bench="$1"; shift ;;
  esac
done

if [[ ! -x "$bench" ]]; then
  echo "run_gpt_bench: no benchmark binary at $bench (build it: ninja -C build gpt_bench)" >&2
  exit 1
fi
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "run_gpt_bench: $python cannot import torch (set PYTHON=/path/to/python)" >&2
  exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

for ((r = 1; r <= rounds; ++r)); do
  echo "round $r/$rounds: baton ..." >&2
  "$bench" --spec="$spec" --benchmark_filter='BM_Gpt' --benchmark_format=json \
    >"$tmp/baton.$r.json" 2>"$tmp/baton.$r.err" || { cat "$tmp/baton.$r.err" >&2; exit 1; }
  echo "round $r/$rounds: pytorch ..." >&2
  "$python" "$here/pytorch_gpt.py" --spec "$spec" --variants explicit,sdpa \
    >"$tmp/torch.$r.json" || exit 1
done

"$python" - "$tmp" "$rounds" "$out" <<'EOF'
import json, sys

tmp, rounds, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
UNIT = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
# baton benchmark name -> pytorch measurement
PAIRS = [("BM_GptForwardBackward", "fwd_bwd", "forward+backward, one micro-batch"),
         ("BM_GptForward", "fwd", "forward only, one micro-batch"),
         ("BM_GptTrainerStep", "step", "whole training step (all micro-batches + AdamW)")]

baton = {k: {"wall": [], "cpu": []} for k, _, _ in PAIRS}
torch = {}  # (variant, key) -> {"wall": [...], "cpu": [...]}
raw = {"baton": [], "pytorch": []}
context = {}
for r in range(1, rounds + 1):
    with open(f"{tmp}/baton.{r}.json") as f:
        b = json.load(f)
    raw["baton"].append(b)
    context = b["context"]
    for bm in b["benchmarks"]:
        name = bm["name"].split("/")[0].split("::")[-1]
        if name not in baton or bm.get("error_occurred"):
            continue
        tokens = bm["tokens_per_iter"]
        s = UNIT[bm["time_unit"]]
        baton[name]["wall"].append(tokens / (bm["real_time"] * s))
        baton[name]["cpu"].append(tokens / (bm["cpu_time"] * s))
        baton[name]["allocs"] = bm.get("system_allocations_per_iter")
    with open(f"{tmp}/torch.{r}.json") as f:
        for line in f:
            t = json.loads(line)
            raw["pytorch"].append(t)
            for _, key, _ in PAIRS:
                d = torch.setdefault((t["attention"], key), {"wall": [], "cpu": []})
                d["wall"].append(t[key]["tokens_per_second_median"])
                d["cpu"].append(t[key]["tokens_per_cpu_second"])
            torch_version = t["torch"]

best = max  # tokens/s: the least-disturbed round
print(f"model: {context.get('model')}; micro-batch: {context.get('micro_batch')}; "
      f"rounds: {rounds}")
print(f"baton: {context.get('executable')} (blas_threads={context.get('blas_threads')}); "
      f"pytorch {torch_version} eager, 1 thread")
print()
hdr = f"{'measurement':<50} {'baton tok/s':>12} {'torch tok/s':>12} {'ratio':>6}   {'(cpu-time ratio)':>16}"
summary = {}
for variant in ("explicit", "sdpa"):
    if (variant, "fwd_bwd") not in torch:
        continue
    print(f"PyTorch attention: {variant}")
    print(hdr)
    for name, key, what in PAIRS:
        bw, bc = baton[name]["wall"], baton[name]["cpu"]
        tw, tc = torch[(variant, key)]["wall"], torch[(variant, key)]["cpu"]
        if not bw or not tw:
            continue
        ratio = best(bw) / best(tw)
        cratio = best(bc) / best(tc)
        print(f"{what:<50} {best(bw):>12.0f} {best(tw):>12.0f} {ratio:>6.2f}   {cratio:>16.2f}")
        summary[f"{variant}/{key}"] = dict(baton_tokens_per_second=best(bw),
                                           pytorch_tokens_per_second=best(tw), ratio=ratio,
                                           baton_tokens_per_cpu_second=best(bc),
                                           pytorch_tokens_per_cpu_second=best(tc),
                                           cpu_ratio=cratio)
    print()
def rounds_line(wall, cpu):
    return " ".join(f"{w:.0f}{'*' if c > 1.1 * w else ''}" for w, c in zip(wall, cpu))

print("per round, tokens/s (* = disturbed: CPU-time rate over 1.1x the wall-clock rate)")
for name, key, _ in PAIRS:
    print(f"  baton {name:<22} {rounds_line(baton[name]['wall'], baton[name]['cpu'])}")
    for variant in ("explicit", "sdpa"):
        if (variant, key) in torch:
            d = torch[(variant, key)]
            print(f"  torch {variant + '/' + key:<22} {rounds_line(d['wall'], d['cpu'])}")
for name, _, _ in PAIRS:
    print(f"baton {name}: system_allocations_per_iter = {baton[name].get('allocs')}")
if out:
    with open(out, "w") as f:
        json.dump({"summary": summary, "raw": raw}, f, indent=1)
    print(f"raw results: {out}")
EOF
