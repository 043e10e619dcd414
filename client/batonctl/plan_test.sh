#!/usr/bin/env bash
# End-to-end: batonctl plan as a user runs it (registered from client/CMakeLists.txt).
#  - --output json is valid JSON with the documented fields and the closed-form bubble;
#  - --output csv imports back (--schedule custom --csv) to the same clock;
#  - --output svg is well-formed XML; table output has one row per rank;
#  - refused clocks (deadlock, missing backward, mismatched send/receive order) exit 1 with
#    the grid and the offending action; bad sizes exit 1 with a message naming the flag.
set -euo pipefail
BATONCTL="$1"
EXAMPLES="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

"$BATONCTL" plan --schedule zb-h1 --stages 4 --microbatches 8 --output json >"$tmp/zb.json"
"$BATONCTL" plan --schedule 1f1b --stages 4 --microbatches 8 --output json >"$tmp/1f1b.json"
"$BATONCTL" plan --schedule interleaved-1f1b --stages 4 --virtual 2 --microbatches 8 \
  --costs F=1,I=1,W=1 --output json >"$tmp/il.json"
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
zb, one, il = (json.load(open(f"{d}/{n}.json")) for n in ("zb", "1f1b", "il"))
for j in (zb, one, il):
    for key in ("schedule", "stages", "virtual", "microbatches", "bubble_ratio", "makespan",
                "peak_inflight", "ranks"):
        assert key in j, key
    assert len(j["ranks"]) == j["stages"] == 4
    assert all(r[-1] == "STEP" for r in j["ranks"])
assert zb["schedule"] == "zb-h1" and zb["makespan"] == 27, zb["makespan"]
assert abs(zb["bubble_ratio"] - 3 / 27) < 1e-9, zb["bubble_ratio"]
assert abs(one["bubble_ratio"] - 3 / 11) < 1e-9, one["bubble_ratio"]
assert one["peak_inflight"] == [4, 3, 2, 1], one["peak_inflight"]
assert il["virtual"] == 2 and il["peak_inflight"] == [11, 9, 7, 5], il["peak_inflight"]
assert abs(il["bubble_ratio"] - 3 / 19) < 1e-9, il["bubble_ratio"]
assert "1I0" in zb["ranks"][1] and "0SEND_F0" in zb["ranks"][0]
print("json ok")
PY

# CSV export imports back to the same clock.
for sched in "gpipe --stages 3 --microbatches 5" "1f1b --stages 4 --microbatches 8" \
             "interleaved-1f1b --stages 2 --virtual 2 --microbatches 4" \
             "zb-h1 --stages 4 --microbatches 6" "zb-v --stages 3 --microbatches 4" \
             "v-half --stages 2 --microbatches 5" "dualpipe-v --stages 3 --microbatches 7"; do
  # shellcheck disable=SC2086
  "$BATONCTL" plan --schedule $sched --output csv >"$tmp/export.csv"
  # shellcheck disable=SC2086
  "$BATONCTL" plan --schedule $sched --output json >"$tmp/a.json"
  "$BATONCTL" plan --schedule custom --csv "$tmp/export.csv" --output json >"$tmp/b.json"
  "$BATONCTL" plan --csv "$tmp/export.csv" --output csv >"$tmp/again.csv"
  cmp -s "$tmp/export.csv" "$tmp/again.csv" || fail "CSV round trip changed the clock ($sched)"
  python3 - "$tmp/a.json" "$tmp/b.json" <<'PY' || fail "imported clock differs ($sched)"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert b["schedule"] == "custom"
for key in ("ranks", "stages", "virtual", "microbatches", "makespan", "bubble_ratio",
            "peak_inflight", "stage_to_rank"):
    assert a[key] == b[key], key
PY
done
echo "csv round trip ok"

"$BATONCTL" plan --schedule interleaved-1f1b --stages 4 --virtual 2 --microbatches 8 \
  --output svg >"$tmp/il.svg"
python3 -c "import sys, xml.dom.minidom as m; m.parse(sys.argv[1])" "$tmp/il.svg" \
  || fail "svg is not well-formed"
