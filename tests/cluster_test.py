#!/usr/bin/env python3
"""End to end: a coordinator and workers on loopback, driven through `batonctl`.

Real processes on free ports (each service writes its address to a --port_file), every
wait bounded, every process stopped at the end (and killed with this script if it dies:
PR_SET_PDEATHSIG). Jobs are tiny so the whole test runs in a few minutes on 2 cores.

Cases (the issue's "done means"):
  1. GPipe, 1F1B, interleaved 1F1B (2 stages x 2 chunks) and ZB-H1 jobs end with the
     same weights digest as `batonctl train-local` on the same spec, for the GPT (tied and
     untied) and the LLaMA (tied and untied); submit --watch and watch in text and JSON.
  2. A job needing more workers than are idle stays QUEUED, with a reason, and runs and
     succeeds once enough workers register.
  3. Cancelling a running job: CANCELLED when cancel returns (its history: RUNNING, then
     CANCELLED with the reason given), its workers IDLE again, and the next job runs.
  4. Malformed or impossible specs are refused with INVALID_ARGUMENT naming the field; an
     unknown job id gives NOT_FOUND; the coordinator serves on afterwards.
  6. Restarting the coordinator (SIGTERM, start again on the same --db) keeps the job
     history; the workers register again.
  5. SIGKILL of a worker mid-job fails the job (its lease: 2 s, heartbeats every 0.5 s;
     or a neighbour's transport) with a reason naming the worker; the dead worker is no
     longer offered, the other workers are IDLE again.
  7. SIGTERM of a worker mid-job (how Kubernetes and compose stop it): the worker exits 0
     within a 30 s grace period, the job fails saying it shut down, the others are IDLE.
  8. A job asking for device cuda on a cluster without GPU workers stays QUEUED, and submit
     says why; an "auto" job runs on the CPU, its history and `batonctl get` say so.
  History: `batonctl history JOB --csv` of a finished job (case 1's 1F1B job) has a row for
     every step 1..N, the last one's loss being the job's last_loss as `batonctl get` shows
     it; after the coordinator's restart (case 6) the histories are still there.

usage: cluster_test.py --bin-dir build/bin --examples client/examples [--keep]
"""

import argparse
import ctypes
import json
import os
import queue
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

LEASE_TTL_S = 2.0
HEARTBEAT_S = 0.5
# Bounds on waits that only catch a hang. The cases check what happened (states in the
# job's history, recorded reasons, the answers of the actions), never how fast: on a
# loaded 2-core machine (CI beside CPU hogs) a lost worker may be noticed, a job placed or
# a worker registered many seconds later than on an idle one.
HANG_S = 120.0

TEXT = ("the quick brown fox jumps over the lazy dog, and then the dog sleeps. " * 12)


class Failure(Exception):
    pass


def check(cond, message):
    if not cond:
        raise Failure(message)


