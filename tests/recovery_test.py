#!/usr/bin/env python3
"""Jobs that survive failures, end to end: checkpoints, resume, divergence, on loopback.

A coordinator and workers as real processes (the harness of cluster_test.py), driven
through `batonctl`. Every wait is bounded; every process is stopped at the end.

Cases:
  1. A job with checkpoint {every_steps 4, keep 2} writes them as it trains; the coordinator
     records steps 8 and 12 as complete, the files of step 4 are pruned, and the digest
     equals `batonctl train-local`'s.
  2. `submit --resume-from JOB@8` on another schedule, and `--resume-from JOB` on three
     stages training further, end with train-local's digest for the same steps: bit-exact
     resume on any partition.
  3. Bad resumes and checkpoint dirs are refused naming the field: an unknown job, a step
     that is not a kept complete checkpoint, a job that wrote none; a checkpoint.dir the
     workers cannot write fails the job before its first step.
  4. A corrupted block file (SHA-256 mismatch): resuming skips that checkpoint, says so in
     the history, loads the older one, and still ends with the reference digest.
  5. A worker killed with SIGKILL mid-job: the job fails; resuming it from its last complete
     checkpoint (to a step past the kill) ends with the uninterrupted run's digest, losing at
     most 2 x every_steps steps.
  6. A diverging job (a non-finite loss or gradient) ends FAILED naming the step and stage,
     not SUCCEEDED.

usage: recovery_test.py --bin-dir build/bin [--only 1,2] [--keep]
"""

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_test import (HANG_S, Cluster, Failure, check, last_reason, run_cases,  # noqa: E402
                          states_of, tiny_gpt, wait_for)

TERMINAL = ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"]


def complete_steps(job):
    return [int(r["step"]) for r in job.get("checkpoints", {}).get("complete", [])]


def step_dirs(job_dir):
    if not os.path.isdir(job_dir):
        return []
    return sorted(int(d[5:]) for d in os.listdir(job_dir) if d.startswith("step-"))


def reasons(job):
    return [h.get("reason", "") for h in job.get("history", [])]


def names(c, worker_id, text):
    """Whether `text` (a reason) names the worker, by id or by address."""
    return worker_id in text or c.worker_addresses.get(worker_id, worker_id) in text


class State:
    """What the cases share: the first case's job, its spec and its checkpoint dir."""
    def __init__(self, tmp):
        self.ckpt = os.path.join(tmp, "ckpt")
        self.job = None
        self.spec = None      # spec file of the checkpointed job
        self.plain = None     # the same spec without checkpoints (for train-local)


def gpt_spec(c, s, name, steps, every=None, keep=None, **pipeline):
    spec = tiny_gpt(name, steps=steps, **pipeline)
    plain = c.write_spec(spec)
    if every is not None:
        spec["checkpoint"] = {"everySteps": every, "dir": s.ckpt}
        if keep is not None:
            spec["checkpoint"]["keep"] = keep
    return c.write_spec(spec), plain


def run_to_end(c, job_id, timeout=120):
    job = c.wait_state(job_id, TERMINAL, timeout)
    check(job["state"] == "JOB_STATE_SUCCEEDED",
          f"{job_id} ended {job['state']}: {last_reason(job)}")
    return job


