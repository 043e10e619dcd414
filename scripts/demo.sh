#!/usr/bin/env bash
# The cluster demo. Installs what is missing and builds the three programs it runs
# (coordinator, worker, batonctl; --local: batonctl only), then, on loopback:
# prepares BPE token shards of the GNU licence texts (GPL, LGPL, GFDL) (scripts/prepare-data.py: a byte-level BPE of
# 512 tokens, llm.c shards with a validation split, under the workers' data root
# $BIN/data/gpl-bpe), starts a coordinator and 4 workers on free ports, submits the example
# GPT job on those tokens (client/examples/gpt2-gpl-bpe.json, 4 stages, 1F1B, evaluation
# every 50 steps), watches it to the end, and checks that the job's weights digest equals
# the single-process reference trainer's. When the tokenizer's venv cannot be made (no
# PyPI), it says so loudly and trains the character-level client/examples/gpt.json
# instead. Everything it started is stopped on exit, also on Ctrl-C. Exits 0 only if the
# job succeeded and the digests match.
#
#   scripts/demo.sh [--steps N] [--seed S]    the cluster demo (overrides go to the job and
#                                             to the reference run alike)
#   scripts/demo.sh --chaos [--steps N]       the same job with checkpoints and restart:
#                                             a worker is killed (SIGKILL) mid-job, the job
#                                             recovers on the 3 left from its last
#                                             checkpoint, and the digest still matches
#   scripts/demo.sh --secure [--steps N]      the same job over mutual TLS with tokens: a
#                                             throwaway CA and certificates
#                                             (scripts/make-certs.sh), a token file with a
#                                             submitter and a viewer, a join token; shows
#                                             that calls without them are refused
#   scripts/demo.sh --data-parallel [--steps N]
#                                             the same job as 2 replicas of a 2-stage
#                                             pipeline on the 4 workers (gradients summed
#                                             over Gloo); the reference trainer runs the
#                                             same 2-replica grouping
#   scripts/demo.sh --serve [...]             any of the above, then keeps the cluster up
#                                             (coordinator on 127.0.0.1:7070, batonctl's
#                                             and the Python client's default) until
#                                             Ctrl-C, for batonctl and docs/python.md
#   scripts/demo.sh --local [ARGS...]         the reference trainer only (the old demo);
#                                             ARGS go to `batonctl train-local`
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

section() { printf '\n==== %s ====\n' "$*"; }
die() { echo "demo: $*" >&2; exit 1; }

SPEC=client/examples/gpt.json
NUM_WORKERS=4
SCHEDULE=1f1b

local_only=0
chaos=0
secure=0
data_parallel=0
serve=0
overrides=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --local) local_only=1; shift; break ;;
    --chaos) chaos=1; shift ;;
    --secure) secure=1; shift ;;
    --data-parallel) data_parallel=1; shift ;;
    --serve) serve=1; shift ;;
    --steps | --seed)
      [[ $# -ge 2 ]] || die "$1 needs a value"
      overrides+=("$1" "$2"); shift 2 ;;
    -h | --help)
      awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown argument '$1' (see scripts/demo.sh --help)" ;;
  esac
done

section "setup"
scripts/setup.sh --demo  # the demo's packages only; scripts/test.sh installs the rest

# The build: only what the demo runs, not the tests, benchmarks and tools of
# scripts/test.sh (about 240 targets), and never the CUDA kernels. The demo trains on the
# CPU, on any machine: built without CUDA, its job's device (auto) is the CPU on a GPU host
# too, and the reference run matches. A CUDA build would compile the kernels for 3 GPU
# architectures into every program (baton_core links them), for nothing here. So where
# nvcc is found (CMake's BATON_WITH_CUDA=AUTO would turn CUDA on in build/), the demo
# builds in build-nocuda/ with the very arguments scripts/test.sh gives its own CPU-only
# build there: the objects serve both, and build/ keeps CUDA for the tests. Without nvcc
# (a fresh Debian machine) build/ is CPU-only anyway and is the one scripts/test.sh builds.
BUILD_DIR=build
if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc || -n "${CUDACXX:-}" ]]; then
  BUILD_DIR=build-nocuda
  export BATON_CMAKE_ARGS="-DBATON_WITH_CUDA=OFF -DBATON_BUILD_BENCH=OFF"