def wait_for(predicate, timeout, what, interval=0.1):
    """Polls predicate() until it returns a true value; Failure after `timeout` s."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise Failure(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def _die_with_parent():
    # Children get SIGKILL if this process dies (e.g. killed by ctest's timeout).
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


# The same through util-linux's setpriv where it is (Debian's is): no Python code runs in the
# child between fork and exec, which a process with gRPC threads of its own (the Python
# client's tests) cannot afford.
_DIE_WITH_PARENT = (["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv")
                    else [])


def tiny_gpt(name, steps=40, microbatches=4, heads=2, **pipeline):
    spec = {
        "name": name,
        "model": {"gpt": {"vocabSize": 40, "context": 16, "dModel": 32, "heads": heads,
                          "layers": 3}},
        "data": {"text": {"inlineText": TEXT}, "batchSize": 8},
        "pipeline": {"microbatches": microbatches, **pipeline},
        "optimizer": {"adamw": {"learningRate": 0.003}},
        "steps": steps,
        "seed": 7,
    }
    return spec


def tiny_llama(name, steps=40, microbatches=4, tied=True, **pipeline):
    """A LLaMA with grouped-query attention (4 query heads on 2 key/value heads)."""
    spec = tiny_gpt(name, steps=steps, microbatches=microbatches, **pipeline)
    spec["model"] = {"llama": {"vocabSize": 40, "context": 16, "dModel": 32, "heads": 4,
                               "kvHeads": 2, "layers": 3, "intermediateSize": 48,
                               "tieEmbeddings": tied}}
    return spec


class Cluster:
    def __init__(self, bin_dir, examples, tmp):
        self.bin_dir = bin_dir
        self.examples = examples
        self.tmp = tmp
        self.batonctl = os.path.join(bin_dir, "batonctl")
        self.procs = {}  # name -> Popen
        self.logs = {}  # name -> path
        self.address = None  # coordinator host:port
        self.db = os.path.join(tmp, "baton.db")
        self.reference_cache = {}
        self.worker_addresses = {}  # worker id -> host:port
        self.spec_count = 0
        # Extra flags (TLS, tokens) for the coordinator and each worker, and environment
        # for batonctl ($BATON_TLS_CA, $BATON_TOKEN).
        self.coordinator_flags = []
        self.worker_flags = lambda worker_id: []
        self.env = {}

    def data_root(self):
        """A directory for the jobs' data files (token shards), one of the coordinator's and
        every worker's data roots (data_roots_flag)."""
        path = os.path.join(self.tmp, "data")
        os.makedirs(path, exist_ok=True)
        return path

    def data_roots_flag(self):
        """--data_root: data_root() and the default roots (data/ beside the binaries,
        /usr/share/common-licenses, which the examples read)."""
        return ",".join([self.data_root(), os.path.join(self.bin_dir, "data"),
                         "/usr/share/common-licenses"])

    # ---- processes -----------------------------------------------------------------

    def _start(self, name, argv, port_file, what):
        if os.path.exists(port_file):
            os.unlink(port_file)
        log = os.path.join(self.tmp, f"{name}.log")
        self.logs[name] = log
        with open(log, "ab") as out:
            out.write(f"==== {' '.join(argv)}\n".encode())
            out.flush()
            proc = subprocess.Popen(_DIE_WITH_PARENT + argv, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=None if _DIE_WITH_PARENT else _die_with_parent)
        self.procs[name] = proc

        def ready():
            if proc.poll() is not None:
                raise Failure(f"{name} exited with status {proc.returncode} before "
                              f"listening:\n{self.tail(name)}")
            try:
                with open(port_file) as f:
                    text = f.read().strip()
            except FileNotFoundError:
                return None
            return text if text.count(":") >= 1 and text.rsplit(":", 1)[1].isdigit() else None

        address = wait_for(ready, 60, f"{what} to write {port_file}")
        return address

    def start_coordinator(self, listen="127.0.0.1:0"):
        argv = [os.path.join(self.bin_dir, "coordinator"), "--listen", listen, "--db", self.db,
                "--metrics_listen", "127.0.0.1:0",
                "--port_file", os.path.join(self.tmp, "coordinator.port"),
                "--heartbeat_interval", f"{HEARTBEAT_S}s", "--lease_ttl", f"{LEASE_TTL_S:g}s",
                "--checkpoint_root", self.tmp, "--data_root", self.data_roots_flag(),
                # Jobs here are short: a job may be preempted as soon as it trained a step
                # (tests of the protection after a start or resume set their own).
                "--preempt_min_run", "0s", *self.coordinator_flags]
        self.address = self._start("coordinator", argv,
                                   os.path.join(self.tmp, "coordinator.port"), "the coordinator")
        print(f"  coordinator listening on {self.address}")
        return self.address

    def start_worker(self, worker_id):
        port_file = os.path.join(self.tmp, f"{worker_id}.port")
        argv = [os.path.join(self.bin_dir, "worker"), "--coordinator", self.address,
                "--listen", "127.0.0.1:0", "--worker_id", worker_id, "--port_file", port_file,
                "--checkpoint_root", self.tmp, "--data_root", self.data_roots_flag(),
                *self.worker_flags(worker_id)]
        address = self._start(worker_id, argv, port_file, f"worker {worker_id}")
        self.worker_addresses[worker_id] = address
        print(f"  worker {worker_id} listening on {address}")
        return address

    def stop(self, name, sig=signal.SIGTERM, timeout=15):
        """Sends `sig` and waits (bounded) for the process; returns its exit status."""
        proc = self.procs.get(name)
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
                raise Failure(f"{name} did not exit within {timeout} s of {sig.name}")
        del self.procs[name]
        return proc.returncode

    def stop_all(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for name, proc in list(self.procs.items()):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"  {name} ignored SIGTERM; killing it")
                proc.kill()
                proc.wait(timeout=10)
        self.procs.clear()

    def tail(self, name, lines=20):
        try:
            with open(self.logs[name], errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except (KeyError, OSError):
            return "(no log)"

    # ---- batonctl ------------------------------------------------------------------

    def ctl(self, *args, timeout=30):
        """Runs batonctl with BATON_COORDINATOR set; returns the CompletedProcess."""
        env = dict(os.environ, BATON_COORDINATOR=self.address or "", **self.env)
        try:
            return subprocess.run([self.batonctl, *args], env=env, capture_output=True,
                                  text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise Failure(f"batonctl {' '.join(args)} did not finish within {timeout} s")

    def ctl_ok(self, *args, timeout=30):
        r = self.ctl(*args, timeout=timeout)
        check(r.returncode == 0, f"batonctl {' '.join(args)} exited {r.returncode}: "
                                 f"{r.stderr.strip()}")
        return r

    def ctl_json(self, *args, timeout=30):
        r = self.ctl_ok(*args, "--output", "json", timeout=timeout)
        try:
            return json.loads(r.stdout)
        except json.JSONDecodeError as e:
            raise Failure(f"batonctl {' '.join(args)} --output json printed no JSON ({e}): "
                          f"{r.stdout[:500]}")

    def get(self, job_id):
        return self.ctl_json("get", job_id)

    def workers(self):
        return self.ctl_json("workers").get("workers", [])

    def idle_workers(self):
        return sorted(w["worker_id"] for w in self.workers()
                      if w.get("state") == "WORKER_STATE_IDLE")

    def wait_idle(self, count, timeout=60, ids=None):
        """Waits until `count` workers (or all of `ids`) are IDLE; returns the idle ids."""
        def enough():
            idle = self.idle_workers()
            if ids is not None:
                return idle if set(ids) <= set(idle) else None
            return idle if len(idle) >= count else None
        try:
            return wait_for(enough, timeout, f"{sorted(ids) if ids else count} idle workers",
                            interval=0.2)
        except Failure as e:
            raise Failure(f"{e} (workers now: {self.describe_workers()})")

    def ensure_workers(self, count):
        """Starts (again) any of w-1 .. w-count that is not running; waits for them IDLE, a
        restarted one as its new process (until its old entry's lease runs out, the
        coordinator may still list the old one, at the old address, as IDLE)."""
        ids = [f"w-{i}" for i in range(1, count + 1)]
        started = {}
        for w in ids:
            proc = self.procs.get(w)
            if proc is None or proc.poll() is not None:
                self.procs.pop(w, None)
                started[w] = self.start_worker(w)

        def registered():
            at = {w["worker_id"]: w.get("address") for w in self.workers()
                  if w.get("state") == "WORKER_STATE_IDLE"}
            return all(at.get(w) == a for w, a in started.items())
        wait_for(registered, 60, f"{', '.join(started) or 'no worker'} to register anew")
        return self.wait_idle(count, ids=ids)

    def describe_workers(self):
        return ", ".join(f"{w['worker_id']}={w.get('state', '?').removeprefix('WORKER_STATE_')}"
                         for w in self.workers())

    def write_spec(self, spec):
        self.spec_count += 1
        path = os.path.join(self.tmp, f"spec-{self.spec_count}-{spec.get('name', 'job')}.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        return path

    def submit(self, spec_path, *flags):
        job = self.ctl_json("submit", "-f", spec_path, *flags)
        check(job.get("id"), f"submit returned no job id: {job}")
        return job

    def wait_state(self, job_id, states, timeout):
        states = set(states)

        def reached():
            job = self.get(job_id)
            return job if job["state"] in states else None
        return wait_for(reached, timeout, f"{job_id} to reach {sorted(states)}", interval=0.1)

    def wait_steps(self, job_id, steps, timeout=60):
        """Waits until a running job has done `steps` steps; Failure if it ended first."""
        def done():
            job = self.get(job_id)
            check(job["state"] not in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
                                       "JOB_STATE_CANCELLED"),
                  f"{job_id} ended before {steps} steps: {job['state']}: {last_reason(job)}")
            return job if int(job.get("steps_done", 0)) >= steps else None
        try:
            return wait_for(done, timeout, f"{job_id} to run {steps} steps")
        except Failure as e:
            job = self.get(job_id)
            raise Failure(f"{e}; it is {job['state']} ({last_reason(job)}), "
                          f"{job.get('steps_done')} steps done")

    def reference_digest(self, spec_path, steps=None):
        key = (open(spec_path).read(), steps)
        if key not in self.reference_cache:
            args = ["train-local", "-f", spec_path, "--output", "json"]
            if steps is not None:
                args += ["--steps", str(steps)]
            report = json.loads(self.ctl_ok(*args, timeout=300).stdout)
            self.reference_cache[key] = report
        return self.reference_cache[key]["weights_digest"]

    def reference_kernels(self, spec_path, steps=None):
        """The matrix kernels train-local ran reference_digest's run on."""
        self.reference_digest(spec_path, steps)
        return self.reference_cache[(open(spec_path).read(), steps)]["kernels"]


def run_cases(c, cases, only, args=(), tail_all=False, tail_lines=15):
    """Runs each (number, title, fn) of `cases` (all, or those in `only`) as fn(c, *args),
    printing PASS / FAIL / SKIPPED; a case skips by returning "skipped". On a failure it
    prints the last lines of the coordinator's and every exited process's log (of every
    process with tail_all). Returns (passed, failed, skipped) lists of case numbers."""
    passed, failed, skipped = [], [], []
    for number, title, fn in cases:
        if only and number not in only:
            continue
        print(f"\n[case {number}] {title}")
        start = time.monotonic()
        try:
            if fn(c, *args) == "skipped":
                skipped.append(number)
                print(f"[case {number}] SKIPPED")
            else:
                passed.append(number)
                print(f"[case {number}] PASS ({time.monotonic() - start:.1f} s)")
        except Failure as e:
            failed.append(number)
            print(f"[case {number}] FAIL: {e}")
            for name in list(c.procs):
                code = c.procs[name].poll()
                if tail_all or name == "coordinator" or code is not None:
                    how = "" if code is None else f" (it exited: {exit_words(code)})"
                    print(f"  --- last lines of {name}'s log{how} ---")
                    print("  " + c.tail(name, tail_lines).replace("\n", "\n  "))
        except Exception:  # a bug in the test or an unexpected output
            failed.append(number)
            print(f"[case {number}] FAIL with an exception:\n{traceback.format_exc()}")
    return passed, failed, skipped


def exit_words(code):
    """A Popen return code in words: 'status 1', or 'signal 13 (SIGPIPE)'."""
    if code >= 0:
        return f"status {code}"
    try:
        return f"signal {-code} ({signal.Signals(-code).name})"
    except ValueError:
        return f"signal {-code}"


def last_reason(job):
    history = job.get("history") or []
    return history[-1].get("reason", "") if history else ""


def states_of(job):
    return [h["state"].removeprefix("JOB_STATE_") for h in job.get("history", [])]


def hold_workers(c, count, name="holds-the-workers"):
    """Submits a job of `count` stages that runs until cancelled and returns its id once it
    runs: a job submitted after it waits in the queue, for as long as the caller likes."""
    holder = c.submit(c.write_spec(tiny_gpt(name, steps=1000000, stages=count)))["id"]
    c.wait_steps(holder, 1, timeout=HANG_S)
    return holder


def watch_from_the_queue(c, args, begun, holder, timeout=HANG_S):
    """Runs `batonctl ARGS` (submit --watch) while `holder` (hold_workers) keeps its job in
    the queue; once its output so far satisfies begun(lines) (the watch is open and shows
    the job waiting) cancels the holder, so the watch sees every state and step of the
    job's run, however slowly batonctl starts. Returns the CompletedProcess."""
    env = dict(os.environ, BATON_COORDINATOR=c.address or "", **c.env)
    proc = subprocess.Popen([c.batonctl, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    lines, err, q = [], [], queue.Queue()

    def pump():
        for line in proc.stdout:
            q.put(line)
        q.put(None)
    threading.Thread(target=pump, daemon=True).start()
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    released = False
    try:
        while True:
            try:
                line = q.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise Failure(f"batonctl {' '.join(args)} did not finish within {timeout:.0f} s:"
                              f" {''.join(lines)[-500:]}")
            if line is None:
                break
            lines.append(line)
            if not released and begun(lines):
                c.ctl_ok("cancel", holder, "--reason", "the watched job's turn")
                released = True
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if not released:
            c.ctl("cancel", holder)
    reader.join(timeout=10)
    out = "".join(lines)
    check(released, f"batonctl {' '.join(args)} never showed its job waiting behind "
                    f"{holder}: {out[-500:]} {''.join(err).strip()}")
    return subprocess.CompletedProcess(args, proc.returncode, out, "".join(err))


# ---- cases -----------------------------------------------------------------------------


HISTORY_HEADER = ("step,loss,samples_per_second,tokens_per_second,step_seconds,learning_rate,"
                  "grad_norm,val_loss,model_tflops,mfu")


def float32(x):
    return struct.unpack("f", struct.pack("f", float(x)))[0]


def history_rows(c, job_id):
    """`batonctl history JOB --csv` as a list of rows (lists of strings), header checked."""
    lines = c.ctl_ok("history", job_id, "--csv").stdout.splitlines()
    check(lines and lines[0] == HISTORY_HEADER,
          f"batonctl history {job_id} --csv: the header is {lines[:1]}, not {HISTORY_HEADER}")
    rows = [line.split(",") for line in lines[1:]]
    check(all(len(row) == 10 for row in rows), f"history rows of other than 10 cells: {rows[:3]}")
    return rows


def check_history(c, job):
    """A finished job's history: a row per step 1..N, each with loss and throughput, the
    last one's loss the job's last_loss as `batonctl get` shows it (JSON: the same float;
    text: the same 4 decimals, in the text table too)."""
    job_id, total = job["id"], int(job["spec"]["steps"])
    rows = history_rows(c, job_id)
    steps = [int(row[0]) for row in rows]
    check(steps == list(range(1, total + 1)),
          f"history of {job_id}: steps {steps[:5]}...{steps[-3:]}, want 1..{total}")
    check(all(float(row[2]) > 0 and float(row[3]) > 0 and float(row[4]) > 0 for row in rows),
          f"history of {job_id}: a step without throughput or time: {rows[:3]}")
    # The learning rate every step used, model TFLOP/s and MFU (the CPU workers measured
    # their peak at start).
    check(all(float(row[5]) > 0 and float(row[8]) > 0 and 0 < float(row[9]) < 1 for row in rows),
          f"history of {job_id}: a step without learning rate, TFLOP/s or MFU: {rows[:3]}")
    check(float32(rows[-1][1]) == float32(job["last_loss"]),
          f"history of {job_id}: the last loss {rows[-1][1]} is not last_loss "
          f"{job['last_loss']}")
    got = c.ctl_ok("get", job_id).stdout
    shown = f"step {total}/{total}, loss {float32(job['last_loss']):.4f}"
    check(shown in got, f"batonctl get {job_id} does not show '{shown}':\n{got}")
    table = c.ctl_ok("history", job_id).stdout.splitlines()
    check(table[0].split()[:2] == ["STEP", "LOSS"] and len(table) == total + 1,
          f"batonctl history {job_id}: {table[:2]} ... ({len(table)} lines)")
    last = table[-1].split()
    check(last[0] == str(total) and last[1] == f"{float32(job['last_loss']):.4f}",
          f"batonctl history {job_id}: the last row is {last}, not step {total} with loss "
          f"{float32(job['last_loss']):.4f}")
    print(f"  batonctl history {job_id}: {len(rows)} steps; the last loss, {rows[-1][1]}, is "
          f"the job's")


def case_invalid_specs(c):
    """4. bad specs -> INVALID_ARGUMENT naming the field; unknown id -> NOT_FOUND."""
    def refused(name, expect_code, expect_text, *args):
        r = c.ctl(*args)
        out = r.stderr.strip()
        check(r.returncode == 1, f"{name}: exit status {r.returncode}, want 1 ({out or r.stdout})")
        check(expect_code in out, f"{name}: no {expect_code} in: {out}")
        check(expect_text in out, f"{name}: message does not name '{expect_text}': {out}")
        print(f"  refused {name}: {out}")

    good = c.write_spec(tiny_gpt("good"))
    refused("heads not dividing d_model", "INVALID_ARGUMENT", "model.gpt.heads",
            "submit", "-f", c.write_spec(tiny_gpt("bad-heads", heads=3)))
    refused("batch not divisible by micro-batches", "INVALID_ARGUMENT", "data.batch_size",
            "submit", "-f", good, "--microbatches", "3")
    refused("more pipeline chunks than blocks", "INVALID_ARGUMENT", "pipeline.",
            "submit", "-f", good, "--stages", "4", "--virtual", "2",
            "--schedule", "interleaved-1f1b")
    refused("zero steps", "INVALID_ARGUMENT", "steps", "submit", "-f", good, "--steps", "0")
    bad_mlp = {"model": {"mlp": {"inputDim": 2, "width": 0, "depth": 1, "outputDim": 1}},
               "data": {"synthetic": {}, "batchSize": 8},
               "optimizer": {"sgd": {"learningRate": 0.1}}, "steps": 1}
    refused("zero mlp width", "INVALID_ARGUMENT", "model.mlp.width",
            "submit", "-f", c.write_spec(bad_mlp))
    # Text files only under the data roots (the coordinator's defaults: data/ beside it and
    # /usr/share/common-licenses); the workers check again with theirs.
    shadow = tiny_gpt("reads-shadow")
    shadow["data"]["text"] = {"path": "/etc/shadow"}
    refused("a text file outside the data roots", "INVALID_ARGUMENT",
            "data.text.path: '/etc/shadow' is outside the directories",
            "submit", "-f", c.write_spec(shadow))
    hf_outside = tiny_gpt("hf-outside")
    hf_outside["init"] = {"fromHf": "/etc"}
    refused("a Hugging Face directory outside the data roots", "INVALID_ARGUMENT",
            "init.from_hf: '/etc' is outside the directories",
            "submit", "-f", c.write_spec(hf_outside))
    hf_climbs = tiny_gpt("hf-climbs")
    hf_climbs["init"] = {"fromHf": "models/../../etc"}
    refused("a relative Hugging Face directory that climbs out", "INVALID_ARGUMENT",
            "init.from_hf: 'models/../../etc' climbs out",
            "submit", "-f", c.write_spec(hf_climbs))
    malformed = os.path.join(c.tmp, "malformed.json")
    with open(malformed, "w") as f:
        f.write('{"model": ')
    refused("malformed JSON (refused by batonctl)", "INVALID_ARGUMENT", "malformed.json",
            "submit", "-f", malformed)
    refused("get of an unknown job", "NOT_FOUND", "job-does-not-exist",
            "get", "job-does-not-exist")
    refused("cancel of an unknown job", "NOT_FOUND", "job-does-not-exist",
            "cancel", "job-does-not-exist")
    refused("watch of an unknown job", "NOT_FOUND", "job-does-not-exist",
            "watch", "job-does-not-exist", "--timeout", "20s")
    # Still serving.
    jobs = c.ctl_json("list", "--all").get("jobs", [])
    check(not jobs, f"refused specs left jobs behind: {[j['id'] for j in jobs]}")
    c.ctl_ok("workers")
    r = c.ctl("list", "--coordinator", "127.0.0.1:1")
    check(r.returncode == 1 and "127.0.0.1:1" in r.stderr,
          f"an unreachable coordinator is not named: {r.stderr.strip()}")
    print(f"  unreachable coordinator: {r.stderr.strip()[:160]}")
    print("  the coordinator still serves (list, workers)")
    # A name with a newline cannot forge a log line: it is written escaped.
    forger = tiny_gpt("x\ncoordinator: job-999999 SUCCEEDED: forged", steps=1)
    job = c.wait_state(c.submit(c.write_spec(forger))["id"],
                       ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"], 60)
    log = open(c.logs["coordinator"], errors="replace").read()
    check("\ncoordinator: job-999999" not in log and
          "x\\ncoordinator: job-999999 SUCCEEDED: forged" in log,
          "a job name with a newline forged a coordinator log line")
    c.ctl_ok("cancel", job["id"])
    print("  a job name with a newline is logged escaped, on one line")


def case_queued_until_workers(c):
    """2. too few workers -> QUEUED with a reason; runs when more workers register."""
    c.wait_idle(2)
    spec = c.write_spec(json.load(open(os.path.join(c.examples, "mlp-tiny.json"))))
    job = c.submit(spec, "--steps", "3", "--stages", "4", "--name", "queued-mlp")
    # Once the coordinator tried to place it, its history says why it waits; it never left
    # the queue (no PLACING or RUNNING in its history).
    job = wait_for(lambda: (lambda j: j if "cannot run" in last_reason(j) else None)(
        c.get(job["id"])), HANG_S, f"{job['id']} to say why it waits")
    reason = last_reason(job)
    print(f"  {job['id']} with 2 idle workers: {job['state']} ({reason}); history "
          f"{states_of(job)}")
    check(job["state"] == "JOB_STATE_QUEUED", f"want QUEUED, got {job['state']}")
    check(set(states_of(job)) == {"QUEUED"}, f"it left the queue: {states_of(job)}")
    check("worker" in reason and "4" in reason,
          f"the QUEUED reason does not say it waits for 4 workers: '{reason}'")
    check("cannot run on the workers registered now" in reason,
          f"a 4-stage job on 2 workers should say it cannot run yet: '{reason}'")
    # It holds no one up: a 2-stage job submitted after it runs to the end meanwhile.
    small = c.submit(spec, "--steps", "2", "--stages", "2", "--name", "behind-the-big-one")
    small = c.wait_state(small["id"], TERMINAL, 120)
    check(small["state"] == "JOB_STATE_SUCCEEDED",
          f"the small job behind it: {small['state']} ({last_reason(small)})")
    listing = c.ctl_ok("list").stdout
    row = next((line for line in listing.splitlines() if line.startswith(job["id"])), "")
    check("[#1, priority 0: cannot run on the workers registered now" in row,
          f"batonctl list does not show its place and reason: '{row}'")
    got = c.ctl_ok("get", job["id"]).stdout
    check("queue:      #1" in got, f"batonctl get shows no queue line: {got}")
    print(f"  {small['id']} (2 stages, submitted after it) SUCCEEDED meanwhile; batonctl list: "
          f"{row.split('[', 1)[1][:60]}...")
    c.start_worker("w-3")
    c.start_worker("w-4")
    job = c.wait_state(job["id"], ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
                                   "JOB_STATE_CANCELLED"], 120)
    print(f"  after 2 more workers registered: {job['state']}; history {states_of(job)}")
    check(job["state"] == "JOB_STATE_SUCCEEDED", f"want SUCCEEDED: {last_reason(job)}")
    check("RUNNING" in states_of(job), f"history has no RUNNING: {states_of(job)}")
    want = c.reference_digest(spec, steps=3)
    check(job["weights_digest"] == want,
          f"digest {job['weights_digest']} != train-local's {want}")
    print(f"  digest equals train-local's: {want[:16]}...")


def case_quotas(c):
    """12. quotas (--quotas): a user's queued jobs and held workers are bounded, and SIGHUP
    re-reads the file."""
    c.ensure_workers(4)
    quotas = os.path.join(c.tmp, "quotas.txt")
    with open(quotas, "w") as f:  # without tokens every caller is "anonymous", an admin
        f.write("user anonymous 2 1 -\n")
    port = c.address.rsplit(":", 1)[1]
    check(c.stop("coordinator", signal.SIGTERM) == 0, "the coordinator did not stop cleanly")
    flags = c.coordinator_flags
    c.coordinator_flags = flags + ["--quotas", quotas]
    try:
        c.start_coordinator(listen=f"127.0.0.1:{port}")
        c.wait_idle(4)
        spec = c.write_spec(tiny_gpt("quota-3", steps=200000, stages=3))
        over = c.submit(spec)  # needs 3 workers, the user may hold 2: waits, saying so
        reason = wait_for(lambda: c.get(over["id"]).get("wait_reason"), HANG_S,
                          f"{over['id']} to say why it waits")
        check("may hold 2 workers and this job needs 3 (quota max_workers); it runs once the "
              "quota is raised" in reason,
              f"the over-quota job's reason: '{reason}'")
        r = c.ctl("submit", "-f", spec)  # one queued already: refused
        check(r.returncode != 0 and "quota max_queued 1" in r.stderr,
              f"a second queued job was not refused: rc {r.returncode}, {r.stderr.strip()}")
        print(f"  {over['id']} waits: {reason}; a second submission: {r.stderr.strip()[:90]}")
        # Raise the limit and SIGHUP: the job starts.
        with open(quotas, "w") as f:
            f.write("user anonymous 3 1 -\n")
        c.procs["coordinator"].send_signal(signal.SIGHUP)
        # 200000 steps: it runs until cancelled; its first step says it was placed.
        started = c.wait_steps(over["id"], 1, timeout=HANG_S)
        check(started["state"] == "JOB_STATE_RUNNING" and len(started["workers"]) == 3,
              f"{over['id']}: {started['state']} on {started['workers']}")
        print(f"  after raising max_workers to 3 and SIGHUP: {over['id']} RUNNING on "
              f"{' '.join(started['workers'])}")
        c.ctl_ok("cancel", over["id"])
    finally:
        c.coordinator_flags = flags
        check(c.stop("coordinator", signal.SIGTERM) == 0, "the coordinator did not stop cleanly")
        c.start_coordinator(listen=f"127.0.0.1:{port}")
        c.wait_idle(4)


def case_schedules(c):
    """1. every schedule (and recomputation): job digest == train-local's."""
    c.ensure_workers(4)
    runs = [
        ("gpipe", tiny_gpt("gpt-gpipe"), ["--schedule", "gpipe", "--stages", "4"]),
        ("1f1b", tiny_gpt("gpt-1f1b"), ["--schedule", "1f1b", "--stages", "4"]),
        ("interleaved-1f1b", tiny_gpt("gpt-interleaved"),
         ["--schedule", "interleaved-1f1b", "--stages", "2", "--virtual", "2"]),
        ("zb-h1", tiny_gpt("gpt-zbh1"), ["--schedule", "zb-h1", "--stages", "4"]),
        # The V schedules: two chunks per worker, the first and last stage on one.
        ("zb-v", tiny_gpt("gpt-zbv"), ["--schedule", "zb-v", "--stages", "2"]),
        ("v-half", tiny_gpt("gpt-vhalf"), ["--schedule", "v-half", "--stages", "2"]),
        ("dualpipe-v", tiny_gpt("gpt-dualpipev"), ["--schedule", "dualpipe-v", "--stages", "2"]),
        # SCHEDULE_AUTO in the spec: the coordinator's planner chooses schedule, V and M at
        # placement; train-local resolves the same spec to the same choice (both from FLOPs).
        ("auto", tiny_gpt("gpt-auto", microbatches=0, schedule="SCHEDULE_AUTO", stages=2), []),
        # Recomputation across worker processes: the reference's bits all the same.
        ("1f1b recompute", tiny_gpt("gpt-1f1b-recompute"),
         ["--schedule", "1f1b", "--stages", "4", "--recompute", "full",
          "--recompute-stages", "0,1"]),
        # The gpt above ties its embeddings (GPT-2's default); the old untied one, and the
        # LLaMA family tied (TIE_GRAD between workers 0 and 3, or local on a V) and untied.
        ("1f1b untied", dict(tiny_gpt("gpt-untied"), model={"gpt": dict(
            tiny_gpt("x")["model"]["gpt"], tieEmbeddings=False)}),
         ["--schedule", "1f1b", "--stages", "4"]),
        ("llama 1f1b", tiny_llama("llama-1f1b"), ["--schedule", "1f1b", "--stages", "4"]),
        ("llama zb-v", tiny_llama("llama-zbv"), ["--schedule", "zb-v", "--stages", "2"]),
        ("llama untied", tiny_llama("llama-untied", tied=False),
         ["--schedule", "interleaved-1f1b", "--stages", "2", "--virtual", "2"]),
        # bf16 mixed precision (docs/precision.md): bf16 tensors between worker processes,
        # the reference trainer's bits all the same.
        ("bf16 dualpipe-v", dict(tiny_gpt("gpt-bf16"), precision="PRECISION_BF16"),
         ["--schedule", "dualpipe-v", "--stages", "2", "--precision", "bf16"]),
        # The job's attention kernels (JobSpec.attention) reach every worker: the tiled bf16
        # kernels, as train-local takes them from the same spec.
        ("bf16 tiled attention zb-h1",
         dict(tiny_gpt("gpt-bf16-tiled"), precision="PRECISION_BF16",
              attention="ATTENTION_KERNEL_TILED"),
         ["--schedule", "zb-h1", "--stages", "2", "--attention", "tiled"]),
        ("llama bf16 1f1b", dict(tiny_llama("llama-bf16"), precision="PRECISION_BF16"),
         ["--schedule", "1f1b", "--stages", "4"]),
    ]
    for i, (schedule, spec, flags) in enumerate(runs):
        path = c.write_spec(spec)
        want = c.reference_digest(path)
        start = time.monotonic()
        if i == 0:
            # submit --watch --output json: the Job, then one JobEvent per line. The job
            # waits behind another until the watch is open (its first event, the job's
            # state then: QUEUED), so the watch sees every state and step of the run.
            holder = hold_workers(c, 4)

            def json_watch_begun(out):
                events = [json.loads(line) for line in out[1:] if line.strip()]
                return any(e.get("state_change", {}).get("state") == "JOB_STATE_QUEUED"
                           for e in events)
            r = watch_from_the_queue(c, ["submit", "-f", path, *flags, "--watch", "--output",
                                         "json"], json_watch_begun, holder)
            lines = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
            check(lines and lines[0].get("id"), f"submit --watch printed no Job first: "
                                                f"{r.stdout[:300]}")
            job_id = lines[0]["id"]
            events = lines[1:]
            check(all(e.get("job_id") == job_id for e in events),
                  f"watch events of another job: {events[:3]}")
            seen = [e["state_change"]["state"].removeprefix("JOB_STATE_") for e in events
                    if "state_change" in e]
            steps = [e["step"] for e in events if "step" in e]
            check(seen and seen[0] == "QUEUED" and seen[-1] == "SUCCEEDED" and
                  "RUNNING" in seen and "PLACING" in seen,
                  f"the watch's states are not QUEUED ... PLACING ... RUNNING ... SUCCEEDED: "
                  f"{seen} ({r.stderr.strip()})")
            total = spec["steps"]
            check([int(s["step"]) for s in steps] == list(range(1, total + 1))
                  and all(int(s["total_steps"]) == total for s in steps),
                  f"step events are not 1..{total} of {total}: "
                  f"{[(s.get('step'), s.get('total_steps')) for s in steps][:50]}")
            check(r.returncode == 0, f"submit --watch exited {r.returncode}")
            print(f"  submit --watch --output json: {len(events)} events (states "
                  f"{' '.join(seen)}), {len(steps)} step events, exit 0")
        elif i == 1:
            # submit --watch in text mode, stdout not a terminal: the id, then plain lines
            # (one per step, no carriage returns), the final state and the digest. As above,
            # the job waits behind another until the watch shows it QUEUED.
            holder = hold_workers(c, 4)

            def text_watch_begun(out):
                return len(out) > 1 and any(f"{out[0].strip()} QUEUED" in line
                                            for line in out[1:])
            r = watch_from_the_queue(c, ["submit", "-f", path, *flags, "--watch"],
                                     text_watch_begun, holder)
            check(r.returncode == 0, f"submit --watch exited {r.returncode}: "
                                     f"{r.stdout[-500:]} {r.stderr.strip()}")
            job_id = r.stdout.split("\n", 1)[0].strip()
            total = spec["steps"]
            shown = [int(line.split()[1].split("/")[0]) for line in r.stdout.splitlines()
                     if line.startswith("step ")]
            check(shown == list(range(1, total + 1)),
                  f"watch did not print a line for every step 1..{total}: {shown}")
            check(f"step {total}/{total}  loss " in r.stdout and "samples/s" in r.stdout
                  and "ETA" in r.stdout, f"watch printed no progress lines: {r.stdout}")
            check("\r" not in r.stdout, "watch rewrote lines although stdout is a pipe")
            check(f"weights digest {want}" in r.stdout,
                  f"watch did not end with the digest: {r.stdout[-300:]}")
            print(f"  submit --watch (text, not a terminal): the id, "
                  f"{r.stdout.count(chr(10))} plain lines, the final digest")
            check_history(c, c.get(job_id))
        else:
            job_id = c.submit(path, *flags)["id"]
            r = c.ctl("watch", job_id, timeout=180)
            check(r.returncode == 0, f"watch {job_id} exited {r.returncode}: "
                                     f"{r.stdout[-500:]} {r.stderr.strip()}")
            check(f"weights digest {want}" in r.stdout,
                  f"watch did not end with the digest: {r.stdout[-300:]}")
        job = c.get(job_id)
        seconds = time.monotonic() - start
        check(job["state"] == "JOB_STATE_SUCCEEDED",
              f"{schedule}: {job['state']}: {last_reason(job)}")
        pipeline = job.get("spec", {}).get("pipeline", {})
        print(f"  {schedule:17s} {job_id}: SUCCEEDED in {seconds:4.1f} s on "
              f"{' '.join(job.get('workers', []))} (stages {pipeline.get('stages')}, virtual "
              f"{pipeline.get('virtual_stages')}), digest {job['weights_digest'][:16]}...")
        if schedule == "auto":
            planned = [h["reason"] for h in job.get("history", [])
                       if h.get("reason", "").startswith("auto-planner chose ")]
            check(planned and "model FLOPs" in planned[0],
                  f"auto: no planner entry in the history: {job.get('history')}")
            check(pipeline.get("schedule") not in (None, "SCHEDULE_AUTO"),
                  f"auto: the job's spec kept SCHEDULE_AUTO: {pipeline}")
            print(f"  auto: {planned[0][:110]}...")
        if "recompute" in schedule:
            check(pipeline.get("recompute") == "RECOMPUTE_FULL" and
                  pipeline.get("recompute_stages") == [0, 1],
                  f"the job's spec does not recompute stages 0 and 1: {pipeline}")
        check(job["weights_digest"] == want,
              f"{schedule}: job digest {job['weights_digest']} != train-local's {want}")
    print(f"  all {len(runs)} digests equal train-local's")
    # The last job's measured costs, from the coordinator, predict another schedule on the
    # same partition (batonctl plan --costs-from JOB).
    out = c.ctl_ok("plan", "-f", path, "--schedule", "zb-h1", "--stages", "4",
                   "--costs-from", job_id).stdout
    check(f"costs measured by {job_id} step" in out and "makespan" in out,
          f"plan --costs-from {job_id}:\n{out[:400]}")
    print(f"  plan --costs-from {job_id}: " + out.splitlines()[2].strip())


def case_cancel(c):
    """3. cancel a running job -> CANCELLED when cancel returns, workers IDLE, next job
    runs."""
    ids = c.ensure_workers(4)
    spec = c.write_spec(tiny_gpt("long-gpt", steps=1000000))
    job_id = c.submit(spec, "--schedule", "1f1b", "--stages", "4")["id"]
    c.wait_steps(job_id, 2)
    start = time.monotonic()
    r = c.ctl_ok("cancel", job_id, "--reason", "cluster test")
    print(f"  batonctl cancel: {r.stdout.strip()}")
    # Cancelling is synchronous: the job is CANCELLED when batonctl cancel returns, and its
    # history says it was cancelled while it ran (a million steps: it could not have ended).
    job = c.get(job_id)
    seconds = time.monotonic() - start
    print(f"  {job_id}: {job['state']} {seconds:.1f} s after cancel began ({last_reason(job)}),"
          f" {job.get('steps_done')} steps done; history {states_of(job)}")
    check(job["state"] == "JOB_STATE_CANCELLED", f"want CANCELLED, got {job['state']}")
    states = states_of(job)
    check(len(states) >= 2 and states[-2:] == ["RUNNING", "CANCELLED"]
          and "cluster test" in last_reason(job),
          f"the history does not say a RUNNING job was cancelled for 'cluster test': "
          f"{states} ({last_reason(job)})")
    c.wait_idle(4, ids=ids)
    print(f"  workers IDLE again: {c.describe_workers()}")
    r = c.ctl("watch", job_id, timeout=30)
    check(r.returncode == 1, f"watch of a cancelled job exited {r.returncode}, want 1")
    nxt = c.write_spec(tiny_gpt("after-cancel", steps=3))
    job_id2 = c.submit(nxt, "--schedule", "1f1b", "--stages", "4",
                       "--submission-id", "after-cancel-1")["id"]
    again = c.submit(nxt, "--schedule", "1f1b", "--stages", "4",
                     "--submission-id", "after-cancel-1")["id"]
    check(again == job_id2, f"the same --submission-id gave {again}, then {job_id2}")
    print(f"  submitting again with the same --submission-id returns {job_id2}")
    job2 = c.wait_state(job_id2, ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
                                  "JOB_STATE_CANCELLED"], 120)
    check(job2["state"] == "JOB_STATE_SUCCEEDED", f"the next job: {job2['state']}: "
                                                  f"{last_reason(job2)}")
    check(job2["weights_digest"] == c.reference_digest(nxt), "the next job's digest differs")
    print(f"  the next job {job_id2}: SUCCEEDED, digest equals train-local's")


def case_device(c):
    """8. device placement: a cuda job with no GPU workers waits, saying so; auto runs on
    the CPU and says why."""
    # The workers this case relies on: ensure_workers returns every IDLE worker, which may
    # include one a previous case stopped whose lease has not run out yet.
    c.ensure_workers(2)
    ids = ["w-1", "w-2"]
    kinds = {w["worker_id"]: w.get("device", {}).get("kind") for w in c.workers()}
    if any(k == "cuda" for k in kinds.values()):
        print(f"  skipped: GPU workers present ({kinds}); this case is for CPU-only clusters")
        return
    spec = c.write_spec(tiny_gpt("wants-gpus", steps=3))
    r = c.ctl("submit", "-f", spec, "--stages", "2", "--device", "cuda")
    check(r.returncode == 0, f"submit exited {r.returncode}: {r.stderr.strip()}")
    job_id = r.stdout.strip()
    # No registered worker has a GPU: it cannot run yet, and holds no one up.
    want = ("cannot run on the workers registered now (it needs 2 registered GPU workers (0 "
            "registered; the job asks for device cuda)); it waits for more to register and "
            "holds no one up")
    check(want in r.stderr, f"submit did not say why the job waits: {r.stderr.strip()!r}")
    print(f"  submit: {r.stderr.strip()}")
    job = c.get(job_id)
    check(job["state"] == "JOB_STATE_QUEUED" and last_reason(job) == want,
          f"{job_id}: {job['state']} ({last_reason(job)})")
    c.ctl_ok("cancel", job_id, "--reason", "no GPUs here")
    c.wait_state(job_id, ["JOB_STATE_CANCELLED"], 10)
    # auto: no GPU workers, so the CPU, and the history says so; digest == train-local's.
    spec2 = c.write_spec(tiny_gpt("auto-device", steps=3))
    job_id2 = c.submit(spec2, "--stages", "2")["id"]
    job2 = c.wait_state(job_id2, ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
                                  "JOB_STATE_CANCELLED"], 120)
    check(job2["state"] == "JOB_STATE_SUCCEEDED", f"{job_id2}: {job2['state']}")
    check(job2.get("pipeline", {}).get("device") == "cpu",
          f"{job_id2}: device {job2.get('pipeline', {}).get('device')!r}, want cpu")
    placing = [h.get("reason", "") for h in job2.get("history", [])
               if h["state"] == "JOB_STATE_PLACING"]
    check(placing and "cpu: fewer than 2 idle workers have a GPU" in placing[0],
          f"the PLACING reason does not say why cpu: {placing}")
    check(job2["weights_digest"] == c.reference_digest(spec2), "digest differs from train-local")
    text = c.ctl_ok("get", job_id2).stdout
    check("device:     cpu" in text, f"batonctl get does not show the device:\n{text}")
    # Each link's transport and why, in get and in the history.
    want_link = "link:       ranks 0-1 grpc (grpc: the job computes on the CPU)"
    check(want_link in text, f"batonctl get does not show the link's transport:\n{text}")
    check(any("links: ranks 0-1 grpc: the job computes on the CPU" in h.get("reason", "")
              for h in job2.get("history", [])),
          f"the history does not say how the link transports: {job2.get('history')}")
    # The matrix kernels: the job's (get) are train-local's on this machine, and each
    # worker names its own (workers, and its log) with its threads.
    kernels = c.reference_kernels(spec2)
    check(f"kernels:    {kernels}\n" in text,
          f"batonctl get does not show train-local's kernels ({kernels}):\n{text}")
    check(job2["pipeline"].get("kernels") == [kernels],
          f"{job_id2}: pipeline.kernels {job2['pipeline'].get('kernels')}, want [{kernels!r}]")
    listed = {w["worker_id"]: w["device"] for w in c.workers()}
    for w in ids:
        check(listed[w].get("kernels") == kernels and listed[w].get("threads", 0) >= 1,
              f"{w} registered kernels {listed[w].get('kernels')!r}, threads "
              f"{listed[w].get('threads')}; want {kernels!r} and at least 1")
        log = open(c.logs[w], errors="replace").read()
        check(f"worker: matrix kernels: {kernels}; " in log,
              f"{w}'s log does not name its kernels ({kernels})")
    # The table: each worker's device line, then its kernels without who chose them.
    table = c.ctl_ok("workers").stdout.splitlines()
    short, depth, i = "", 0, 0
    while i < len(kernels):  # drop each balanced " (...)"
        if depth == 0 and kernels.startswith(" (", i):
            depth, i = 1, i + 2
            continue
        if depth:
            depth += {"(": 1, ")": -1}.get(kernels[i], 0)
        else:
            short += kernels[i]
        i += 1
    for w in ids:
        row = next((i for i, line in enumerate(table) if line.startswith(w + " ")), None)
        check(row is not None and row + 1 < len(table) and table[row + 1].strip() == short,
              f"batonctl workers does not show {w}'s kernels ({short}):\n" + "\n".join(table))
    c.wait_idle(2, ids=ids)
    print(f"  {job_id2}: auto -> cpu ({placing[0]}); batonctl get shows it")
    print(f"  kernels: {kernels} (get, workers, worker logs, train-local alike)")


def case_restart(c):
    """6. coordinator restart on the same --db keeps the job history."""
    c.ensure_workers(4)
    before = {j["id"]: j for j in c.ctl_json("list", "--all").get("jobs", [])}
    check(len(before) >= 1, f"want the earlier jobs in the list, got {len(before)}")
    port = c.address.rsplit(":", 1)[1]
    status = c.stop("coordinator", signal.SIGTERM)
    print(f"  coordinator stopped on SIGTERM with status {status}; {len(before)} jobs before")
    check(status == 0, f"the coordinator exited with status {status} on SIGTERM")
    # Same port, so the running workers find it again.
    c.start_coordinator(listen=f"127.0.0.1:{port}")
    after = {j["id"]: j for j in c.ctl_json("list", "--all").get("jobs", [])}
    missing = sorted(set(before) - set(after))
    check(not missing, f"jobs lost in the restart: {missing}")
    for job_id, old in before.items():
        new = after[job_id]
        check(new["state"] == old["state"],
              f"{job_id}: {old['state']} before the restart, {new['state']} after")
        check(new.get("weights_digest") == old.get("weights_digest"),
              f"{job_id}: digest changed in the restart")
    paged = [j["id"] for j in c.ctl_json("list", "--all", "--page-size", "2").get("jobs", [])]
    check(paged == list(after), f"list --all --page-size 2 gives {paged}, not {list(after)}")
    r = c.ctl_ok("list")
    print("  batonctl list after the restart:")
    for line in r.stdout.splitlines()[:12]:
        print(f"    {line}")
    ids = c.wait_idle(4)
    print(f"  workers registered again: {' '.join(ids)}")
    # Every step's history outlives the restart.
    for job_id, old in before.items():
        if old["state"] == "JOB_STATE_SUCCEEDED":
            rows = history_rows(c, job_id)
            total = int(old["spec"]["steps"])
            check([int(row[0]) for row in rows] == list(range(1, total + 1)),
                  f"history of {job_id} after the restart: {len(rows)} rows, want {total}")
            print(f"  batonctl history {job_id} after the restart: steps 1..{total}")
            break
    some = next(iter(before))
    r = c.ctl_ok("get", some)
    check(some in r.stdout and "history:" in r.stdout, f"batonctl get {some}: {r.stdout}")
    r = c.ctl_ok("workers")
    check(all(w in r.stdout for w in ids), f"batonctl workers: {r.stdout}")


def case_worker_killed(c):
    """5. SIGKILL of a worker mid-job fails the job, naming it (its lease, or a neighbour's
    transport, noticed it: how soon depends on the load, and is not checked)."""
    c.ensure_workers(4)
    known = {j["id"] for j in c.ctl_json("list", "--all").get("jobs", [])}
    spec = c.write_spec(tiny_gpt("doomed-gpt", steps=1000000))
    job_id = c.submit(spec, "--schedule", "1f1b", "--stages", "4")["id"]
    check(job_id not in known, f"the restarted coordinator reused the id {job_id}")
    job = c.wait_steps(job_id, 2)
    victim = job["workers"][1]
    check(victim in c.procs, f"rank 1 runs on {victim}, which this test did not start")
    start = time.monotonic()
    c.stop(victim, signal.SIGKILL)
    print(f"  killed {victim} (rank 1 of {' '.join(job['workers'])}) with SIGKILL")
    job = c.wait_state(job_id, ["JOB_STATE_FAILED", "JOB_STATE_CANCELLED",
                                "JOB_STATE_SUCCEEDED"], HANG_S)
    seconds = time.monotonic() - start
    reason = last_reason(job)
    print(f"  {job_id}: {job['state']} after {seconds:.1f} s: {reason}")
    check(job["state"] == "JOB_STATE_FAILED", f"want FAILED, got {job['state']}")
    # A million steps: it was running when the worker died, and failed for that.
    check(states_of(job)[-2:] == ["RUNNING", "FAILED"],
          f"the history does not say a RUNNING job failed: {states_of(job)}")
    victim_address = c.worker_addresses.get(victim, victim)
    check(victim in reason or victim_address in reason,
          f"the reason names neither {victim} nor {victim_address}: '{reason}'")
    others = [w for w in job["workers"] if w != victim]
    c.wait_idle(3, ids=others)
    # The job may fail first through a neighbour's transport error, before the lease ran
    # out; once the lease has, the dead worker is no longer offered as IDLE (it is DEAD, or
    # gone from the list).

    def victim_gone():
        states = {w["worker_id"]: w.get("state") for w in c.workers()}
        return states.get(victim, "absent") in ("WORKER_STATE_DEAD", "absent")
    wait_for(victim_gone, HANG_S, f"{victim} to be DEAD (lease TTL {LEASE_TTL_S:g} s)",
             interval=0.2)
    print(f"  {time.monotonic() - start:.1f} s after the kill: {c.describe_workers()}")


def case_worker_sigterm(c):
    """7. SIGTERM of a worker mid-job (Kubernetes and compose stop pods and containers this
    way): the worker aborts its rank, reports it and exits 0 well inside a 30 s grace
    period; the job fails saying that worker shut down, the other workers are IDLE again."""
    c.ensure_workers(4)
    spec = c.write_spec(tiny_gpt("stopped-gpt", steps=1000000))
    job_id = c.submit(spec, "--schedule", "1f1b", "--stages", "4")["id"]
    job = c.wait_steps(job_id, 2)
    victim = job["workers"][2]
    check(victim in c.procs, f"rank 2 runs on {victim}, which this test did not start")
    start = time.monotonic()
    # Within Kubernetes' default grace period (30 s), after which a pod is SIGKILLed (and
    # c.stop fails the case); how much sooner depends on the load, and is printed.
    status = c.stop(victim, signal.SIGTERM, timeout=30)
    exit_s = time.monotonic() - start
    print(f"  {victim} (rank 2) exited with status {status} {exit_s:.1f} s after SIGTERM")
    check(status == 0, f"{victim} exited with status {status} after SIGTERM")
    job = c.wait_state(job_id, ["JOB_STATE_FAILED", "JOB_STATE_CANCELLED",
                                "JOB_STATE_SUCCEEDED"], HANG_S)
    reason = last_reason(job)
    print(f"  {job_id}: {job['state']} after {time.monotonic() - start:.1f} s: {reason}")
    check(job["state"] == "JOB_STATE_FAILED", f"want FAILED, got {job['state']}")
    check(states_of(job)[-2:] == ["RUNNING", "FAILED"],
          f"the history does not say a RUNNING job failed: {states_of(job)}")
    # The stopped worker's own report is the root cause, not the peers' ABORTED echoes.
    check(f"worker {victim} is shutting down" in reason,
          f"the reason does not say that {victim} shut down: '{reason}'")
    c.wait_idle(3, ids=[w for w in job["workers"] if w != victim])


TERMINAL = ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"]


def case_data_parallel(c):
    """9. two replicas of a two-stage pipeline on four workers: digest == train-local's."""
    c.ensure_workers(4)
    spec = tiny_gpt("gpt-dp", steps=20, microbatches=2, schedule="SCHEDULE_1F1B")
    path = c.write_spec(spec)
    dp_spec = dict(spec)
    dp_spec["pipeline"] = dict(spec["pipeline"], stages=2, dataParallel=2)
    dp_path = c.write_spec(dp_spec)
    want = c.reference_digest(dp_path)
    one = c.reference_digest(path)
    check(want != one, "two replicas' grouping gave one pipeline's digest")
    start = time.monotonic()
    job_id = c.submit(path, "--stages", "2", "--data-parallel", "2")["id"]
    job = c.wait_state(job_id, TERMINAL, 120)
    check(job["state"] == "JOB_STATE_SUCCEEDED", f"{job['state']}: {last_reason(job)}")
    workers = job.get("workers", [])
    check(len(set(workers)) == 4, f"the job ran on {workers}, not four workers")
    pipeline = job.get("pipeline", {})
    check(int(pipeline.get("data_parallel", 0)) == 2, f"pipeline report: {pipeline}")
    check(job["weights_digest"] == want,
          f"job digest {job['weights_digest']} != train-local's {want} (D=2)")
    print(f"  {job_id}: SUCCEEDED in {time.monotonic() - start:.1f} s on {' '.join(workers)}"
          f" (2 replicas x 2 stages), digest equals train-local's: {want[:16]}...")
    # Each group's engine, and why, in the report and in `batonctl get`.
    groups = sorted(pipeline.get("groups", []), key=lambda g: int(g.get("rank", 0)))
    check([int(g.get("rank", 0)) for g in groups] == [0, 1], f"group reports: {groups}")
    for g in groups:
        check(g.get("engine") == "gloo" and g.get("mode") == "ordered" and
              g.get("reason") == "gloo: the job computes on the CPU", f"group report: {g}")
    text = c.ctl_ok("get", job_id).stdout
    check("dp group:   rank 1 x 2 replicas gloo ordered (gloo: the job computes on the CPU)"
          in text, f"batonctl get does not show the groups:\n{text}")
    # Every schedule across processes, and three replicas of one stage.
    runs = [("gpipe", {"schedule": "SCHEDULE_GPIPE", "stages": 2}, 2, 8),
            ("interleaved-1f1b", {"schedule": "SCHEDULE_INTERLEAVED_1F1B", "stages": 2,
                                  "virtualStages": 2}, 2, 8),
            ("zb-h1", {"schedule": "SCHEDULE_ZB_H1", "stages": 2}, 2, 8),
            ("1f1b", {"schedule": "SCHEDULE_1F1B", "stages": 1}, 3, 12)]
    for name, pipeline, replicas, batch in runs:
        spec_d = tiny_gpt(f"gpt-dp-{name}", steps=10, microbatches=2)
        spec_d["data"]["batchSize"] = batch
        spec_d["pipeline"] = dict(spec_d["pipeline"], dataParallel=replicas, **pipeline)
        p_d = c.write_spec(spec_d)
        want_d = c.reference_digest(p_d)
        jid = c.submit(p_d)["id"]
        got = c.wait_state(jid, TERMINAL, 120)
        check(got["state"] == "JOB_STATE_SUCCEEDED", f"{name}: {got['state']}: {last_reason(got)}")
        check(got["weights_digest"] == want_d,
              f"{name} D={replicas}: digest {got['weights_digest']} != train-local's {want_d}")
        print(f"  {name:17s} {replicas} replicas x {pipeline['stages']} stages ({jid}): digest "
              f"equals train-local's")
    # The optimizer sharded across the replicas (optimizer.shard): reduce-scatter, owned
    # updates and all-gather through Gloo between processes give the same bits, with two
    # replicas of two stages and three of one.
    shard_id = c.submit(path, "--stages", "2", "--data-parallel", "2", "--shard-optimizer")["id"]
    sharded = c.wait_state(shard_id, TERMINAL, 120)
    check(sharded["state"] == "JOB_STATE_SUCCEEDED",
          f"sharded: {sharded['state']}: {last_reason(sharded)}")
    check(sharded["weights_digest"] == want,
          f"sharded D=2: digest {sharded['weights_digest']} != train-local's {want}")
    text = c.ctl_ok("get", shard_id).stdout
    check("optimizer:  sharded across the 2 replicas (optimizer.shard)" in text,
          f"batonctl get does not show the sharding:\n{text}")
    shard3_id = c.submit(p_d, "--shard-optimizer")["id"]
    shard3 = c.wait_state(shard3_id, TERMINAL, 120)
    check(shard3["state"] == "JOB_STATE_SUCCEEDED",
          f"sharded D=3: {shard3['state']}: {last_reason(shard3)}")
    check(shard3["weights_digest"] == want_d,
          f"sharded D=3: digest {shard3['weights_digest']} != train-local's {want_d}")
    print(f"  sharded optimizer, 2x2 ({shard_id}) and 3x1 ({shard3_id}): digests equal "
          f"train-local's")
    # In bf16 the replicas keep the weights they do not own as bf16 bits; the job's digest
    # (each worker gathers its owners' float32 weights through the group) is train-local's.
    spec_b = dict(spec_d, name="gpt-dp-bf16", precision="PRECISION_BF16")
    p_b = c.write_spec(spec_b)
    want_b = c.reference_digest(p_b)
    check(want_b != want_d, "bf16 gave the fp32 digest")
    bf16_id = c.submit(p_b, "--shard-optimizer")["id"]
    bf16 = c.wait_state(bf16_id, TERMINAL, 120)
    check(bf16["state"] == "JOB_STATE_SUCCEEDED", f"sharded bf16: {bf16['state']}: {last_reason(bf16)}")
    check(bf16["weights_digest"] == want_b,
          f"sharded bf16 D=3: digest {bf16['weights_digest']} != train-local's {want_b}")
    print(f"  sharded optimizer in bf16, 3x1 ({bf16_id}): digest equals train-local's")
    # Fast mode (Gloo's ring) on the last of those (three replicas: with two, a ring's sum
    # is the ordered one, addition being commutative): the replicas agree (the coordinator
    # checks), the bits are not the ordered sum's, the loss stays within a relative 1e-3.
    fast_id = c.submit(p_d, "--reduce-mode", "fast")["id"]
    fast = c.wait_state(fast_id, TERMINAL, 120)
    check(fast["state"] == "JOB_STATE_SUCCEEDED", f"fast: {fast['state']}: {last_reason(fast)}")
    fast_groups = fast.get("pipeline", {}).get("groups", [])
    check(fast_groups and all(g.get("mode") == "fast" for g in fast_groups),
          f"fast groups: {fast_groups}")
    check(fast["weights_digest"] != want_d, "fast mode gave the ordered sum's bits")
    lo, lf = float(got["last_loss"]), float(fast["last_loss"])
    check(abs(lf - lo) <= 1e-3 * abs(lo), f"fast mode's loss {lf} is not within 1e-3 of {lo}")
    print(f"  fast mode, 3 replicas ({fast_id}): replicas agree, loss {lf:.6f} vs ordered "
          f"{lo:.6f}, other bits")
    # More replicas than the cluster has: waits, saying how many workers it needs.
    big = c.submit(path, "--stages", "2", "--data-parallel", "4", "--name", "dp-too-big")["id"]
    wait_for(lambda: "8 registered workers (4 replicas of 2 stages)" in last_reason(c.get(big)),
             HANG_S, "the oversized job to say what it waits for")
    print(f"  {big} waits: {last_reason(c.get(big))}")
    c.ctl_ok("cancel", big)
    c.wait_state(big, TERMINAL, 30)
    # A replica's worker killed mid-job: the whole job fails, naming it (through its lease
    # or the group's all-reduce); the other replica's workers (blocked in an all-reduce with
    # it) come back IDLE.
    c.wait_idle(4, ids=workers)
    doomed = c.submit(c.write_spec(tiny_gpt("dp-doomed", steps=1000000, microbatches=2)),
                      "--stages", "2", "--data-parallel", "2")["id"]
    job = c.wait_steps(doomed, 2)
    victim = job["workers"][3]  # rank 1 of replica 1
    start = time.monotonic()
    c.stop(victim, signal.SIGKILL)
    job = c.wait_state(doomed, TERMINAL, HANG_S)
    seconds = time.monotonic() - start
    reason = last_reason(job)
    print(f"  killed {victim} (replica 1, rank 1): {job['state']} after {seconds:.1f} s: "
          f"{reason[:160]}")
    check(job["state"] == "JOB_STATE_FAILED", f"want FAILED, got {job['state']}")
    check(states_of(job)[-2:] == ["RUNNING", "FAILED"],
          f"the history does not say a RUNNING job failed: {states_of(job)}")
    # Whether the lease or the group's all-reduce noticed first, the reason names the
    # victim: the lost worker, or the group it belonged to.
    check(victim in reason, f"the reason does not name {victim}: {reason}")
    others = [w for w in job["workers"] if w != victim]
    c.wait_idle(3, ids=others)
    c.start_worker(victim)  # the next cases expect four workers


def case_back_to_back(c):
    """50 short jobs submitted at once on 4 workers: the starts race the first reports (a
    rank may report, even finish, before the coordinator counted its StartJob answers), and
    every job must still succeed with its reference digest."""
    c.ensure_workers(4)
    mlp = json.load(open(os.path.join(c.examples, "mlp-tiny.json")))
    mlp.update(name="short-mlp", steps=3)
    mlp.setdefault("pipeline", {})["stages"] = 2
    specs = [c.write_spec(mlp), c.write_spec(tiny_gpt("short-gpt", steps=2, stages=2))]
    want = {s: c.reference_digest(s) for s in specs}
    jobs = []
    for i in range(50):
        spec = specs[i % 2]
        jobs.append((c.submit(spec)["id"], spec))
    failures = []
    for job_id, spec in jobs:
        job = c.wait_state(job_id, ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
                                    "JOB_STATE_CANCELLED"], 120)
        if job["state"] != "JOB_STATE_SUCCEEDED":
            failures.append(f"{job_id} {job['state']}: {last_reason(job)}")
        elif job.get("weights_digest") != want[spec]:
            failures.append(f"{job_id}: digest {job.get('weights_digest')} != {want[spec]}")
    check(not failures, f"{len(failures)} of 50 short jobs did not succeed: {failures[:3]}")
    print(f"  50 of 50 short jobs SUCCEEDED with their reference digests")
    c.wait_idle(4)


def case_memory(c):
    """A job no worker can hold waits saying so; one placed on a worker that offered more
    than it can allocate fails RESOURCE_EXHAUSTED before the worker builds anything, and the
    worker keeps serving."""
    def stop_for_good(names):
        for w in names:
            c.stop(w)

        def gone():  # their leases ran out: the coordinator holds them dead
            return not [w["worker_id"] for w in c.workers()
                        if w["worker_id"] in names and w.get("state") != "WORKER_STATE_DEAD"]
        wait_for(gone, HANG_S, f"the leases of {', '.join(names)} to run out")

    stop_for_good([n for n in list(c.procs) if n.startswith("w-")])
    limit = 3 << 30  # address space: about 1.3 GiB left beside what the worker maps itself
    deep = {"name": "deep-mlp", "model": {"mlp": {"inputDim": 2, "width": 1,
                                                  "depth": 1000000, "outputDim": 1}},
            "data": {"synthetic": {}, "batchSize": 2},
            "pipeline": {"stages": 1, "microbatches": 1, "schedule": "SCHEDULE_GPIPE"},
            "optimizer": {"sgd": {"learningRate": 0.01}}, "steps": 1, "seed": 1}
    deep_spec = c.write_spec(deep)

    def start_limited(worker_id, *flags):
        port_file = os.path.join(c.tmp, f"{worker_id}.port")
        argv = ["prlimit", f"--as={limit}", os.path.join(c.bin_dir, "worker"),
                "--coordinator", c.address, "--listen", "127.0.0.1:0", "--worker_id", worker_id,
                "--port_file", port_file, "--checkpoint_root", c.tmp, *flags]
        c.worker_addresses[worker_id] = c._start(worker_id, argv, port_file, worker_id)
        c.wait_idle(1, ids=[worker_id])

    start_limited("w-small")
    offered = {w["worker_id"]: int(w["device"].get("memory_bytes", 0)) for w in c.workers()}
    print(f"  w-small under a {limit >> 30} GiB address-space limit offers "
          f"{offered['w-small'] >> 20} MiB")
    check(0 < offered["w-small"] < limit, "w-small does not register what its limit allows")
    job = c.submit(deep_spec)
    # Once the coordinator tried to place it, its history says why it waits; it never left
    # the queue.
    job = wait_for(lambda: (lambda j: j if "cannot run" in last_reason(j) else None)(
        c.get(job["id"])), HANG_S, f"{job['id']} to say why it waits")
    print(f"  {job['id']}: {job['state']}: {last_reason(job)}")
    check(job["state"] == "JOB_STATE_QUEUED", f"want QUEUED, got {job['state']}")
    check(set(states_of(job)) == {"QUEUED"}, f"it left the queue: {states_of(job)}")
    check("no registered worker can hold rank" in last_reason(job),
          f"the reason does not say no worker can hold it: {last_reason(job)}")
    c.ctl_ok("cancel", job["id"])
    stop_for_good(["w-small"])

    # A worker that offers more than it can allocate: the job overruns it.
    start_limited("w-liar", "--memory_mb", "65536")
    job = c.wait_state(c.submit(deep_spec)["id"], ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
                                                   "JOB_STATE_CANCELLED"], 120)
    reason = last_reason(job)
    print(f"  {job['id']} on w-liar: {job['state']}: {reason[:200]}")
    check(job["state"] == "JOB_STATE_FAILED", f"want FAILED, got {job['state']}")
    # The worker checks what it can allocate now against the job's need before building
    # anything.
    check("RESOURCE_EXHAUSTED" in reason and "w-liar cannot hold rank 0" in reason,
          f"the reason does not say the worker cannot hold it: {reason}")
    check(c.procs["w-liar"].poll() is None, f"w-liar exited:\n{c.tail('w-liar')}")
    small = json.load(open(os.path.join(c.examples, "mlp-tiny.json")))
    small.update(name="after-oom", steps=3)
    spec = c.write_spec(small)
    after = c.wait_state(c.submit(spec)["id"], ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"], 60)
    check(after["state"] == "JOB_STATE_SUCCEEDED", f"the next job: {last_reason(after)}")
    check(after.get("weights_digest") == c.reference_digest(spec), "the next job's digest")
    print(f"  w-liar kept serving: {after['id']} SUCCEEDED with the reference digest")
    c.stop("w-liar")
    c.ensure_workers(4)


def case_preemption(c):
    """13. preemption: a higher-priority job stops a running checkpointing job at a step
    boundary, runs on its workers, and the preempted job resumes from that checkpoint and
    ends with train-local's digest."""
    c.ensure_workers(4)
    c.wait_idle(4, timeout=20)
    low = tiny_gpt("preempt-low", steps=160, stages=4)
    low["checkpoint"] = {"everySteps": 50, "dir": os.path.join(c.tmp, "preempt-ckpt")}
    low_path = c.write_spec(low)
    want = c.reference_digest(low_path)
    low_job = c.submit(low_path)
    c.wait_steps(low_job["id"], 5, timeout=60)
    urgent = tiny_gpt("preempt-urgent", steps=20, stages=2)
    urgent_path = c.write_spec(urgent)
    urgent_job = c.submit(urgent_path, "--priority", "5")
    # Both jobs end; what happened between is read from their records (the PREEMPTED phase
    # may be too short for any poll to see).
    done = c.wait_state(urgent_job["id"], ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
                                           "JOB_STATE_CANCELLED"], 120)
    check(done["state"] == "JOB_STATE_SUCCEEDED", f"{urgent_job['id']}: {last_reason(done)}")
    reasons = [h.get("reason", "") for h in done.get("history", [])]
    check(any(r.startswith(f"preempting {low_job['id']}") for r in reasons),
          f"{urgent_job['id']}'s history does not record the preemption: {reasons}")
    check(done["weights_digest"] == c.reference_digest(urgent_path),
          f"{urgent_job['id']} digest differs from train-local's")
    end = c.wait_state(low_job["id"], ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
                                       "JOB_STATE_CANCELLED"], 180)
    check(end["state"] == "JOB_STATE_SUCCEEDED", f"{low_job['id']}: {last_reason(end)}")
    check(end["weights_digest"] == want,
          f"{low_job['id']} resumed to {end['weights_digest']}, train-local says {want}")
    recoveries = end.get("recoveries", [])
    check(len(recoveries) == 1 and recoveries[0].get("preempted_by") == urgent_job["id"],
          f"{low_job['id']} recoveries: {recoveries}")
    stopped = int(recoveries[0].get("from_step", 0))
    check(0 < stopped < 160 and int(recoveries[0].get("lost_steps", 0)) == 0,
          f"stopped after step {stopped}: {recoveries[0]}")
    # The states it went through (notes repeat a state: a wait reason while PREEMPTED).
    states = [s for i, s in enumerate(states_of(end)) if i == 0 or states_of(end)[i - 1] != s]
    check(states.count("PREEMPTED") == 1 and
          states[-4:] == ["PREEMPTED", "PLACING", "RUNNING", "SUCCEEDED"],
          f"history states: {states}")
    history = [h.get("reason", "") for h in end.get("history", [])]
    preempted = [r for r in history if r.startswith(f"preempted by {urgent_job['id']}")]
    check(preempted and f"stopped after step {stopped} with its checkpoint written" in
          preempted[0], f"{low_job['id']}'s PREEMPTED entry: {preempted}")
    check(f"resumed from its own checkpoint step {stopped}" in history,
          f"{low_job['id']} did not record resuming from step {stopped}: {history}")
    print(f"  {low_job['id']} was PREEMPTED after step {stopped} (its checkpoint written) and "
          f"resumed from it: {preempted[0]}")
    shown = c.ctl_ok("get", low_job["id"]).stdout
    check("preempted:" in shown and urgent_job["id"] in shown, f"batonctl get: {shown}")
    check(f"preemptions: 1 time, by {urgent_job['id']}" in shown, f"batonctl get: {shown}")
    print(f"  {urgent_job['id']} SUCCEEDED on the freed workers; {low_job['id']} resumed from "
          f"step {stopped} and SUCCEEDED with train-local's digest {want[:16]}...")
    c.wait_idle(4, timeout=20)

    # With data-parallel replicas (only replica 0 writes checkpoints; every replica stops
    # after the same step).
    low = tiny_gpt("preempt-replicas", steps=160, stages=2, dataParallel=2)
    low["checkpoint"] = {"everySteps": 70, "dir": os.path.join(c.tmp, "preempt-ckpt")}
    low_path = c.write_spec(low)
    want = c.reference_digest(low_path)
    low_job = c.submit(low_path)
    c.wait_steps(low_job["id"], 5, timeout=60)
    urgent_job = c.submit(c.write_spec(tiny_gpt("preempt-urgent-2", steps=10, stages=3)),
                          "--priority", "3")
    done = c.wait_state(urgent_job["id"], ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
                                           "JOB_STATE_CANCELLED"], 120)
    check(done["state"] == "JOB_STATE_SUCCEEDED", f"{urgent_job['id']}: {last_reason(done)}")
    end = c.wait_state(low_job["id"], ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
                                       "JOB_STATE_CANCELLED"], 180)
    check(end["state"] == "JOB_STATE_SUCCEEDED", f"{low_job['id']}: {last_reason(end)}")
    check(end["weights_digest"] == want,
          f"{low_job['id']} (2 replicas) resumed to {end['weights_digest']}, train-local says "
          f"{want}")
    recoveries = end.get("recoveries", [])
    check(len(recoveries) == 1 and recoveries[0].get("preempted_by") == urgent_job["id"]
          and "PREEMPTED" in states_of(end), f"{low_job['id']} recoveries: {recoveries}")
    stopped = int(recoveries[0].get("from_step", 0))
    print(f"  2 replicas x 2 stages: {low_job['id']} PREEMPTED after step {stopped} by "
          f"{urgent_job['id']}, resumed and SUCCEEDED with train-local's digest")
    c.wait_idle(4, timeout=20)


