#!/usr/bin/env bash
# End-to-end: batonctl train-local as a user runs it.
#  - the same spec gives the same weights digest twice, and with 2 BLAS threads;
#  - --output json is valid JSON with per-step losses and per-block digests whose
#    combination (SHA-256 over the concatenated block digests) is the weights digest;
#  - bad specs exit non-zero with a message naming the field, and nothing crashes;
#  - token shards train, resume to the same digest, and bad ids are refused by offset.
set -euo pipefail
BATONCTL="$1"
EXAMPLES="$2"
tmp="$(mktemp -d)"
trap '[[ -n "${KEEP_TMP:-}" ]] || rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

"$BATONCTL" train-local -f "$EXAMPLES/mlp-tiny.json" --steps 20 --output json >"$tmp/a.json"
"$BATONCTL" train-local -f "$EXAMPLES/mlp-tiny.json" --steps 20 --output json >"$tmp/b.json"
"$BATONCTL" train-local -f "$EXAMPLES/mlp-tiny.json" --steps 20 --output json \
  --blas-threads 2 >"$tmp/c.json"

python3 - "$tmp" <<'PY'
import hashlib, json, sys
d = sys.argv[1]
a, b, c = (json.load(open(f"{d}/{n}.json")) for n in "abc")
assert a["weights_digest"] == b["weights_digest"] == c["weights_digest"], "digests differ"
assert [s["loss"] for s in a["steps"]] == [s["loss"] for s in b["steps"]], "losses differ"
assert len(a["steps"]) == 20, len(a["steps"])
assert a["steps"][-1]["loss"] < a["steps"][0]["loss"], "loss did not fall"
blocks = a["block_digests"]
assert [x["block"] for x in blocks] == ["hidden.0", "hidden.1", "hidden.2", "hidden.3", "out"], blocks
combined = hashlib.sha256(b"".join(bytes.fromhex(x["sha256"]) for x in blocks)).hexdigest()
assert combined == a["weights_digest"], (combined, a["weights_digest"])
print("json report ok:", a["weights_digest"])
PY

"$BATONCTL" train-local -f "$EXAMPLES/mlp-tiny.json" --steps 3 | grep -q "^weights digest [0-9a-f]\{64\}$" \
  || fail "text output has no weights digest line"

# Matrix kernels (common/core/blas_kernels.h): the report names them; a CPU with AVX2 and FMA
# never runs OpenBLAS's generic Prescott set unless the operator asks for it; the operator's
# OPENBLAS_CORETYPE is kept; a choice whose self-test fails (injected) falls back and says
# why, and the run goes on.
kernels() { python3 -c 'import json, sys; print(json.load(sys.stdin)["kernels"])'; }
got="$(env -u OPENBLAS_CORETYPE -u BATON_BLAS_CHOICE "$BATONCTL" train-local \
  -f "$EXAMPLES/mlp-tiny.json" --steps 1 --output json | kernels)"
[[ "$got" == OpenBLAS* ]] || fail "kernels: '$got'"
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
  [[ "$got" != *"Prescott kernels"* ]] || fail "generic kernels on a CPU with AVX2: $got"
fi
echo "kernels: $got"
got="$(OPENBLAS_CORETYPE=Prescott "$BATONCTL" train-local -f "$EXAMPLES/mlp-tiny.json" \
  --steps 1 --output json | kernels)"
[[ "$got" == *"Prescott kernels (chosen by the operator (OPENBLAS_CORETYPE));"* ]] \
  || fail "the operator's OPENBLAS_CORETYPE was not kept: $got"
got="$(env -u OPENBLAS_CORETYPE BATON_BLAS_CHOICE="a test's choice" BATON_BLAS_SELFTEST_INJECT=1 \
  "$BATONCTL" train-local -f "$EXAMPLES/mlp-tiny.json" --steps 1 --output json | kernels)"
[[ "$got" == *"after baton's choice failed its self-test"*"a float64 product gives"* ]] \
  || fail "an injected self-test failure did not fall back: $got"
echo "kernels after an injected self-test failure: $got"