fi
BIN="$BUILD_DIR/bin"
targets=(coordinator worker batonctl)
[[ $local_only -eq 1 ]] && targets=(batonctl)
section "build: ${targets[*]} in $BUILD_DIR/"
BATON_BUILD_DIR="$BUILD_DIR" scripts/build.sh "${targets[@]}"

if [[ $local_only -eq 1 ]]; then
  section "reference trainer: $SPEC"
  exec "$BIN/batonctl" train-local -f "$SPEC" "$@"
fi

for b in coordinator worker batonctl; do
  [[ -x "$BIN/$b" ]] || die "$BIN/$b was not built"
done

tmp="$(mktemp -d -t baton-demo.XXXXXX)"
pids=()
names=()
fg_pid=""
ok=0
interrupted=0

# Stops every process this script started (SIGTERM, then SIGKILL after 10 s), waits for
# them, and removes the temp dir; on failure first shows the tail of each service log.
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  if [[ -n "$fg_pid" ]]; then
    kill -TERM "$fg_pid" 2>/dev/null
    wait "$fg_pid" 2>/dev/null
  fi
  if [[ -n "${chaos_pid:-}" ]]; then
    kill -TERM "$chaos_pid" 2>/dev/null
    wait "$chaos_pid" 2>/dev/null
  fi
  if [[ ${#pids[@]} -gt 0 ]]; then
    section "shutting down"
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    for _ in $(seq 100); do
      local alive=0
      for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
      [[ $alive -eq 0 ]] && break
      sleep 0.1
    done
    for i in "${!pids[@]}"; do
      if kill -0 "${pids[$i]}" 2>/dev/null; then
        echo "${names[$i]} did not stop on SIGTERM; killing it"
        kill -KILL "${pids[$i]}" 2>/dev/null
      fi
      wait "${pids[$i]}" 2>/dev/null
    done
    echo "stopped the coordinator and ${NUM_WORKERS} workers"
  fi
  if [[ $ok -ne 1 && $interrupted -ne 1 ]]; then
    for log in "$tmp"/*.log; do
      [[ -f "$log" ]] || continue
      echo "--- last lines of $(basename "$log") ---"
      tail -n 15 "$log"
    done
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'echo; echo "demo: interrupted"; interrupted=1; exit 130' INT
trap 'echo; echo "demo: terminated"; interrupted=1; exit 143' TERM

# start NAME COMMAND...: runs a service in the background, logging to $tmp/NAME.log.
start() {
  local name="$1"; shift
  "$@" >"$tmp/$name.log" 2>&1 &
  pids+=("$!")
  names+=("$name")
}

# run COMMAND...: runs it as if in the foreground, but in the background and waited for,
# so that a signal to this script (Ctrl-C, kill) is handled at once, not when it ends.
run() {
  "$@" &
  fg_pid=$!
  local rc=0
  wait "$fg_pid" || rc=$?
  fg_pid=""
  return "$rc"
}

# wait_port_file NAME FILE: waits (at most 30 s) until the service wrote its address.
wait_port_file() {
  local name="$1" file="$2" pid="${pids[-1]}"
  for _ in $(seq 300); do
    if [[ -s "$file" ]]; then
      cat "$file"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || die "$name exited before listening"
    sleep 0.1
  done
  die "$name did not write $file within 30 s"
}

# Real BPE tokens: a small byte-level BPE trained on the GNU licence texts (GPL, LGPL, GFDL), written as llm.c
# shards (train_*.bin and a 10% validation split, val_*.bin) under the workers' default data
# root (data/ beside their binary), which the spec names relative to it. The tokenizer runs
# in a small venv outside the clone (scripts/data-venv.sh: Hugging Face tokenizers only).
section "data: BPE tokens of the GNU licence texts in $BIN/data/gpl-bpe"
DATA_DIR="$BIN/data/gpl-bpe"
bpe=0
if data_venv="$(scripts/data-venv.sh)" &&
  "$data_venv/bin/python" scripts/prepare-data.py --vocab-size 512 --context 64 \
    -o "$DATA_DIR" /usr/share/common-licenses/{GPL-1,GPL-2,GPL-3,LGPL-2,LGPL-2.1,LGPL-3,GFDL-1.2,GFDL-1.3}; then
  SPEC=client/examples/gpt2-gpl-bpe.json
  bpe=1
else
  echo "demo: !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
  echo "demo: !!! could not prepare BPE tokens (the tokenizers venv needs PyPI once):" >&2
  echo "demo: !!! FALLING BACK to the character-level job $SPEC" >&2
  echo "demo: !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
fi

coordinator_security=()
worker_security=()  # plus each worker's own certificate, below
if [[ $secure -eq 1 ]]; then
  section "security: a throwaway CA, certificates, tokens and a join token in $tmp/tls"
  scripts/make-certs.sh "$tmp/tls" "$NUM_WORKERS"
  submitter_token="$(openssl rand -hex 16)"
  viewer_token="$(openssl rand -hex 16)"
  printf '%s demo submitter\n%s watcher viewer\n' "$submitter_token" "$viewer_token" \
    >"$tmp/tls/tokens"
  openssl rand -hex 16 >"$tmp/tls/join-token"
  chmod 600 "$tmp/tls/tokens" "$tmp/tls/join-token"
  echo "tokens: demo (submitter), watcher (viewer); workers join with certificates and the join token"
  coordinator_security=(--tls_cert "$tmp/tls/coordinator.pem" --tls_key "$tmp/tls/coordinator.key"
    --tls_ca "$tmp/tls/ca.pem" --auth_tokens "$tmp/tls/tokens"
    --join_token_file "$tmp/tls/join-token")
  worker_security=(--tls_ca "$tmp/tls/ca.pem" --join_token_file "$tmp/tls/join-token")
  export BATON_TLS_CA="$tmp/tls/ca.pem" BATON_TOKEN="$submitter_token"
fi

section "cluster: a coordinator and ${NUM_WORKERS} workers on loopback"
listen=127.0.0.1:0
[[ $serve -eq 1 ]] && listen=127.0.0.1:7070
start coordinator "$BIN/coordinator" --listen "$listen" --db "$tmp/baton.db" \
  --port_file "$tmp/coordinator.port" --metrics_listen 127.0.0.1:0 --checkpoint_root "$tmp" \
  --metrics_port_file "$tmp/coordinator.metrics" ${coordinator_security[@]+"${coordinator_security[@]}"}
coordinator="$(wait_port_file coordinator "$tmp/coordinator.port")"
echo "coordinator listening on $coordinator, metrics at http://$(wait_port_file coordinator "$tmp/coordinator.metrics")/metrics"
export BATON_COORDINATOR="$coordinator"

for i in $(seq "$NUM_WORKERS"); do
  own=()
  if [[ $secure -eq 1 ]]; then
    own=("${worker_security[@]}" --tls_cert "$tmp/tls/worker-$((i - 1)).pem"
      --tls_key "$tmp/tls/worker-$((i - 1)).key")
  fi
  start "worker-$i" "$BIN/worker" --coordinator "$coordinator" --listen 127.0.0.1:0 \
    --worker_id "w-$i" --port_file "$tmp/worker-$i.port" --checkpoint_root "$tmp" \
    --metrics_port_file "$tmp/worker-$i.metrics" ${own[@]+"${own[@]}"}
  worker_addr="$(wait_port_file "worker w-$i" "$tmp/worker-$i.port")"
  echo "worker w-$i listening on $worker_addr, metrics at http://$(wait_port_file "worker w-$i" "$tmp/worker-$i.metrics")/metrics"
done

# Registration is asynchronous: wait (at most 30 s) until every worker is IDLE.
idle=0
for _ in $(seq 300); do
  idle="$("$BIN/batonctl" workers --output json 2>/dev/null | python3 -c '
import json, sys
print(sum(w.get("state") == "WORKER_STATE_IDLE" for w in json.load(sys.stdin).get("workers", [])))
' 2>/dev/null || echo 0)"
  [[ "$idle" -ge "$NUM_WORKERS" ]] && break
  sleep 0.1
done
[[ "$idle" -ge "$NUM_WORKERS" ]] || die "only $idle of $NUM_WORKERS workers registered within 30 s"
"$BIN/batonctl" workers

if [[ $secure -eq 1 ]]; then
  section "security: what is refused"
  # expect_refused CODE DESCRIPTION COMMAND...: the command must fail naming CODE.
  expect_refused() {
    local code="$1" what="$2"; shift 2
    local out
    if out="$("$@" 2>&1)"; then die "$what was accepted"; fi
    grep -q "$code" <<<"$out" || die "$what failed without $code: $out"
    echo "refused as it should be: $what -> $(grep -o "$code.*" <<<"$out" | head -1)"
  }
  expect_refused UNAUTHENTICATED "listing jobs without a token" \
    env -u BATON_TOKEN "$BIN/batonctl" list
  expect_refused PERMISSION_DENIED "submitting with the viewer's token" \
    env BATON_TOKEN="$viewer_token" "$BIN/batonctl" submit -f "$SPEC" --steps 1
  expect_refused "cannot reach\|UNAVAILABLE" "listing jobs over plaintext" \
    env -u BATON_TLS_CA "$BIN/batonctl" list --timeout 3s
fi

job_spec="$SPEC"
if [[ $chaos -eq 1 ]]; then
  # Checkpoints every 20 steps and up to 2 automatic recoveries, down to 3 stages.
  job_spec="$tmp/chaos.json"
  python3 - "$SPEC" "$tmp/ckpt" "$job_spec" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["checkpoint"] = {"everySteps": 20, "dir": sys.argv[2], "keep": 2}
spec["restart"] = {"maxRestarts": 2, "minStages": 3}
json.dump(spec, open(sys.argv[3], "w"), indent=2)
PY
fi
stages="$NUM_WORKERS"
if [[ $data_parallel -eq 1 ]]; then
  # Two replicas of a two-stage pipeline; the spec carries it, so the reference trainer
  # below trains the same grouping.
  [[ $chaos -eq 0 ]] || die "--data-parallel and --chaos do not go together (no checkpoints with replicas yet)"
  stages=$((NUM_WORKERS / 2))
  job_spec="$tmp/data-parallel.json"
  python3 - "$SPEC" "$stages" "$job_spec" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["pipeline"]["stages"] = int(sys.argv[2])
spec["pipeline"]["dataParallel"] = 2
json.dump(spec, open(sys.argv[3], "w"), indent=2)
PY
  SPEC="$job_spec"
fi
section "job: $SPEC, schedule $SCHEDULE, ${stages} stages${overrides[*]:+ (${overrides[*]})}"
[[ $data_parallel -eq 1 ]] && echo "data parallel: 2 replicas x ${stages} stages on ${NUM_WORKERS} workers"
[[ $chaos -eq 1 ]] && echo "chaos: checkpoint every 20 steps, restart {maxRestarts 2, minStages 3}; worker w-2 will be killed"
job="$("$BIN/batonctl" submit -f "$job_spec" --schedule "$SCHEDULE" --stages "$stages" \
  ${overrides[@]+"${overrides[@]}"})"
echo "submitted $job"
job_start=$SECONDS
if [[ $chaos -eq 1 ]]; then
  # The chaos monkey: once the job has a complete checkpoint, SIGKILL the worker running
  # rank 1. Bounded: it gives up after 10 minutes.
  victim_pid=""
  for i in "${!names[@]}"; do [[ "${names[$i]}" == worker-2 ]] && victim_pid="${pids[$i]}"; done
  (
    for _ in $(seq 6000); do
      n="$("$BIN/batonctl" get "$job" --output json 2>/dev/null | python3 -c '
import json, sys
j = json.load(sys.stdin)
print(len(j.get("checkpoints", {}).get("complete", [])) if j["state"] == "JOB_STATE_RUNNING" else -1)
' 2>/dev/null || echo 0)"
      if [[ "$n" -ge 1 ]]; then
        echo ">>> chaos: killing worker w-2 (pid $victim_pid) with SIGKILL"
        kill -9 "$victim_pid"
        exit 0
      fi
      [[ "$n" -lt 0 ]] && exit 0
      sleep 0.1
    done
  ) &
  chaos_pid=$!
fi
watch_rc=0
run "$BIN/batonctl" watch "$job" || watch_rc=$?
[[ $chaos -eq 1 ]] && wait "$chaos_pid" 2>/dev/null || true
job_seconds=$((SECONDS - job_start))
"$BIN/batonctl" get "$job" --output json >"$tmp/job.json"
# The last step's measured timeline, to open in https://ui.perfetto.dev beside the
# predicted one from `batonctl plan --output svg`.
mkdir -p build
"$BIN/batonctl" trace "$job" -o build/demo-trace.json || echo "demo: no trace (see above)"

# The reference runs after the cluster job, not beside it: the machine may have only a
# couple of cores, and running both at once would slow the job and hide its real timing.
section "reference: batonctl train-local on the same spec"
echo "training the same job in this process (about as long as the cluster took)..."
ref_spec="$SPEC"
if [[ $bpe -eq 1 ]]; then
  # train-local reads files as named (it has no data roots): the same shards, by absolute path.
  # It keeps its final weights as a checkpoint (the same bits as the job's) for the sample.
  ref_spec="$tmp/reference-spec.json"
  python3 - "$SPEC" "$BIN/data" "$ref_spec" "$tmp/reference-ckpt" <<'PY'
import json, os, sys
spec = json.load(open(sys.argv[1]))
root = os.path.abspath(sys.argv[2])
tokens = spec["data"]["tokens"]
for split in ("train", "val"):
    tokens[split] = [os.path.join(root, p) for p in tokens.get(split, [])]
spec["checkpoint"] = {"everySteps": 1000000, "dir": sys.argv[4], "keep": 1}  # the last step's
json.dump(spec, open(sys.argv[3], "w"), indent=2)
PY
fi
ref_start=$SECONDS
run "$BIN/batonctl" train-local -f "$ref_spec" ${overrides[@]+"${overrides[@]}"} --output json \
  >"$tmp/reference.json"
ref_seconds=$((SECONDS - ref_start))

section "result"
verdict=0
python3 - "$tmp/job.json" "$tmp/reference.json" "$job_seconds" "$ref_seconds" <<'PY' || verdict=$?
import json, sys
job = json.load(open(sys.argv[1]))
ref = json.load(open(sys.argv[2]))
state = job["state"].removeprefix("JOB_STATE_")
reason = job["history"][-1]["reason"] if job.get("history") else ""
ref_loss = ref["steps"][-1]["loss"] if ref.get("steps") else float("nan")
print(f"job {job['id']}: {state}{': ' + reason if reason and state != 'SUCCEEDED' else ''}"
      f" after {job.get('steps_done', 0)}/{job['spec'].get('steps')} steps"
      f" in {sys.argv[3]} s on workers {' '.join(job.get('workers', []))}")
print(f"final loss:        job {job.get('last_loss', 0):.4f}   reference {ref_loss:.4f}"
      f" (reference took {sys.argv[4]} s)")
for r in job.get("recoveries", []):
    print(f"recovery:          {r['reason']}")
    print(f"                   resumed from step {r.get('from_step', 0)} "
          f"({r.get('lost_steps', 0)} steps trained again), {r.get('stages_before')} -> "
          f"{r.get('stages_after')} stages on {' '.join(r.get('workers_after', []))}")
print(f"job digest:        {job.get('weights_digest') or '(none)'}")
print(f"reference digest:  {ref['weights_digest']}")
if state != "SUCCEEDED":
    print("RESULT: the job did not succeed")
    sys.exit(1)
if job.get("weights_digest") != ref["weights_digest"]:
    print("RESULT: MISMATCH: the pipeline's weights differ from the reference trainer's")
    sys.exit(1)
print("RESULT: the job succeeded and its weights equal the reference trainer's, bit for bit")
PY
if [[ $watch_rc -ne 0 || $verdict -ne 0 ]]; then
  exit 1
fi
if [[ $bpe -eq 1 && -f "$DATA_DIR/tokenizer.json" ]]; then
  # What the model learned, as nanoGPT's sample.py shows it (docs/models.md, "Samples").
  section "a sample from the trained weights (batonctl sample, seed 42)"
  "$BIN/batonctl" sample --from "$tmp/reference-ckpt/local" --spec "$ref_spec" \
    --tokenizer "$DATA_DIR/tokenizer.json" --prompt "The GNU General Public License" \
    --tokens 48 --seed 42 || echo "demo: no sample (see above)"
fi
ok=1

if [[ $serve -eq 1 ]]; then
  section "serving until Ctrl-C"
  echo "the cluster stays up: batonctl and the Python client (docs/python.md) reach it with"
  echo "  export BATON_COORDINATOR=$coordinator${BATON_TLS_CA:+ BATON_TLS_CA=$BATON_TLS_CA BATON_TOKEN=$BATON_TOKEN}"
  echo "  pip install ./client/python"
  trap 'echo; echo "demo: stopping the cluster"; exit 0' INT TERM
  # Until interrupted, or until the coordinator exits.
  while kill -0 "${pids[0]}" 2>/dev/null; do
    sleep 1 &
    wait $! || true
  done
  echo "demo: the coordinator exited"
  exit 1
fi