def case_checkpoints(c, s):
    c.ensure_workers(2)
    s.spec, s.plain = gpt_spec(c, s, "ckpt-gpt", 12, every=4, keep=2, stages=2)
    job = run_to_end(c, c.submit(s.spec, "--schedule", "1f1b")["id"])
    s.job = job["id"]
    ref = c.reference_digest(s.plain)
    print(f"  {s.job}: digest {job['weights_digest'][:16]}..., train-local {ref[:16]}...")
    check(job["weights_digest"] == ref, "the checkpointed job's digest differs from train-local's")
    ck = job.get("checkpoints", {})
    job_dir = os.path.join(s.ckpt, s.job)
    check(ck.get("job_dir") == job_dir, f"checkpoints.job_dir is {ck.get('job_dir')}, "
                                        f"want {job_dir}")
    check(complete_steps(job) == [8, 12],
          f"complete checkpoints {complete_steps(job)}, want [8, 12] (keep 2, final always)")
    for r in ck["complete"]:
        check(int(r.get("bytes", 0)) > 0, f"checkpoint record without bytes: {r}")
    on_disk = step_dirs(job_dir)
    print(f"  recorded complete: {complete_steps(job)}; on disk: {on_disk}")
    check(on_disk == [8, 12], f"step directories {on_disk}, want [8, 12] (step 4 pruned)")
    for step in (8, 12):
        files = os.listdir(os.path.join(job_dir, f"step-{step}"))
        check(sum(f.startswith("manifest.rank-") for f in files) == 2,
              f"step-{step} lacks a manifest per rank: {sorted(files)}")
    out = os.path.join(c.tmp, "model.safetensors")
    c.ctl_ok("export", s.job, "-o", out)
    check(os.path.getsize(out) > 1000, "export wrote an (almost) empty file")
    text = c.ctl_ok("get", s.job).stdout
    check("complete after step 8, 12" in text, f"batonctl get does not list the checkpoints:\n{text}")


def case_resume(c, s):
    check(s.job, "case 1 did not run")
    c.ensure_workers(3)
    # From step 8 on GPipe: the 12-step run's digest.
    job = run_to_end(c, c.ctl_json("submit", "--resume-from", f"{s.job}@8", "--schedule",
                                   "gpipe")["id"])
    check(job["weights_digest"] == c.reference_digest(s.plain),
          f"{job['id']} resumed at step 8 on gpipe ends with another digest")
    check(int(job["checkpoints"].get("resumed_from_step", 0)) == 8 and
          job["checkpoints"].get("resumed_from_job") == s.job,
          f"checkpoints say {job['checkpoints']}")
    check(any(r.startswith(f"resumed from {s.job} step 8") for r in reasons(job)),
          f"the history does not say where it resumed from: {reasons(job)}")
    print(f"  {job['id']}: from {s.job}@8 on gpipe, 2 stages: digest matches")
    # From the newest (12) on three stages, training on to 16: the 16-step run's digest.
    job = run_to_end(c, c.ctl_json("submit", "--resume-from", s.job, "--stages", "3",
                                   "--steps", "16")["id"])
    check(int(job["checkpoints"].get("resumed_from_step", 0)) == 12,
          f"resumed from {job['checkpoints'].get('resumed_from_step')}, want 12 (the newest)")
    check(job["weights_digest"] == c.reference_digest(s.plain, steps=16),
          f"{job['id']} resumed at step 12 on 3 stages ends with another digest than 16 steps")
    print(f"  {job['id']}: from {s.job} (step 12) on 3 stages to step 16: digest matches")