# bf16 products (common/core/bf16_gemm.h): oneDNN on a CPU that multiplies bf16 (AMX-BF16,
# AVX512-BF16), the widened float32 path elsewhere and when the operator asks for it
# (BATON_BF16_GEMM=widen); an injected self-test failure widens, says why, and trains to
# the widened path's digest.
bf16_run() {  # bf16_run NAME [ENV...]: digest and kernels of a 2-step bf16 run in $tmp/NAME.*
  env "${@:2}" "$BATONCTL" train-local -f "$EXAMPLES/gpt.json" --steps 2 --precision bf16 \
    --output json >"$tmp/$1.json"
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(r["weights_digest"])' \
    "$tmp/$1.json" >"$tmp/$1.digest"
  kernels <"$tmp/$1.json" >"$tmp/$1.kernels"
}
bf16_run bf16-default -u BATON_BF16_GEMM
bf16_run bf16-widen BATON_BF16_GEMM=widen
bf16_run bf16-inject -u BATON_BF16_GEMM BATON_BF16_SELFTEST_INJECT=1
got="$(cat "$tmp/bf16-default.kernels")"
if grep -qw amx_bf16 /proc/cpuinfo; then
  [[ "$got" == *"bf16 products oneDNN "*" on AMX-BF16 (chosen by baton: "* ]] \
    || fail "a CPU with AMX-BF16 does not multiply bf16 on it: $got"
elif grep -qw avx512_bf16 /proc/cpuinfo; then
  [[ "$got" == *"bf16 products oneDNN "*" on AVX512-BF16 (chosen by baton: "* ]] \
    || fail "a CPU with AVX512-BF16 does not multiply bf16 on it: $got"
else
  [[ "$got" == *"bf16 products widened to float32 (sgemm) (chosen by baton: the CPU has no bf16 multiply"* ]] \
    || fail "a CPU without a bf16 multiply: $got"
fi
echo "bf16 kernels: ${got#*; }"
got="$(cat "$tmp/bf16-widen.kernels")"
[[ "$got" == *"bf16 products widened to float32 (sgemm) (chosen by the operator (BATON_BF16_GEMM=widen))" ]] \
  || fail "BATON_BF16_GEMM=widen was not kept: $got"
got="$(cat "$tmp/bf16-inject.kernels")"
if [[ "$(cat "$tmp/bf16-default.kernels")" == *"bf16 products oneDNN"* ]]; then
  [[ "$got" == *"bf16 products widened to float32 (sgemm) (chosen by baton: oneDNN "*" failed its self-test: oneDNN bf16 matmul 64x64x64: element (32, 0) is"* ]] \
    || fail "an injected bf16 self-test failure did not widen: $got"
  echo "bf16 kernels after an injected self-test failure: ${got#*; }"
fi
cmp -s "$tmp/bf16-inject.digest" "$tmp/bf16-widen.digest" \
  || fail "the fallback's digest $(cat "$tmp/bf16-inject.digest") is not the widened path's $(cat "$tmp/bf16-widen.digest")"

expect_refusal() {  # expect_refusal NAME EXPECTED_SUBSTRING JSON
  printf '%s' "$3" >"$tmp/$1.json"
  if "$BATONCTL" train-local -f "$tmp/$1.json" >"$tmp/$1.out" 2>&1; then
    fail "$1: accepted a bad spec"
  fi
  grep -qF "$2" "$tmp/$1.out" || fail "$1: message does not name '$2': $(cat "$tmp/$1.out")"
  echo "refused $1: $(head -c 200 "$tmp/$1.out")"
}
good='"data": {"synthetic": {}, "batchSize": 8}, "optimizer": {"sgd": {"learningRate": 0.1}}, "steps": 1'
expect_refusal zero-width "model.mlp.width" \
  "{\"model\": {\"mlp\": {\"inputDim\": 2, \"width\": 0, \"depth\": 1, \"outputDim\": 1}}, $good}"