def case_eval_only(c):
    """14. evaluation only: a 2-stage job measures a trained job's checkpoint on the
    validation shards and trains nothing: its one step's loss is the loss the training job
    measured after that step, and train-local --eval-only's, bit for bit; its digest is the
    trained job's."""
    c.ensure_workers(2)
    c.wait_idle(2, timeout=20)
    tok = os.path.join(c.data_root(), "eval-tokens")
    os.makedirs(tok, exist_ok=True)
    ids = [(i * 7 + i // 5) % 37 for i in range(4000)]
    with open(os.path.join(tok, "train.bin"), "wb") as f:
        f.write(struct.pack(f"<{len(ids)}H", *ids))
    val = [(i * 11 + i // 3) % 37 for i in range(1500)]
    with open(os.path.join(tok, "val.bin"), "wb") as f:
        f.write(struct.pack(f"<{len(val)}H", *val))
    spec = tiny_gpt("eval-trained", steps=6, stages=2)
    spec["data"] = {"tokens": {"train": [os.path.join(tok, "train.bin")],
                               "val": [os.path.join(tok, "val.bin")]}, "batchSize": 8}
    spec["eval"] = {"every": 6, "batches": 3}
    spec["checkpoint"] = {"everySteps": 6, "dir": os.path.join(c.tmp, "eval-ckpt")}
    path = c.write_spec(spec)
    trained = c.submit(path)
    done = c.wait_state(trained["id"], ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
                                        "JOB_STATE_CANCELLED"], 120)
    check(done["state"] == "JOB_STATE_SUCCEEDED", f"{trained['id']}: {last_reason(done)}")
    measured = history_rows(c, trained["id"])[-1][7]
    check(measured, f"{trained['id']} did not evaluate after its last step")

    job = c.submit(path, "--eval-only", "--resume-from", trained["id"], "--name", "eval-only")
    end = c.wait_state(job["id"], ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
                                   "JOB_STATE_CANCELLED"], 120)
    check(end["state"] == "JOB_STATE_SUCCEEDED", f"{job['id']}: {last_reason(end)}")
    check(int(end["spec"]["steps"]) == 1 and "checkpoint" not in end["spec"],
          f"{job['id']}'s spec: steps {end['spec'].get('steps')}, checkpoint "
          f"{end['spec'].get('checkpoint')}")
    rows = history_rows(c, job["id"])
    check(len(rows) == 1 and float32(rows[0][1]) == float32(measured) and
          float32(rows[0][7]) == float32(measured),
          f"{job['id']}'s step: {rows}, the training job measured {measured}")
    check(end["weights_digest"] == done["weights_digest"],
          f"{job['id']} changed the weights: {end['weights_digest']} vs {done['weights_digest']}")
    local = json.loads(c.ctl_ok("train-local", "-f", path, "--eval-only", "--output", "json",
                                "--resume-from",
                                os.path.join(c.tmp, "eval-ckpt", trained["id"]),
                                timeout=300).stdout)
    check(float32(local["eval_loss"]) == float32(measured),
          f"train-local --eval-only says {local['eval_loss']}, the cluster {measured}")
    shown = c.ctl_ok("get", job["id"]).stdout
    check("evaluation only: nothing trained" in shown and
          f"from job {trained['id']}'s checkpoint" in shown, f"batonctl get: {shown}")
    print(f"  {job['id']} evaluated {trained['id']}'s checkpoint: validation loss {measured}, "
          "as the training run and train-local measured it; digest unchanged")
    c.wait_idle(2, timeout=20)


CASES = [
    ("4", "malformed/impossible specs -> INVALID_ARGUMENT naming the field; unknown job -> "
          "NOT_FOUND; the coordinator serves on", case_invalid_specs),
    ("2", "a job needing 4 workers with 2 idle stays QUEUED with a reason, then runs when 2 "
          "more register", case_queued_until_workers),
    ("1", "GPipe, 1F1B, interleaved 1F1B (2x2), ZB-H1, ZB-V and V-Half on 4 workers: digest == train-local",
     case_schedules),
    ("3", "cancelling a running job: CANCELLED when cancel returns, workers IDLE, the next job "
          "runs", case_cancel),
    ("6", "restarting the coordinator on the same --db keeps the job history", case_restart),
    ("5", f"SIGKILL of a worker mid-job: FAILED naming the worker (lease TTL {LEASE_TTL_S:g} s);"
          " it is DEAD, the others IDLE", case_worker_killed),
    ("7", "SIGTERM of a worker mid-job: it exits 0 within the grace period, the job FAILED "
          "saying it shut down, the others IDLE", case_worker_sigterm),
    ("8", "device placement: cuda with no GPU workers waits with a reason, auto runs on the "
          "CPU and says why", case_device),
    ("9", "data parallelism: 2 replicas x 2 stages on 4 workers, digest == train-local's; "
          "more replicas than workers wait saying how many", case_data_parallel),
    ("10", "50 short jobs back to back on 4 workers: every one SUCCEEDED with its digest",
     case_back_to_back),
    ("11", "memory: a job no worker can hold waits saying so; one a worker cannot hold "
           "after all fails RESOURCE_EXHAUSTED and the worker serves on", case_memory),
    ("12", "quotas: an over-quota job waits saying so, a submission beyond max_queued is "
     "refused, SIGHUP re-reads the file", case_quotas),
    ("13", "preemption: a priority-5 job stops a running checkpointing job at a step, runs on "
           "its workers; the preempted job resumes and ends with train-local's digest",
     case_preemption),
    ("14", "evaluation only: a 2-stage job measures a trained job's checkpoint on validation "
           "shards: the training run's and train-local's loss, bit for bit; nothing trained",
     case_eval_only),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin-dir", required=True, help="where batonctl, coordinator, worker are")
    parser.add_argument("--examples", required=True, help="client/examples")
    parser.add_argument("--only", default="", help="comma-separated case numbers to run")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, db)")
    args = parser.parse_args()

    for binary in ("batonctl", "coordinator", "worker"):
        path = os.path.join(args.bin_dir, binary)
        if not os.access(path, os.X_OK):
            print(f"cluster_test: {path} is missing (not built?)", file=sys.stderr)
            print("0 passed, 1 failed")
            return 1

    # ctest's timeout or Ctrl-C: leave through `finally`, stopping every process.
    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)

    tmp = tempfile.mkdtemp(prefix="baton-cluster-test.")
    c = Cluster(args.bin_dir, args.examples, tmp)
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    passed, failed = [], []
    try:
        print("starting a coordinator and 2 workers")
        c.start_coordinator()
        c.start_worker("w-1")
        c.start_worker("w-2")
        passed, failed, _ = run_cases(c, CASES, only)
    except Failure as e:
        print(f"cluster_test: {e}")
        failed.append("setup")
    except KeyboardInterrupt as e:
        print(f"cluster_test: interrupted ({e})")
        failed.append("interrupted")
    finally:
        c.stop_all()
        if args.keep or failed:
            print(f"\nlogs and db kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{len(passed)} passed, {len(failed)} failed"
          + (f" (failed: {', '.join(failed)})" if failed else ""))
    return 0 if not failed and passed else 1


if __name__ == "__main__":
    sys.exit(main())