def case_bad_input(c, s):
    check(s.job, "case 1 did not run")
    c.ensure_workers(2)

    def refused(args, want):
        r = c.ctl("submit", *args)
        check(r.returncode != 0, f"submit {' '.join(args)} was accepted")
        check(want in r.stderr, f"submit {' '.join(args)}: want '{want}' in: {r.stderr.strip()}")
        print(f"  refused: {r.stderr.strip()[:160]}")

    refused(["-f", s.spec, "--resume-from", "job-999999"],
            "resume_from.job_id: there is no job job-999999")
    refused(["--resume-from", f"{s.job}@5"],
            f"resume_from.step: {s.job} has no complete checkpoint after step 5 "
            "(it keeps steps 8, 12)")
    refused(["--resume-from", f"{s.job}@x"], "STEP after @ must be a step number")
    refused(["--resume-from", s.job, "--steps", "12"], "leaves nothing to train")
    other = tiny_gpt("other-model", steps=16, stages=2)
    other["model"]["gpt"]["layers"] = 2
    refused(["-f", c.write_spec(other), "--resume-from", s.job], "model differs")
    plain_job = run_to_end(c, c.submit(c.write_spec(tiny_gpt("plain", steps=2, stages=2)))["id"])
    refused(["--resume-from", plain_job["id"]], "its spec asks for none")
    # Checkpoint directories outside the cluster's checkpoint root, or escaping it.
    for outside in ("/etc/baton-ckpt", "ckpt/../../..", os.path.dirname(c.tmp)):
        spec = tiny_gpt("outside", steps=4, stages=2)
        spec["checkpoint"] = {"everySteps": 2, "dir": outside}
        refused(["-f", c.write_spec(spec)], f"checkpoint.dir: '{outside}' is outside")
    # A checkpoint.dir the workers cannot write (a path through a regular file): the job
    # fails when it starts, before any step, naming the field.
    blocker = os.path.join(c.tmp, "not-a-dir")
    with open(blocker, "w") as f:
        f.write("x")
    spec = tiny_gpt("unwritable", steps=4, stages=2)
    spec["checkpoint"] = {"everySteps": 2, "dir": os.path.join(blocker, "ckpt")}
    job = c.wait_state(c.submit(c.write_spec(spec))["id"], TERMINAL, HANG_S)
    reason = last_reason(job)
    print(f"  {job['id']}: {job['state']}: {reason[:160]}")
    check(job["state"] == "JOB_STATE_FAILED", f"want FAILED, got {job['state']}")
    check("checkpoint.dir on worker" in reason, f"the reason does not name checkpoint.dir: {reason}")
    check(int(job.get("steps_done", 0)) == 0, f"{job['id']} ran {job.get('steps_done')} steps")
    c.wait_idle(2)


def case_corrupted(c, s):
    check(s.job, "case 1 did not run")
    c.ensure_workers(2)
    step_dir = os.path.join(s.ckpt, s.job, "step-12")
    victim = sorted(f for f in os.listdir(step_dir) if f.endswith(".safetensors"))[0]
    path = os.path.join(step_dir, victim)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 1)
        last = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([last[0] ^ 0x01]))
    print(f"  flipped a bit in {path}")
    job = run_to_end(c, c.ctl_json("submit", "--resume-from", s.job, "--steps", "16")["id"])
    ck = job["checkpoints"]
    said = [r for r in reasons(job) if r.startswith("resumed from")]
    print(f"  {job['id']}: {said}")
    check(int(ck.get("resumed_from_step", 0)) == 8,
          f"resumed from step {ck.get('resumed_from_step')}, want 8 (12 is corrupted)")
    check(said and "skipped" in said[0] and "step-12" in said[0] and victim in said[0],
          f"the history does not say step 12 was skipped and why: {said}")
    check(job["weights_digest"] == c.reference_digest(s.plain, steps=16),
          "resuming from the older checkpoint ends with another digest")


def case_worker_killed(c, s):
    c.ensure_workers(3)
    # A million steps: it is still running when the worker is killed, however slowly this
    # test gets round to it (its history says so below). The resumed job trains on to a
    # step a little past the kill (--steps), compared with train-local to that step.
    spec, plain = gpt_spec(c, s, "killed-gpt", 1000000, every=5, stages=3)
    job_id = c.submit(spec, "--schedule", "1f1b")["id"]
    wait_checkpoint(c, job_id, 10)
    job = c.get(job_id)
    victim = job["workers"][1]
    c.stop(victim, signal.SIGKILL)
    job = c.wait_state(job_id, TERMINAL, HANG_S)
    check(job["state"] == "JOB_STATE_FAILED", f"want FAILED, got {job['state']}")
    check(states_of(job)[-2:] == ["RUNNING", "FAILED"] and names(c, victim, last_reason(job)),
          f"the history does not say the RUNNING job failed for {victim}: {states_of(job)} "
          f"({last_reason(job)})")
    killed_at = int(job["steps_done"])
    last = complete_steps(job)[-1]
    print(f"  killed {victim}; {job_id} FAILED after {killed_at} steps: {last_reason(job)[:100]}; "
          f"last complete checkpoint: step {last}")
    c.ensure_workers(3)
    start = time.monotonic()
    until = max(killed_at, last) + 10
    resumed = run_to_end(c, c.ctl_json("submit", "--resume-from", job_id, "--steps",
                                       str(until))["id"])
    ck = resumed["checkpoints"]
    check(int(ck["resumed_from_step"]) >= last,
          f"resumed from {ck['resumed_from_step']}, want the last complete {last} or newer")
    # Writes overlap training, one at a time: a checkpoint still being written when the
    # worker died is incomplete, so the bound is every_steps plus the steps that write
    # overlapped, at most 2 x every_steps (the next checkpoint waits for it).
    lost = killed_at - int(ck["resumed_from_step"])
    check(lost <= 2 * 5, f"lost {lost} steps, every_steps is 5 (bound: 2 x every_steps)")
    check(int(resumed["steps_done"]) == until, f"resumed ran to {resumed['steps_done']}, "
                                                f"want {until}")
    check(resumed["weights_digest"] == c.reference_digest(plain, steps=until),
          f"the resumed job's digest differs from the uninterrupted run's to step {until}")
    print(f"  {resumed['id']} resumed from step {ck['resumed_from_step']} (recorded: {last}; "
          f"lost {lost} steps), finished in "
          f"{time.monotonic() - start:.1f} s: digest equals the uninterrupted run's")