expect_refusal negative-depth "model.mlp.depth" \
  "{\"model\": {\"mlp\": {\"inputDim\": 2, \"width\": 4, \"depth\": -1, \"outputDim\": 1}}, $good}"
expect_refusal unknown-field "widht" \
  "{\"model\": {\"mlp\": {\"inputDim\": 2, \"widht\": 4, \"depth\": 1, \"outputDim\": 1}}, $good}"
expect_refusal heads "model.gpt.heads" \
  '{"model": {"gpt": {"vocabSize": 8, "context": 4, "dModel": 6, "heads": 4, "layers": 1}}, "data": {"text": {"inlineText": "abcdefgh"}, "batchSize": 2}, "optimizer": {"sgd": {"learningRate": 0.1}}, "steps": 1}'
expect_refusal empty-text "data.text" \
  '{"model": {"gpt": {"vocabSize": 8, "context": 4, "dModel": 8, "heads": 2, "layers": 1}}, "data": {"text": {"inlineText": ""}, "batchSize": 2}, "optimizer": {"sgd": {"learningRate": 0.1}}, "steps": 1}'
expect_refusal missing-file "data.text.path" \
  '{"model": {"gpt": {"vocabSize": 8, "context": 4, "dModel": 8, "heads": 2, "layers": 1}}, "data": {"text": {"path": "/nonexistent/corpus.txt"}, "batchSize": 2}, "optimizer": {"sgd": {"learningRate": 0.1}}, "steps": 1}'
expect_refusal malformed "invalid job spec JSON" '{"model": '
if "$BATONCTL" train-local -f "$tmp/does-not-exist.json" >"$tmp/nf.out" 2>&1; then
  fail "missing spec file accepted"
fi
grep -qF "does-not-exist.json" "$tmp/nf.out" || fail "missing spec file not named"
# --pipeline --trace: the last step's timeline as trace-event JSON, one track per stage
# and, per rank, exactly the actions of its clock (as batonctl plan prints them). The
# tiny MLP as 2 ranks x 2 chunks of interleaved 1F1B: 4 stages on 2 ranks.
sed -e 's/"stages": 1, "microbatches": 4, "schedule": "SCHEDULE_1F1B"/"stages": 2, "virtualStages": 2, "microbatches": 4, "schedule": "SCHEDULE_INTERLEAVED_1F1B"/' \
  "$EXAMPLES/mlp-tiny.json" >"$tmp/interleaved.json"
grep -q SCHEDULE_INTERLEAVED_1F1B "$tmp/interleaved.json" || fail "could not make the interleaved spec"
"$BATONCTL" train-local -f "$tmp/interleaved.json" --pipeline --steps 2 \
  --trace "$tmp/trace.json" >/dev/null || fail "train-local --pipeline --trace failed"
"$BATONCTL" plan -f "$tmp/interleaved.json" --output json >"$tmp/plan.json" \
  || fail "plan -f interleaved.json failed"
python3 - "$tmp/trace.json" "$tmp/plan.json" <<'PY' || fail "the local trace does not match the clocks"
import collections, json, sys
trace, plan = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
events = trace["traceEvents"]
tracks = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
assert tracks == {(r, s) for s, r in enumerate(plan["stage_to_rank"])}, tracks
assert trace["otherData"]["step"] == 2, trace["otherData"]
for rank, clock in enumerate(plan["ranks"]):
    got = collections.Counter(e["name"] for e in events
                              if e["ph"] == "X" and e["pid"] == rank and e["cat"] != "send_wait")
    assert got == collections.Counter(clock), (rank, got, clock)
print(f"local trace: {len(tracks)} tracks, {sum(map(len, plan['ranks']))} actions as planned")
PY
# Data parallelism: two replicas of a two-stage pipeline (four stage threads) end with
# the reference trainer's digest for the same grouping, which is not one replica's.
sed -e 's/"stages": 1, "microbatches": 4, "schedule": "SCHEDULE_1F1B"/"stages": 2, "microbatches": 2, "dataParallel": 2, "schedule": "SCHEDULE_1F1B"/' \
  "$EXAMPLES/mlp-tiny.json" >"$tmp/dp.json"