grep -q "interleaved-1f1b: S=4, V=2, M=8" "$tmp/il.svg" || fail "svg has no title"

"$BATONCTL" plan --schedule 1f1b --stages 4 --microbatches 8 >"$tmp/table.txt"
grep -q "^makespan 33, bubble ratio 0.2727" "$tmp/table.txt" || fail "table has no summary"
[[ "$(grep -c '^rank [0-3] |' "$tmp/table.txt")" == 4 ]] || fail "table rows"

# The spec's pipeline section gives the defaults (gpt.json: 4 stages, 4 micro-batches, 1f1b).
"$BATONCTL" plan -f "$EXAMPLES/gpt.json" --output json >"$tmp/spec.json"
python3 -c "
import json, sys
j = json.load(open(sys.argv[1]))
assert (j['schedule'], j['stages'], j['microbatches']) == ('1f1b', 4, 4), j
" "$tmp/spec.json" || fail "spec defaults not used"

# With a spec, the JSON carries what the table's footer says: each stage's blocks and
# parameters, each rank's peak memory (the same figures, to the table's rounding).
"$BATONCTL" plan -f "$EXAMPLES/gpt.json" >"$tmp/spec.txt"
python3 -c "
import json, re, sys
j = json.load(open(sys.argv[1]))['footprint']
text = open(sys.argv[2]).read()
stages = re.findall(r'^stage (\d+): (.*), ([0-9.]+)M parameters$', text, re.M)
ranks = re.findall(r'^rank (\d+): peak memory ', text, re.M)
assert len(j['stages']) == len(stages) == 4, (j, stages)
assert len(j['ranks']) == len(ranks) == 4, (j, ranks)
for st, (n, blocks, params) in zip(j['stages'], stages):
    assert st['stage'] == int(n) and st['blocks'], st
    assert blocks.startswith(st['blocks'][0]), (st, blocks)
    assert '%.2f' % (st['parameters'] / 1e6) == params, (st, params)
assert all(r['peak_bytes'] > 0 for r in j['ranks']), j
names = [b for st in j['stages'] for b in st['blocks']]
assert len(names) == len(set(names)) and names[0] == 'embed', names
" "$tmp/spec.json" "$tmp/spec.txt" || fail "plan --output json lacks the stages' footprint"
# No replicas: no sharded figure.
python3 -c "
import json, sys
assert all('peak_bytes_sharded' not in r for r in json.load(open(sys.argv[1]))['footprint']['ranks'])
" "$tmp/spec.json" || fail "a job without replicas shows a sharded figure"