def case_divergence(c, s):
    c.ensure_workers(2)
    spec = tiny_gpt("diverging", steps=6, stages=2)
    spec["optimizer"] = {"sgd": {"learningRate": 1e30}}
    job = c.wait_state(c.submit(c.write_spec(spec))["id"], TERMINAL, 60)
    reason = last_reason(job)
    print(f"  {job['id']}: {job['state']}: {reason[:200]}")
    check(job["state"] == "JOB_STATE_FAILED", f"a diverging job ended {job['state']}")
    check("training diverged" in reason and "stage" in reason and "step" in reason,
          f"the reason does not name the divergence, step and stage: {reason}")
    c.wait_idle(2)


LEASE_TTL_S = 2.0  # cluster_test's coordinator flags


def recovery_spec(c, s, name, steps, stages, min_stages, every=5, max_restarts=2):
    spec = tiny_gpt(name, steps=steps, stages=stages)
    plain = c.write_spec(spec)
    spec["checkpoint"] = {"everySteps": every, "dir": s.ckpt}
    spec["restart"] = {"maxRestarts": max_restarts, "minStages": min_stages}
    return c.write_spec(spec), plain


# Jobs a failure is injected into run this many steps (a few ms each here): they must still
# be running when the test acts (after a checkpoint at step 10 or later, some 20 or 30 steps
# in, under two CPU hogs on 2 cores), however slowly it gets round to it, and finish after
# one recovery. Whether the action landed mid-job is checked, not hoped for: the job's
# recoveries say what it recovered from (check_recovered).
RECOVERED_STEPS = 1000


def wait_checkpoint(c, job_id, at_least, timeout=HANG_S):
    return wait_for(lambda: max(complete_steps(c.get(job_id)) or [0]) >= at_least, timeout,
                    f"{job_id} to complete a checkpoint at step {at_least} or later")


def check_recovered(c, job, plain, stages_after, lost):
    """The job SUCCEEDED after exactly one recovery, from what the test did (the recovery's
    reason contains `lost`: a worker, by id or address, or a text), onto `stages_after`
    stages, from a checkpoint, with the uninterrupted run's digest. How long the recovery
    took is printed, not checked (it depends on the load; the waits bound a hang)."""
    recs = job.get("recoveries", [])
    check(len(recs) == 1, f"{job['id']} ended {job['state']} after {len(recs)} recoveries, want "
                          f"1 (none: it ended before the failure was injected): {recs} "
                          f"({last_reason(job)})")
    r = recs[0]
    check(names(c, lost, r.get("reason", "")),
          f"the recovery's reason does not name {lost}: {r.get('reason')}")
    check(job["state"] == "JOB_STATE_SUCCEEDED", f"{job['id']} ended {job['state']}: "
                                                 f"{last_reason(job)}")
    states = states_of(job)
    check("RECOVERING" in states and "RUNNING" in states[states.index("RECOVERING"):],
          f"the history does not show RECOVERING, then RUNNING: {states}")
    check(int(r.get("stages_after", 0)) == stages_after,
          f"recovered onto {r.get('stages_after')} stages, want {stages_after}")
    check(int(r.get("from_step", 0)) > 0, f"the recovery did not resume from a checkpoint: {r}")
    detected = parse_time(r["detected"])
    resumed = parse_time(r["resumed"])
    took = resumed - detected
    print(f"  recovery: {r['reason'][:90]}; from step {r.get('from_step', 0)}, "
          f"{r.get('lost_steps', 0)} steps lost, {r.get('stages_before')} -> "
          f"{r.get('stages_after')} stages on {r.get('workers_after')}, first step after "
          f"{took:.2f} s")
    check(0 <= took <= HANG_S, f"the first step after the recovery {took:.1f} s after it was "
                               f"detected")
    check(job["weights_digest"] == c.reference_digest(plain),
          f"{job['id']}'s digest after recovery differs from the uninterrupted run's")
    return r, took