grep -q dataParallel "$tmp/dp.json" || fail "could not make the data-parallel spec"
dp_ref="$("$BATONCTL" train-local -f "$tmp/dp.json" --steps 3 | sed -n 's/^weights digest //p')"
dp_pipe="$("$BATONCTL" train-local -f "$tmp/dp.json" --pipeline --steps 3 --trace "$tmp/dp-trace.json" \
           | sed -n 's/^weights digest //p')"
[[ -n "$dp_ref" && "$dp_pipe" == "$dp_ref" ]] || fail "data-parallel pipeline $dp_pipe, reference $dp_ref"
grep -q REDUCE_GRAD "$tmp/dp-trace.json" || fail "the data-parallel trace has no REDUCE_GRAD"
sed -e 's/"dataParallel": 2, //' "$tmp/dp.json" >"$tmp/dp1.json"
one="$("$BATONCTL" train-local -f "$tmp/dp1.json" --steps 3 | sed -n 's/^weights digest //p')"
[[ "$one" != "$dp_ref" ]] || fail "two replicas' grouping gave one pipeline's digest"
echo "data parallel: 2 replicas x 2 stages, digest $dp_ref"

if "$BATONCTL" train-local -f "$EXAMPLES/mlp-tiny.json" --trace "$tmp/t.json" >"$tmp/t.out" 2>&1; then
  fail "--trace without --pipeline accepted"
fi
grep -qF -- "--trace needs --pipeline" "$tmp/t.out" || fail "--trace without --pipeline: $(cat "$tmp/t.out")"

# Checkpoints: refused before training when the directory cannot be written; --resume-from
# names what is wrong; a run stopped at a checkpoint and resumed (on a pipeline) ends with
# the uninterrupted digest.
python3 - "$EXAMPLES/mlp-tiny.json" "$tmp" >"$tmp/ckpt.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["checkpoint"] = {"everySteps": 2, "dir": sys.argv[2] + "/ckpt", "keep": 3}
spec["steps"] = 7
print(json.dumps(spec))
PY
sed -e "s|$tmp/ckpt|/proc/no-such-dir|" "$tmp/ckpt.json" >"$tmp/ckpt-bad.json"
if "$BATONCTL" train-local -f "$tmp/ckpt-bad.json" >"$tmp/cb.out" 2>&1; then
  fail "an unwritable checkpoint.dir was accepted"
fi
grep -qF "checkpoint.dir: checkpoint directory /proc/no-such-dir" "$tmp/cb.out" \
  || fail "unwritable checkpoint.dir: $(cat "$tmp/cb.out")"
grep -q "^step" "$tmp/cb.out" && fail "trained before refusing the checkpoint directory"
want="$("$BATONCTL" train-local -f "$tmp/ckpt.json" | sed -n 's/^weights digest //p')"
# Every 2 steps and after the last: 2, 4, 6, 7; keep 3 leaves 4, 6, 7.
[[ "$(ls "$tmp/ckpt/local" | tr '\n' ' ')" == "step-4 step-6 step-7 " ]] \
  || fail "checkpoints kept: $(ls "$tmp/ckpt/local")"
got="$("$BATONCTL" train-local -f "$tmp/ckpt.json" --pipeline --job-id again \
        --resume-from "$tmp/ckpt/local@4" | sed -n 's/^weights digest //p')"
[[ -n "$want" && "$got" == "$want" ]] || fail "resumed digest $got, uninterrupted $want"
[[ "$(ls "$tmp/ckpt/again" | tr '\n' ' ')" == "step-6 step-7 " ]] \
  || fail "the resumed run's checkpoints: $(ls "$tmp/ckpt/again")"
for bad in "$tmp/ckpt/nothing" "$tmp/ckpt/local@2" "$tmp/ckpt/local@3" "$tmp/ckpt/local@x"; do
  if "$BATONCTL" train-local -f "$tmp/ckpt.json" --resume-from "$bad" >"$tmp/rb.out" 2>&1; then
    fail "--resume-from $bad accepted"
  fi
  grep -qE "no complete checkpoint|not a complete checkpoint|must be a step number" "$tmp/rb.out" \
    || fail "--resume-from $bad: $(cat "$tmp/rb.out")"