# With replicas, each rank's peak with and without the optimizer sharded (AdamW: the
# sharded one keeps half the state at D = 2), and the spec's own setting is peak_bytes.
python3 - "$EXAMPLES/gpt.json" "$tmp" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec['pipeline'] = dict(spec['pipeline'], stages=2, dataParallel=2)
json.dump(spec, open(sys.argv[2] + '/dp.json', 'w'))
spec['optimizer']['shard'] = True
json.dump(spec, open(sys.argv[2] + '/dp-shard.json', 'w'))
PY
"$BATONCTL" plan -f "$tmp/dp.json" --output json >"$tmp/dp.out.json"
"$BATONCTL" plan -f "$tmp/dp-shard.json" --output json >"$tmp/dp-shard.out.json"
"$BATONCTL" plan -f "$tmp/dp-shard.json" >"$tmp/dp-shard.txt"
python3 -c "
import json, sys
plain = json.load(open(sys.argv[1]))['footprint']
shard = json.load(open(sys.argv[2]))['footprint']
text = open(sys.argv[3]).read()
for p, s, st in zip(plain['ranks'], shard['ranks'], plain['stages']):
    assert p['peak_bytes'] == p['peak_bytes_unsharded'] == s['peak_bytes_unsharded'], (p, s)
    assert s['peak_bytes'] == s['peak_bytes_sharded'] == p['peak_bytes_sharded'], (p, s)
    n = st['parameters']
    assert p['peak_bytes'] - s['peak_bytes'] == 4 * 2 * (n - (n + 1) // 2), (p, s, n)
assert text.count('with the optimizer sharded (optimizer.shard)') == 2, text
" "$tmp/dp.out.json" "$tmp/dp-shard.out.json" "$tmp/dp-shard.txt" ||
  fail "plan does not show the peak with and without a sharded optimizer"

expect_refusal() {  # expect_refusal NAME EXPECTED_SUBSTRING ARGS...
  local name="$1" expected="$2"
  shift 2
  local rc=0
  "$BATONCTL" plan "$@" >"$tmp/$name.out" 2>&1 || rc=$?
  [[ "$rc" == 1 ]] || { cat "$tmp/$name.out" >&2; fail "$name: exit code $rc, want 1"; }
  grep -qF -- "$expected" "$tmp/$name.out" \
    || { cat "$tmp/$name.out" >&2; fail "$name: no '$expected' in the output"; }
}

printf '%s\n' "0F0,0SEND_F0,0RECV_B0,0B0,0F1,0SEND_F1,0RECV_B1,0B1" \
  "1RECV_F0,1RECV_F1,1F0,1F1,1B0,1SEND_B0,1B1,1SEND_B1" >"$tmp/deadlock.csv"
expect_refusal deadlock "deadlock: no rank can progress" --schedule custom --csv "$tmp/deadlock.csv"
grep -qF ">0RECV_B0<" "$tmp/deadlock.out" || fail "deadlock: stuck action not marked"
grep -qF ">1RECV_F1<" "$tmp/deadlock.out" || fail "deadlock: stuck action not marked"

printf '%s\n' "0F0,0F1,0B0,0B1" "1F0,1B0,1F1" >"$tmp/missing.csv"
expect_refusal missing "1F1 has no backward" --schedule custom --csv "$tmp/missing.csv"
grep -qF ">1F1<" "$tmp/missing.out" || fail "missing backward: forward not marked"

printf '%s\n' "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1" \
  "1RECV_F1,1RECV_F0,1F0,1B0,1SEND_B0,1F1,1B1,1SEND_B1" >"$tmp/order.csv"
expect_refusal order "receive order differs from send order" --csv "$tmp/order.csv"
grep -qF ">1RECV_F1<" "$tmp/order.out" || fail "order: receive not marked"

expect_refusal m0 "micro-batches must be at least 1 (--microbatches" \
  --schedule 1f1b --stages 4 --microbatches 0
expect_refusal interleaved_m "--microbatches 6 is not a multiple of --stages 4" \
  --schedule interleaved-1f1b --stages 4 --virtual 2 --microbatches 6
expect_refusal blocks "8 pipeline chunks, but the model has only 6 blocks" \
  --schedule interleaved-1f1b --stages 4 --virtual 2 --microbatches 8 --blocks 6
# mlp-tiny.json has depth 4: 5 blocks.
expect_refusal spec_blocks "6 pipeline chunks, but the model has only 5 blocks" \
  -f "$EXAMPLES/mlp-tiny.json" --schedule interleaved-1f1b --stages 3 --virtual 2 \
  --microbatches 3
expect_refusal no_csv "--schedule custom needs --csv FILE" --schedule custom
expect_refusal bad_csv "row 1 (rank 0), column 2" --csv <(printf '0F0,0Q0\n')
expect_refusal no_file "cannot open schedule CSV" --csv "$tmp/nonexistent.csv"
expect_refusal bad_output "--output must be table, json, svg or csv" \
  --stages 2 --microbatches 2 --output html
expect_refusal bad_costs "costs 'F=-1'" --stages 2 --microbatches 2 --costs F=-1
expect_refusal no_stages "missing --stages" --microbatches 2
expect_refusal zbv_m "--microbatches 3 is below --stages 4" \
  --schedule zb-v --stages 4 --microbatches 3
expect_refusal zbv_virtual "zb-v places exactly two chunks per rank" \
  --schedule zb-v --stages 2 --virtual 3 --microbatches 4
expect_refusal dualpipev_m "--microbatches 6 is below 2 x --stages 4" \
  --schedule dualpipe-v --stages 4 --microbatches 6
expect_refusal unknown_schedule "unknown schedule 'dualpipe' (known: gpipe" \
  --schedule dualpipe --stages 2 --microbatches 4
echo "refusals ok"

# The V schedules: the clock holds both of rank 0's stages, the first and the last.
"$BATONCTL" plan --schedule zb-v --stages 2 --microbatches 4 >"$tmp/zbv.out" ||
  fail "zb-v plan failed"
grep -qF "zb-v: S=2 ranks, V=2, M=4 micro-batches, 4 stages" "$tmp/zbv.out" || fail "zb-v header"
grep -q "^rank 0 |.*0F0.*3F0" "$tmp/zbv.out" || fail "zb-v: rank 0 does not run stages 0 and 3"
grep -qF "zb-v with unit costs: bubble" "$tmp/zbv.out" || fail "zb-v: no rules line"
# DualPipeV: the same V, with full backwards in the steady state.
"$BATONCTL" plan --schedule dualpipe-v --stages 2 --microbatches 4 >"$tmp/dpv.out" ||
  fail "dualpipe-v plan failed"
grep -qF "dualpipe-v: S=2 ranks, V=2, M=4 micro-batches, 4 stages" "$tmp/dpv.out" ||
  fail "dualpipe-v header"
grep -q "^rank 0 | 0F0 .* 3I0 3W0 .* 3B1 " "$tmp/dpv.out" ||
  fail "dualpipe-v: rank 0 should split its first backward of stage 3 and run the next whole"

# Measured costs: a trace file read back into per-stage costs (ms) for the same partition.
"$BATONCTL" train-local -f "$EXAMPLES/gpt.json" --pipeline --steps 2 --trace "$tmp/run.json" \
  >/dev/null || fail "train-local --trace failed"
"$BATONCTL" plan -f "$EXAMPLES/gpt.json" --schedule zb-h1 --costs-from "$tmp/run.json" \
  >"$tmp/measured.out" || fail "plan --costs-from failed: $(cat "$tmp/measured.out")"
grep -qF "costs measured by" "$tmp/measured.out" || fail "plan --costs-from: no source line"
expect_refusal measured_stages "measured 4 stages but this plan has 2" \
  -f "$EXAMPLES/gpt.json" --stages 2 --costs-from "$tmp/run.json"
expect_refusal measured_both "--costs and --costs-from both give the costs" \
  -f "$EXAMPLES/gpt.json" --costs F=1 --costs-from "$tmp/run.json"
echo "measured costs ok"

# The auto-planner: a ranking with the pick first, every row explained, its command line.
"$BATONCTL" plan --auto -f "$EXAMPLES/gpt.json" --workers 2 >"$tmp/auto.out" ||
  fail "plan --auto failed: $(cat "$tmp/auto.out")"
grep -qF "auto-plan: $EXAMPLES/gpt.json, 2 stages x 1 replica, batch 32, 4 blocks" "$tmp/auto.out" ||
  fail "auto: header"
grep -q "^   1  .*(the pick)$" "$tmp/auto.out" || fail "auto: no pick in row 1"
grep -q "^   2  .*\(bubble\|work\|tie\): " "$tmp/auto.out" || fail "auto: row 2 says not why it lost"
grep -q "^to run it: batonctl submit -f .* --stages 2 --microbatches [0-9]" "$tmp/auto.out" ||
  fail "auto: no command line"
# json, fixed choices, calibration from the trace above (4 stages, 1f1b M=4 as written).
"$BATONCTL" plan --auto -f "$EXAMPLES/gpt.json" --workers 4 --schedule 1f1b --output json \
  --costs-from "$tmp/run.json" >"$tmp/auto.json" || fail "plan --auto json: $(cat "$tmp/auto.json")"
python3 - "$tmp/auto.json" <<'PY' || fail "auto json"
import json, sys
plan = json.load(open(sys.argv[1]))
assert plan["measured"] and plan["stages"] == 4, plan
assert all(c["schedule"] == "1f1b" for c in plan["candidates"]), plan
times = [c["step_time"] for c in plan["candidates"]]
assert times == sorted(times) and len(times) == 6, times  # M in 1, 2, 4, 8, 16, 32
PY
# A budget between the smallest and largest need: the pick fits; below all: refused with the
# smallest need.
expect_refusal auto_memory "memory budget: no candidate fits 1 KiB per rank; the smallest" \
  --auto -f "$EXAMPLES/gpt.json" --workers 2 --memory-gib 0.000001
# A budget the balanced split misses: 1f1b's second rank (two layers, three micro-batches in
# flight) gives a layer down the chain; the row is starred, and the command line carries
# the split.
python3 - "$EXAMPLES/gpt.json" "$tmp/deep.json" <<'PY' || fail "deep spec"
import json, sys
spec = json.load(open(sys.argv[1]))
spec["model"]["gpt"]["layers"] = 6
json.dump(spec, open(sys.argv[2], "w"))
PY
"$BATONCTL" plan --auto -f "$tmp/deep.json" --workers 4 --schedule 1f1b --microbatches 8 \
  --output json >"$tmp/deep_free.json" || fail "deep plan: $(cat "$tmp/deep_free.json")"
gib="$(python3 -c 'import json, sys; c = json.load(open(sys.argv[1]))["candidates"][0]
assert not c["split_moved"], c
print(c["peak_bytes"] * 0.9 / 2**30)' "$tmp/deep_free.json")" || fail "deep plan json"
"$BATONCTL" plan --auto -f "$tmp/deep.json" --workers 4 --schedule 1f1b --microbatches 8 \
  --memory-gib "$gib" >"$tmp/deep.out" || fail "deep plan under budget: $(cat "$tmp/deep.out")"
grep -q "^   1  1f1b\* .*(the pick)$" "$tmp/deep.out" || fail "deep: the pick is not starred"
grep -qF "* blocks moved off the rank that needed the most" "$tmp/deep.out" || fail "deep: legend"
grep -q "^to run it: .* --partition [0-9,]*$" "$tmp/deep.out" || fail "deep: no --partition"
# ... which a spec takes as pipeline.partition (batonctl submit --partition sets it): the
# in-process pipeline runs it; a wrong one is refused naming the field.
part="$(sed -n 's/^to run it: .* --partition \([0-9,]*\)$/\1/p' "$tmp/deep.out")"
for p in "$part" "1,1,1"; do
  python3 - "$tmp/deep.json" "$tmp/deep_$p.json" "$p" <<'PY' || fail "deep spec with a split"
import json, sys
spec = json.load(open(sys.argv[1]))
spec["pipeline"] = {"schedule": "SCHEDULE_1F1B", "stages": 4, "microbatches": 8,
                    "partition": [int(x) for x in sys.argv[3].split(",")]}
spec["steps"] = 1
json.dump(spec, open(sys.argv[2], "w"))
PY
done
"$BATONCTL" train-local -f "$tmp/deep_$part.json" --pipeline >"$tmp/deep_train.out" 2>&1 ||
  fail "train-local with partition $part: $(cat "$tmp/deep_train.out")"
rc=0
"$BATONCTL" train-local -f "$tmp/deep_1,1,1.json" --pipeline >"$tmp/deep_bad.out" 2>&1 || rc=$?
[[ "$rc" != 0 ]] && grep -qF "pipeline.partition: 3 entries for 4 pipeline chunks" \
  "$tmp/deep_bad.out" || fail "train-local with partition 1,1,1: $(cat "$tmp/deep_bad.out")"
expect_refusal auto_workers "--workers 3 does not split into 2 data-parallel replicas" \
  --auto -f "$EXAMPLES/gpt.json" --workers 3 --data-parallel 2
expect_refusal auto_file "--auto needs -f SPEC.json" --auto --workers 2
expect_refusal auto_only "--workers needs --auto" -f "$EXAMPLES/gpt.json" --workers 2
expect_refusal auto_stages "pipeline.stages: 9 stages for a model of 4 blocks" \
  --auto -f "$EXAMPLES/gpt.json" --workers 9
echo "auto-planner ok"
echo "PASS"