def parse_time(text):
    # RFC 3339 with Z and up to nanoseconds.
    from datetime import datetime, timezone
    base, _, frac = text.rstrip("Z").partition(".")
    t = datetime.strptime(base, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    return t + (float("0." + frac) if frac else 0.0)


def case_auto_recovery_kill(c, s):
    """A worker SIGKILLed mid-job: RECOVERING (its lease, lease TTL 2 s, or a neighbour's
    transport noticed), re-planned onto the 3 workers left (4 -> 3 stages), resumed from the
    last checkpoint, digest unchanged."""
    c.ensure_workers(4)
    spec, plain = recovery_spec(c, s, "auto-kill", RECOVERED_STEPS, stages=4, min_stages=2)
    job_id = c.submit(spec, "--schedule", "1f1b")["id"]
    wait_checkpoint(c, job_id, 10)
    victim = c.get(job_id)["workers"][2]
    start = time.monotonic()
    c.stop(victim, signal.SIGKILL)
    job = wait_for(lambda: (lambda j: j if j.get("recoveries") or
                            j["state"] in TERMINAL else None)(c.get(job_id)),
                   HANG_S, f"{job_id} to start recovering")
    print(f"  killed {victim} (rank 2); {job_id} {job['state']} after "
          f"{time.monotonic() - start:.1f} s: "
          f"{job['recoveries'][0]['reason'][:100] if job.get('recoveries') else last_reason(job)}")
    job = c.wait_state(job_id, TERMINAL, HANG_S)
    check_recovered(c, job, plain, stages_after=3, lost=victim)
    check(victim not in job["workers"], f"the dead {victim} is among {job['workers']}")
    c.ensure_workers(4)


def case_auto_recovery_sigstop(c, s):
    """A worker SIGSTOPped past its lease, then continued: the job recovers without it; its
    late reports are refused (another attempt), it is told to drop the job, and ends IDLE;
    the digest is the uninterrupted run's."""
    c.ensure_workers(4)
    spec, plain = recovery_spec(c, s, "auto-stop", RECOVERED_STEPS, stages=3, min_stages=3)
    job_id = c.submit(spec)["id"]
    wait_checkpoint(c, job_id, 10)
    job = c.get(job_id)
    victim = job["workers"][1]
    spare = [w for w in ("w-1", "w-2", "w-3", "w-4") if w not in job["workers"]]
    pid = c.procs[victim].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        # Resumed without it (or ended: check_recovered says how).
        job = wait_for(lambda: (lambda j: j if j["state"] in TERMINAL or (
                                j["state"] == "JOB_STATE_RUNNING" and j.get("recoveries")
                                and j["recoveries"][0].get("resumed")) else None)(c.get(job_id)),
                       HANG_S, f"{job_id} to recover without the stopped {victim}")
    finally:
        os.kill(pid, signal.SIGCONT)
    print(f"  SIGSTOPped {victim} (rank 1) past its lease; recovered onto {job['workers']} "
          f"(spare {spare}); continued {victim}")
    job = c.wait_state(job_id, TERMINAL, HANG_S)
    check_recovered(c, job, plain, stages_after=3, lost=victim)
    check(victim not in job["workers"], f"the stopped {victim} is among {job['workers']}")
    # The continued worker learns it lost its lease, drops the job, registers again: IDLE.
    c.wait_idle(4, timeout=HANG_S, ids=["w-1", "w-2", "w-3", "w-4"])
    log = open(c.logs[victim], errors="replace").read()
    check("aborting job " + job_id in log or "registering again" in log,
          f"{victim}'s log does not show it dropped the job:\n{c.tail(victim)}")


def case_auto_recovery_coordinator_killed(c, s):
    """The coordinator SIGKILLed mid-job and started again on the same database: the running
    job recovers on the workers when they register again; digest unchanged."""
    c.ensure_workers(3)
    spec, plain = recovery_spec(c, s, "coord-kill", RECOVERED_STEPS, stages=3, min_stages=3)
    job_id = c.submit(spec)["id"]
    wait_checkpoint(c, job_id, 10)
    c.stop("coordinator", signal.SIGKILL)
    start = time.monotonic()
    address = c.address
    c.start_coordinator(listen=address)  # same port: the workers reconnect to it
    job = c.wait_state(job_id, TERMINAL, 2 * HANG_S)
    print(f"  coordinator killed and restarted; {job_id} {job['state']} "
          f"{time.monotonic() - start:.1f} s later")
    check_recovered(c, job, plain, stages_after=3, lost="coordinator restarted")


def case_divergence_rolled_back_once(c, s):
    """With restart, a diverging job is rolled back once to its last checkpoint; it diverges
    again (training is deterministic) and then fails, saying so."""
    c.ensure_workers(2)
    spec = tiny_gpt("diverging-restart", steps=6, stages=2)
    spec["optimizer"] = {"sgd": {"learningRate": 1e30}}
    spec["restart"] = {"maxRestarts": 3}
    job = c.wait_state(c.submit(c.write_spec(spec))["id"], TERMINAL, 60)
    reason = last_reason(job)
    print(f"  {job['id']}: {job['state']} after {len(job.get('recoveries', []))} roll-back: "
          f"{reason[:200]}")
    check(job["state"] == "JOB_STATE_FAILED", f"want FAILED, got {job['state']}")
    check(len(job.get("recoveries", [])) == 1, f"want one roll-back, got {job.get('recoveries')}")
    check("diverged again after a roll-back" in reason, f"reason: {reason}")


def kill_a_replica_and_recover(c, s, spec):
    """Runs `spec` (2 replicas x 2 stages) checkpointing with restart on, SIGKILLs replica
    1's rank 1 once a checkpoint is complete, and checks the job recovered onto the two
    workers left as 2 replicas x 1 stage with the uninterrupted digest; returns the job."""
    plain = c.write_spec(spec)
    spec = dict(spec, checkpoint={"everySteps": 5, "dir": s.ckpt},
                restart={"maxRestarts": 2, "minStages": 1})
    job_id = c.submit(c.write_spec(spec))["id"]
    wait_checkpoint(c, job_id, 10)
    victim = c.get(job_id)["workers"][3]  # replica 1, rank 1
    c.stop(victim, signal.SIGKILL)
    job = c.wait_state(job_id, TERMINAL, 2 * HANG_S)
    check_recovered(c, job, plain, stages_after=1, lost=victim)
    check(len(job["workers"]) == 2 and victim not in job["workers"],
          f"recovered onto {job['workers']}, want 2 workers without {victim}")
    return job


def case_data_parallel(c, s):
    """Replicas checkpoint, resume and recover: 2 replicas x 2 stages write checkpoints
    (replica 0's ranks), a resume from one is bit-exact, and a killed worker's job recovers
    onto the 3 left as 2 replicas x 1 stage, bit-exact."""
    c.ensure_workers(4)
    spec = tiny_gpt("dp-ckpt", steps=20, stages=2, dataParallel=2)
    plain = c.write_spec(spec)
    want = c.reference_digest(plain)
    spec["checkpoint"] = {"everySteps": 5, "dir": s.ckpt}
    job_id = c.submit(c.write_spec(spec))["id"]
    job = c.wait_state(job_id, TERMINAL, 120)
    check(job["state"] == "JOB_STATE_SUCCEEDED", f"{job['state']}: {last_reason(job)}")
    check(job["weights_digest"] == want, "a checkpointing data-parallel job's digest differs")
    check(complete_steps(job) == [15, 20], f"complete checkpoints: {complete_steps(job)}")
    job_dir = job["checkpoints"]["job_dir"]
    manifests = sorted(os.listdir(os.path.join(job_dir, "step-20")))
    print(f"  {job_id}: checkpoints after steps {complete_steps(job)}; step-20 holds {manifests}")
    resumed = c.submit(plain, "--resume-from", f"{job_id}@15")["id"]
    job = c.wait_state(resumed, TERMINAL, 120)
    check(job["state"] == "JOB_STATE_SUCCEEDED", f"resume: {job['state']}: {last_reason(job)}")
    check(job["weights_digest"] == want, "resumed from step 15 with replicas: another digest")
    print(f"  {resumed}: resumed from {job_id} step 15 with 2 replicas, digest unchanged")

    job = kill_a_replica_and_recover(
        c, s, tiny_gpt("dp-restart", steps=RECOVERED_STEPS, stages=2, dataParallel=2))
    groups = job.get("pipeline", {}).get("groups", [])
    check(len(groups) == 1 and int(job["pipeline"].get("data_parallel", 0)) == 2,
          f"after the recovery: {job.get('pipeline')}")
    c.ensure_workers(4)


def case_sharded_optimizer(c, s):
    """optimizer.shard: 4 replicas x 1 stage checkpoint the whole optimizer state, each
    replica a part of the blocks (the owners hand each writer its blocks' state), recorded
    complete once all four wrote; a resume from one as 2 replicas x 2 stages,
    sharded, is bit-exact with train-local's resume; a killed worker's sharded job recovers
    onto the 3 left, bit-exact."""
    c.ensure_workers(4)
    spec = tiny_gpt("shard-ckpt", steps=20, microbatches=2, stages=1, dataParallel=4)
    spec["optimizer"]["shard"] = True
    plain = c.write_spec(spec)
    want = c.reference_digest(plain)
    spec["checkpoint"] = {"everySteps": 5, "dir": s.ckpt}
    job_id = c.submit(c.write_spec(spec))["id"]
    job = c.wait_state(job_id, TERMINAL, 120)
    check(job["state"] == "JOB_STATE_SUCCEEDED", f"{job['state']}: {last_reason(job)}")
    check(job["weights_digest"] == want, "a sharded checkpointing job's digest differs")
    check(complete_steps(job) == [15, 20], f"complete checkpoints: {complete_steps(job)}")
    job_dir = job["checkpoints"]["job_dir"]
    # Each replica wrote its part of the five blocks (embed, 3 blocks, head: replica m the
    # blocks m and m + 4) under its own manifest.
    step_dir = os.path.join(job_dir, "step-20")
    manifests = sorted(f for f in os.listdir(step_dir) if f.startswith("manifest.rank-"))
    check(manifests == ["manifest.rank-0.json"] +
          [f"manifest.rank-0.part-{p}.json" for p in (1, 2, 3)], f"manifests: {manifests}")
    parts = []
    for m in manifests:
        with open(os.path.join(step_dir, m)) as f:
            parts.append([b["block"] for b in json.load(f)["blocks"]])
    check(parts == [["embed", "head"], ["block.0"], ["block.1"], ["block.2"]],
          f"the parts name {parts}")
    print(f"  {job_id}: 4 replicas sharded, checkpoints after steps {complete_steps(job)}, "
          f"written in parts {parts}")
    # The checkpoint holds the true state: resumed as it was, the uninterrupted bits.
    same = c.wait_state(c.submit(plain, "--resume-from", f"{job_id}@15")["id"], TERMINAL, 120)
    check(same["state"] == "JOB_STATE_SUCCEEDED", f"resume: {same['state']}: {last_reason(same)}")
    check(same["weights_digest"] == want, "resumed from step 15 as it was: another digest")
    # Resumed on another replica count and partition: the same bits as train-local's resume
    # of the same checkpoint (which reads every parameter's state from it).
    two = tiny_gpt("shard-resume", steps=20, microbatches=2, stages=2, dataParallel=2)
    two["optimizer"]["shard"] = True
    two_path = c.write_spec(two)
    local = json.loads(c.ctl_ok("train-local", "-f", two_path, "--resume-from",
                                f"{job_dir}@15", "--output", "json", timeout=300).stdout)
    resumed = c.submit(two_path, "--resume-from", f"{job_id}@15")["id"]
    job = c.wait_state(resumed, TERMINAL, 120)
    check(job["state"] == "JOB_STATE_SUCCEEDED", f"resume: {job['state']}: {last_reason(job)}")
    check(job["weights_digest"] == local["weights_digest"],
          f"resumed at D=2: {job['weights_digest']}, train-local's {local['weights_digest']}")
    print(f"  {resumed}: resumed from {job_id} step 15 as 2 replicas x 2 stages, sharded: "
          f"train-local's digest")

    spec = tiny_gpt("shard-restart", steps=RECOVERED_STEPS, microbatches=2, stages=2,
                    dataParallel=2)
    spec["optimizer"]["shard"] = True
    kill_a_replica_and_recover(c, s, spec)
    c.ensure_workers(4)


CASES = [
    ("1", "checkpoints written, recorded, pruned to keep; digest == train-local", case_checkpoints),
    ("2", "resume on another schedule and on 3 stages: bit-exact", case_resume),
    ("3", "bad resumes and an unwritable checkpoint.dir refused naming the field", case_bad_input),
    ("4", "a corrupted checkpoint is skipped with a reason; the older one is used", case_corrupted),
    ("5", "a worker killed mid-job; resume from the last complete checkpoint: bit-exact",
     case_worker_killed),
    ("6", "a diverging job fails naming the step and stage", case_divergence),
    ("7", "restart: a worker SIGKILLed mid-job; recovered onto the 3 left, bit-exact",
     case_auto_recovery_kill),
    ("8", "restart: a worker SIGSTOPped past its lease then continued; recovered on a spare, "
          "its late messages refused, bit-exact", case_auto_recovery_sigstop),
    ("9", "restart: the coordinator SIGKILLed mid-job and restarted; recovered, bit-exact",
     case_auto_recovery_coordinator_killed),
    ("10", "restart: divergence rolled back once, then FAILED", case_divergence_rolled_back_once),
    ("11", "replicas: checkpoints by replica 0, resume and recovery onto fewer stages, "
           "bit-exact", case_data_parallel),
    ("12", "a sharded optimizer: checkpoints written in parts by every replica, a resume on "
           "another replica count and a recovery, bit-exact", case_sharded_optimizer),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin-dir", required=True, help="where batonctl, coordinator, worker are")
    parser.add_argument("--only", default="", help="comma-separated case numbers to run")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, db)")
    args = parser.parse_args()
    for binary in ("batonctl", "coordinator", "worker"):
        if not os.access(os.path.join(args.bin_dir, binary), os.X_OK):
            print(f"recovery_test: {binary} is missing in {args.bin_dir} (not built?)")
            print("0 passed, 1 failed")
            return 1

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)

    tmp = tempfile.mkdtemp(prefix="baton-recovery-test.")
    c = Cluster(args.bin_dir, "", tmp)
    s = State(tmp)
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    passed, failed = [], []
    try:
        c.start_coordinator()
        passed, failed, _ = run_cases(c, CASES, only, args=(s,), tail_all=True, tail_lines=12)
    except Failure as e:
        print(f"recovery_test: {e}")
        failed.append("setup")
    except KeyboardInterrupt as e:
        print(f"recovery_test: interrupted ({e})")
        failed.append("interrupted")
    finally:
        c.stop_all()
        if args.keep or failed:
            print(f"\nlogs, db and checkpoints kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{len(passed)} passed, {len(failed)} failed"
          + (f" (failed: {', '.join(failed)})" if failed else ""))
    return 0 if not failed and passed else 1


if __name__ == "__main__":
    sys.exit(main())