done
"$BATONCTL" export --from "$tmp/ckpt/local" -o "$tmp/model.safetensors" 2>/dev/null \
  || fail "export --from failed"
[[ -s "$tmp/model.safetensors" ]] || fail "export wrote nothing"

# Token shards (docs/data.md): an llm.c shard and a raw uint16 one, globbed; a run resumed
# from a checkpoint reads the same windows as the uninterrupted one (same digest), for
# random and sequential sampling; an id outside the vocabulary is refused naming the file
# and the offset.
mkdir -p "$tmp/tok"
python3 - "$tmp/tok" <<'PY2'
import struct, sys
d = sys.argv[1]
ids = [(i * 7 + i // 5) % 61 for i in range(3000)]
hdr = [0] * 256
hdr[0], hdr[1], hdr[2] = 20240520, 1, 2000
open(f"{d}/train_000.bin", "wb").write(struct.pack("<256i", *hdr) + struct.pack("<2000H", *ids[:2000]))
open(f"{d}/train_001.bin", "wb").write(struct.pack("<1000H", *ids[2000:]))
bad = ids[:500]
bad[321] = 700
open(f"{d}/bad.bin", "wb").write(struct.pack("<500H", *bad))
PY2
for sampling in TOKEN_SAMPLING_RANDOM TOKEN_SAMPLING_SEQUENTIAL; do
  cat >"$tmp/tok.json" <<EOF2
{"model": {"gpt": {"vocabSize": 64, "context": 16, "dModel": 16, "heads": 2, "layers": 2}},
 "data": {"tokens": {"train": ["$tmp/tok/train_*.bin"], "sampling": "$sampling"}, "batchSize": 4},
 "pipeline": {"stages": 2, "microbatches": 2},
 "optimizer": {"adamw": {"learningRate": 0.01}}, "steps": 6, "seed": 3,
 "checkpoint": {"everySteps": 3, "dir": "$tmp/tokckpt-$sampling", "keep": 2}}
EOF2
  want="$("$BATONCTL" train-local -f "$tmp/tok.json" | sed -n 's/^weights digest //p')"
  got="$("$BATONCTL" train-local -f "$tmp/tok.json" --pipeline --job-id again \
          --resume-from "$tmp/tokckpt-$sampling/local@3" | sed -n 's/^weights digest //p')"
  [[ -n "$want" && "$got" == "$want" ]] || fail "tokens ($sampling): resumed digest $got, uninterrupted $want"
done
expect_refusal token-vocab "token id 700 at token offset 321" \
  "{\"model\": {\"gpt\": {\"vocabSize\": 64, \"context\": 16, \"dModel\": 16, \"heads\": 2, \"layers\": 1}}, \"data\": {\"tokens\": {\"train\": [\"$tmp/tok/bad.bin\"], \"sampling\": \"TOKEN_SAMPLING_SEQUENTIAL\"}, \"batchSize\": 30}, \"optimizer\": {\"sgd\": {\"learningRate\": 0.1}}, \"steps\": 1}"
expect_refusal token-tiny "fewer than one window" \
  "{\"model\": {\"gpt\": {\"vocabSize\": 64, \"context\": 600, \"dModel\": 16, \"heads\": 2, \"layers\": 1}}, \"data\": {\"tokens\": {\"train\": [\"$tmp/tok/bad.bin\"]}, \"batchSize\": 2}, \"optimizer\": {\"sgd\": {\"learningRate\": 0.1}}, \"steps\": 1}"

# Evaluation only (eval.only, docs/models.md): the validation loss of a checkpoint's weights,
# with nothing trained, equals the loss the training run measured after that step, bit for
# bit, in one process and as a pipeline; the weights digest is the checkpoint's; perplexity
# is exp(loss); the report says where the weights came from.
python3 - "$tmp/tok" <<'PY3'
import struct, sys
ids = [(i * 11 + i // 3) % 59 for i in range(1200)]
open(f"{sys.argv[1]}/val_000.bin", "wb").write(struct.pack("<1200H", *ids))
PY3
cat >"$tmp/eval.json" <<EOF3
{"model": {"gpt": {"vocabSize": 64, "context": 16, "dModel": 16, "heads": 2, "layers": 2}},
 "data": {"tokens": {"train": ["$tmp/tok/train_*.bin"], "val": ["$tmp/tok/val_000.bin"]},
          "batchSize": 4},
 "pipeline": {"stages": 2, "microbatches": 2},
 "eval": {"every": 4, "batches": 3},
 "optimizer": {"adamw": {"learningRate": 0.01}}, "steps": 4, "seed": 3,
 "checkpoint": {"everySteps": 4, "dir": "$tmp/evalckpt"}}
EOF3
"$BATONCTL" train-local -f "$tmp/eval.json" --output json >"$tmp/trained.json"
"$BATONCTL" train-local -f "$tmp/eval.json" --eval-only --resume-from "$tmp/evalckpt/local@4" \
  --output json >"$tmp/eval-ref.json"
"$BATONCTL" train-local -f "$tmp/eval.json" --eval-only --pipeline \
  --resume-from "$tmp/evalckpt/local@4" --output json >"$tmp/eval-pipe.json"
"$BATONCTL" train-local -f "$tmp/eval.json" --eval-only --output json >"$tmp/eval-seed.json"
"$BATONCTL" train-local -f "$tmp/eval.json" --eval-only >"$tmp/eval.out"
grep -q "^eval loss [0-9.]*  perplexity" "$tmp/eval.out" \
  || fail "eval-only text output has no eval loss line"
python3 - "$tmp" <<'PY4'
import json, math, sys
d = sys.argv[1]
trained, ref, pipe, seed = (json.load(open(f"{d}/{n}.json"))
                            for n in ("trained", "eval-ref", "eval-pipe", "eval-seed"))
after = trained["steps"][-1]["val_loss"]
assert ref["eval_loss"] == after, (ref["eval_loss"], after)
assert pipe["eval_loss"] == after, (pipe["eval_loss"], after)
assert ref["weights_digest"] == pipe["weights_digest"] == trained["weights_digest"]
assert "steps" not in ref, "an eval-only run trained"
assert math.isclose(ref["eval_perplexity"], math.exp(ref["eval_loss"]), rel_tol=1e-7)
assert ref["initial_weights"].startswith("checkpoint ") and ref["initial_weights"].endswith(
    "after step 4"), ref["initial_weights"]
assert seed["initial_weights"] == "seed 3", seed["initial_weights"]
assert seed["eval_loss"] > after, (seed["eval_loss"], after)  # training lowered it
assert trained["initial_weights"] == "seed 3", trained["initial_weights"]
print("eval-only ok:", after)
PY4
expect_refusal eval-no-val "eval.only: evaluation needs a validation split" \
  "{\"model\": {\"gpt\": {\"vocabSize\": 64, \"context\": 16, \"dModel\": 16, \"heads\": 2, \"layers\": 1}}, \"data\": {\"tokens\": {\"train\": [\"$tmp/tok/train_000.bin\"]}, \"batchSize\": 2}, \"eval\": {\"only\": true}, \"optimizer\": {\"sgd\": {\"learningRate\": 0.1}}, \"steps\": 1}"

# Samples (batonctl sample): greedy decoding from the checkpoint equals greedy decoding from
# its Hugging Face export (two loading paths, one model); sampling repeats for a seed; the
# window runs past the context (20 tokens after 3, context 16); a bad id is refused.
sample_ids() { "$BATONCTL" sample "$@" --prompt-ids 1,2,3 --tokens 20 --output json; }
sample_ids --from "$tmp/evalckpt/local" --spec "$tmp/eval.json" --temperature 0 >"$tmp/s-ckpt.json"
"$BATONCTL" export --from "$tmp/evalckpt/local" --spec "$tmp/eval.json" --format hf \
  -o "$tmp/evalhf" 2>/dev/null || fail "export --format hf of the eval checkpoint failed"
sample_ids --hf "$tmp/evalhf" --temperature 0 >"$tmp/s-hf.json"
sample_ids --hf "$tmp/evalhf" --seed 7 >"$tmp/s-7a.json"
sample_ids --hf "$tmp/evalhf" --seed 7 >"$tmp/s-7b.json"
python3 - "$tmp" <<'PY5'
import json, sys
d = sys.argv[1]
ckpt, hf, a, b = (json.load(open(f"{d}/s-{n}.json")) for n in ("ckpt", "hf", "7a", "7b"))
assert len(ckpt["ids"]) == 20 and ckpt["prompt_ids"] == [1, 2, 3], ckpt
assert ckpt["ids"] == hf["ids"], (ckpt["ids"], hf["ids"])
assert a["ids"] == b["ids"], (a["ids"], b["ids"])
assert all(0 <= i < 64 for i in ckpt["ids"] + a["ids"])
print("sample ok:", ckpt["ids"][:8])
PY5
if "$BATONCTL" sample --hf "$tmp/evalhf" --prompt-ids 1,99 >"$tmp/s-bad.out" 2>&1; then
  fail "sample accepted an id outside the vocabulary"
fi
grep -qF "prompt token 1 is id 99, outside the vocabulary [0, 64)" "$tmp/s-bad.out" \
  || fail "sample's refusal does not name the id: $(cat "$tmp/s-bad.out")"

# A job that started from a Hugging Face directory exports with it as its base (its files
# come along); when the directory is not where batonctl runs, the export stops and says
# what to do rather than drop them; --base none writes the trained model alone.
echo '{"model_max_length": 16}' >"$tmp/evalhf/tokenizer_config.json"
sed -e "s|\"eval\": {\"every\": 4, \"batches\": 3},|\"init\": {\"fromHf\": \"$tmp/evalhf\"},|" \
    -e "s|$tmp/evalckpt|$tmp/fromhfckpt|" "$tmp/eval.json" >"$tmp/fromhf.json"
"$BATONCTL" train-local -f "$tmp/fromhf.json" --steps 2 >"$tmp/fromhf.out"
grep -qF "initial weights: Hugging Face model $tmp/evalhf" "$tmp/fromhf.out" \
  || fail "train-local does not say the weights came from the Hugging Face directory"
"$BATONCTL" export --from "$tmp/fromhfckpt/local" --spec "$tmp/fromhf.json" --format hf \
  -o "$tmp/tuned" 2>/dev/null || fail "export with the job's init.from_hf as its base failed"
cmp -s "$tmp/evalhf/tokenizer_config.json" "$tmp/tuned/tokenizer_config.json" \
  || fail "the export did not carry the base's tokenizer_config.json"
mv "$tmp/evalhf" "$tmp/evalhf-moved"
if "$BATONCTL" export --from "$tmp/fromhfckpt/local" --spec "$tmp/fromhf.json" --format hf \
    -o "$tmp/tuned2" >"$tmp/nobase.out" 2>&1; then
  fail "export without its base directory succeeded"
fi
grep -qF "give --base DIR" "$tmp/nobase.out" || fail "export's refusal: $(cat "$tmp/nobase.out")"
"$BATONCTL" export --from "$tmp/fromhfckpt/local" --spec "$tmp/fromhf.json" --format hf \
  -o "$tmp/tuned2" --base "$tmp/evalhf-moved" 2>/dev/null || fail "export --base DIR failed"
"$BATONCTL" export --from "$tmp/fromhfckpt/local" --spec "$tmp/fromhf.json" --format hf \
  -o "$tmp/tuned3" --base none 2>/dev/null || fail "export --base none failed"
[[ -e "$tmp/tuned2/tokenizer_config.json" && ! -e "$tmp/tuned3/tokenizer_config.json" ]] \
  || fail "--base DIR / --base none: the tokenizer files are not as asked"

echo "batonctl train-local: all checks passed"
