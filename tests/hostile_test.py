#!/usr/bin/env python3
"""A cluster on a hostile network: mutual TLS, tokens and a join token, attacked while it trains.

Starts a coordinator and two workers with certificates from a throwaway CA
(scripts/make-certs.sh), a token file (alice and bob submitters, vera a viewer) and a join
token; alice submits a job; while it runs, tests/hostile_client (a client of its own, not
batonctl) tries: no token, a made-up token, a viewer submitting, bob cancelling alice's job,
a spec reading /etc/shadow, checkpoints outside the checkpoint root, bob resuming from and
exporting alice's job, a viewer holding every watch stream it may open (alice must still
watch), a 100 MB message, fake workers without a certificate, with another CA's, with a
member certificate but no join token, with a user's certificate and the join token,
progress and results for a live worker without its session, WorkerService calls without a
certificate or session, tensor streams and abort notices from a non-peer, 16 MiB tensors
from made-up ranks (7, -1, ...), 1024 junk rendezvous values per worker, and junk bytes on
every gRPC port. Every attempt must be refused with the right status, and no refusal may
carry a job key; the workers' memory must not grow with what was refused; afterwards the
job must succeed with the reference trainer's digest, every service must still serve (a
data-parallel job, which meets through the rendezvous, succeeds), no log may contain a
token or a job key, and the coordinator, started with tokens, mutual TLS and a join token,
must not warn that it is open.

Then, as a user of the cluster would try it: a job evaluating 10,000 batches per evaluation
is cancelled (every rank stops between micro-batches, the workers are IDLE only once no job
thread runs, and the next job on them succeeds; eval.batches 2^31-1 is refused at submit);
checkpoint.dir "." (the root itself) and "users" are refused, another user's users/NAME too,
and a spec naming no directory writes under its user's own; and on a cluster of its own, two
users allowed priority 5 send 8 jobs that never train at one of bob's jobs (one fails to
start on the workers it took, one is cancelled while the job stops for it): bob's job is
preempted once, the cancelled preemption is withdrawn, every later preemptor is barred, and
`batonctl get` says who preempted it.
"""
import argparse
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_test import (Cluster, Failure, check, last_reason, states_of, tiny_gpt,  # noqa: E402
                          wait_for)

TOKENS = {
    "alice": ("alice-0f3c9a7e5b1d4c2a8e6f0b9d", "submitter"),
    "bob": ("bob-8d2e4f6a0c1b3d5e7f9a2c4e6b", "submitter"),
    "carol": ("carol-6a8c0e2b4d6f8a0c2e4b6d8f", "submitter"),
    "vera": ("vera-3b5d7f9a1c3e5a7b9d1f3a5c", "viewer"),
}
# alice and carol may ask for priority 5, and so preempt bob's jobs.
QUOTAS = "user alice - - 5\nuser carol - - 5\n"
TERMINAL = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED")
JOIN_TOKEN = "join-5e7a9c1b3d5f7a9c1e3b5d7f"
STEPS = 1500


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def run(argv, timeout=60):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    return r


def write_users(tmp):
    """The token file (TOKENS) and the quota file (QUOTAS) in `tmp`; returns their paths."""
    tokens, quotas = os.path.join(tmp, "tokens"), os.path.join(tmp, "quotas")
    with open(tokens, "w") as f:
        for name, (token, role) in TOKENS.items():
            f.write(f"{token} {name} {role}\n")
    with open(quotas, "w") as f:
        f.write(QUOTAS)
    return tokens, quotas


def as_user(c, user):
    c.env = dict(c.env, BATON_TOKEN=TOKENS[user][0])


def refused(c, what, code, text, *args):
    r = c.ctl(*args)
    check(r.returncode == 1 and code in r.stderr and text in r.stderr,
          f"{what}: want {code} naming '{text}', got exit {r.returncode}: {r.stderr.strip()}")
    print(f"  refused {what}: {r.stderr.strip()[:200]}")


def write_tokens(path, count):
    with open(path, "wb") as f:
        f.write(b"".join(struct.pack("<H", (i * 7) % 40) for i in range(count)))


def cancel_reaches_an_evaluation(c, data_dir):
    """Cancelling a job while its ranks evaluate 10,000 validation batches stops them at
    once: the workers are IDLE only once no job thread runs, and the next job on them
    succeeds. eval.batches has a bound at submit that says why."""
    print("== cancel reaches an evaluation")
    write_tokens(os.path.join(data_dir, "train.bin"), 4000)
    write_tokens(os.path.join(data_dir, "val.bin"), 600)
    spec = tiny_gpt("evaluating", steps=5, stages=2)
    spec["data"] = {"tokens": {"train": ["train.bin"], "val": ["val.bin"],
                               "format": "TOKEN_FORMAT_UINT16"}, "batchSize": 8}
    spec["eval"] = {"every": 1, "batches": 2**31 - 1}
    refused(c, "eval.batches 2^31-1", "INVALID_ARGUMENT", "eval.batches",
            "submit", "-f", c.write_spec(spec))
    spec["eval"]["batches"] = 10000
    c.wait_idle(2)
    job = c.submit(c.write_spec(spec))
    wait_for(lambda: "RUNNING" in states_of(c.get(job["id"])), 60, f"{job['id']} to run")
    c.ctl_ok("cancel", job["id"], "--reason", "no more evaluating")
    ended = c.get(job["id"])
    check(ended["state"] == "JOB_STATE_CANCELLED" and int(ended.get("steps_done", 0)) == 0,
          f"{job['id']} was not cancelled mid-evaluation: {ended['state']}, "
          f"{ended.get('steps_done')} steps: {last_reason(ended)}")
    # Every rank's thread ended: each says where the abort reached it.
    def stopped():
        lines = {}
        for w in ("w-1", "w-2"):
            with open(c.logs[w], errors="replace") as f:
                found = [line.strip() for line in f
                         if f"job {job['id']} rank" in line and "stopped on the abort" in line]
            if not found:
                return None
            lines[w] = found[-1]
        return lines
    lines = wait_for(stopped, 60, f"both ranks of {job['id']} to stop")
    for w, line in sorted(lines.items()):
        print(f"  {w}: {line[:160]}")
    check(any("stopped (" in line for line in lines.values()),
          f"no rank was stopped by the abort between micro-batches: {lines}")
    c.wait_idle(2)
    after = c.submit(c.write_spec(tiny_gpt("after-evaluating", steps=5, stages=2)))
    done = c.wait_state(after["id"], TERMINAL, 120)
    check(done["state"] == "JOB_STATE_SUCCEEDED",
          f"the next job on the freed workers: {done['state']}: {last_reason(done)}")
    print(f"  {job['id']} CANCELLED mid-evaluation; {after['id']} then ran on the same workers")


def vm_mib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def reset_peak_rss(pid):
    """Starts the process's peak resident size (VmHWM) afresh from its current size."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def exports_stream_without_holding_the_model(c):
    """Six exports of a 28 MB model at once: every one either streams the exact file or is
    refused RESOURCE_EXHAUSTED by the caps, the coordinator's peak memory grows by less than
    one model (it streams from the files, 1 MiB at a time), and every worker kept its
    2-second lease while they ran (its heartbeats were served)."""
    print("== exports stream, capped, beside the heartbeats")
    spec = tiny_gpt("exported", steps=1, stages=1)
    spec["model"]["gpt"].update({"dModel": 384, "heads": 6, "layers": 4})
    spec["checkpoint"] = {"everySteps": 1}
    job = c.submit(c.write_spec(spec))
    done = c.wait_state(job["id"], TERMINAL, 300)
    check(done["state"] == "JOB_STATE_SUCCEEDED", f"{job['id']}: {last_reason(done)}")
    ref = os.path.join(c.tmp, "export-ref.safetensors")
    c.ctl_ok("export", "--from", done["checkpoints"]["job_dir"], "-o", ref, timeout=120)
    want = open(ref, "rb").read()
    expired_before = open(c.logs["coordinator"], errors="replace").read().count("lease expired")
    pid = c.procs["coordinator"].pid
    reset_peak_rss(pid)
    hwm_before = vm_mib(pid, "VmHWM")
    check(hwm_before <= vm_mib(pid, "VmRSS") + 8, "the coordinator's peak memory was not reset")
    env = dict(os.environ, BATON_COORDINATOR=c.address, **c.env)
    procs = []
    for i in range(6):
        out = os.path.join(c.tmp, f"export-{i}.safetensors")
        procs.append((out, subprocess.Popen(
            [c.batonctl, "export", job["id"], "-o", out], env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    streamed, capped = 0, 0
    for out, p in procs:
        _, err = p.communicate(timeout=300)
        if p.returncode == 0:
            check(open(out, "rb").read() == want, f"{out} differs from the checkpoint's weights")
            streamed += 1
        else:
            check("RESOURCE_EXHAUSTED" in err and "retry later" in err,
                  f"an export failed otherwise than by the caps: {err.strip()}")
            capped += 1
    grew = vm_mib(pid, "VmHWM") - hwm_before
    model_mib = len(want) / 2**20
    print(f"  {streamed} exports of {model_mib:.0f} MiB streamed, {capped} refused by the caps; "
          f"the coordinator's peak memory grew by {grew:.0f} MiB")
    check(streamed >= 1, "no export streamed")
    check(grew < model_mib, f"the coordinator's peak memory grew by {grew:.0f} MiB, more than "
                            f"the {model_mib:.0f} MiB model: it holds what it exports")
    expired = open(c.logs["coordinator"], errors="replace").read().count("lease expired")
    check(expired == expired_before, "a worker's lease expired while exports streamed")
    states = {w["worker_id"]: w.get("state") for w in c.workers()}
    check(all(s == "WORKER_STATE_IDLE" for s in states.values()), f"workers: {states}")


def no_user_owns_the_checkpoint_root(c):
    """The checkpoint root and users/ are no job's, users/NAME is NAME's, and a spec naming
    no directory gets its user's own: one user cannot lock the others out."""
    print("== nobody owns the checkpoint root")
    spec = tiny_gpt("root-squatter", steps=2, stages=1)
    for d in (".", "users", "users/.."):
        spec["checkpoint"] = {"everySteps": 1, "dir": d}
        refused(c, f"checkpoint.dir {d!r}", "INVALID_ARGUMENT", "checkpoint.dir",
                "submit", "-f", c.write_spec(spec))
    as_user(c, "bob")
    spec["checkpoint"] = {"everySteps": 1, "dir": "users/alice/mine"}
    refused(c, "bob writing in users/alice", "PERMISSION_DENIED", "users/alice",
            "submit", "-f", c.write_spec(spec))
    ids = {}
    for user in ("alice", "bob"):
        as_user(c, user)
        spec["checkpoint"] = {"everySteps": 1}  # no dir: the user's own
        ids[user] = c.submit(c.write_spec(spec))["id"]
    as_user(c, "alice")
    for user, job_id in ids.items():
        done = c.wait_state(job_id, TERMINAL, 120)
        check(done["state"] == "JOB_STATE_SUCCEEDED", f"{user}'s {job_id}: {last_reason(done)}")
        want = os.path.join(c.tmp, "users", user, job_id)
        got = done.get("checkpoints", {}).get("job_dir")
        check(got == want and os.path.isdir(want), f"{user}'s checkpoints went to {got}")
    print(f"  alice's and bob's jobs wrote their checkpoints under users/alice and users/bob")


def preemption_churn_is_bounded(bin_dir, tmp):
    """Two users allowed priority 5 try to preempt bob's long job with 8 jobs that never
    train: carol's first fails to start on the workers it took, alice's first is cancelled
    while bob's job stops for it (one of bob's workers is frozen meanwhile, so no rank can
    have stopped: the preemption is withdrawn), and six more follow. Each user's first wasted
    preemption bars them from preempting; bob's job is preempted once, and `batonctl get`
    says by whom. A cluster of its own: long leases, so a worker frozen for the test is not
    taken for dead."""
    print("== preemption at will (a cluster of its own)")
    os.makedirs(tmp)
    c = Cluster(bin_dir, "", tmp)
    tokens, quotas = write_users(tmp)
    c.coordinator_flags = ["--auth_tokens", tokens, "--quotas", quotas, "--lease_ttl", "60s",
                           "--recv_timeout", "300s"]
    frozen = None
    try:
        c.start_coordinator()
        as_user(c, "bob")
        c.ensure_workers(2)
        blocked = os.path.join(tmp, "users", "carol", "blocked")
        os.makedirs(os.path.dirname(blocked), exist_ok=True)
        with open(blocked, "w") as f:
            f.write("a file where a directory should be\n")
        low = tiny_gpt("bobs-long-job", steps=1000000, stages=2)
        low["checkpoint"] = {"everySteps": 20}
        low_job = c.submit(c.write_spec(low))
        c.wait_steps(low_job["id"], 3)
        fails = tiny_gpt("fails-at-start", steps=5, stages=2)
        fails["checkpoint"] = {"everySteps": 5, "dir": "users/carol/blocked/ckpt"}
        fails_path = c.write_spec(fails)
        valid_path = c.write_spec(tiny_gpt("never-trains", steps=5, stages=2))

        def low_running():
            # RUNNING, and every rank reported a step of this attempt (the last rank two):
            # a job that may be preempted.
            job = c.get(low_job["id"])
            check(job["state"] not in TERMINAL,
                  f"bob's job ended: {job['state']}: {last_reason(job)}")
            recoveries = job.get("recoveries", [])
            since = int(recoveries[-1].get("from_step", 0)) if recoveries else 0
            return (job["state"] == "JOB_STATE_RUNNING" and
                    int(job.get("steps_done", 0)) >= since + 2)

        def notes(start):
            return [h["reason"] for h in c.get(low_job["id"]).get("history", [])
                    if h.get("reason", "").startswith(start)]

        # carol's first preempts bob's job, then fails to start on its workers.
        as_user(c, "carol")
        first = c.submit(fails_path, "--priority", "5")
        ended = c.wait_state(first["id"], TERMINAL, 120)
        check(ended["state"] == "JOB_STATE_FAILED", f"{first['id']}: {last_reason(ended)}")
        # alice's first, cancelled while bob's job cannot stop: withdrawn.
        wait_for(low_running, 120, "bob's job to run again")
        frozen = c.procs["w-2"]
        frozen.send_signal(signal.SIGSTOP)
        as_user(c, "alice")
        second = c.submit(valid_path, "--priority", "5")
        wait_for(lambda: notes(f"preempting for {second['id']}"), 60,
                 f"{second['id']} to preempt bob's job")
        c.ctl_ok("cancel", second["id"])
        check(notes(f"preemption withdrawn: {second['id']} ended (CANCELLED)"),
              f"bob's job's history does not say the preemption was withdrawn: "
              f"{notes('preempt')}")
        frozen.send_signal(signal.SIGCONT)
        frozen = None
        # Six more, three each, every one barred: they wait preempting nothing, cancelled.
        reason = ""
        for user, path in (("carol", fails_path), ("alice", valid_path)) * 3:
            wait_for(low_running, 120, "bob's job to run")
            as_user(c, user)
            job = c.submit(path, "--priority", "5")
            reason = wait_for(lambda: c.get(job["id"]).get("wait_reason") or None, 60,
                              f"{job['id']} to say why it waits")
            check("it preempts nothing" in reason and f"{user}'s" in reason,
                  f"{user}'s {job['id']} is not barred from preempting: {reason}")
            c.ctl_ok("cancel", job["id"])
        print(f"  6 later preemptors were barred, e.g.: {reason[:240]}")
        as_user(c, "bob")
        job = c.get(low_job["id"])
        preempting = notes("preempting for ")
        check(len(preempting) == 2, f"bob's job was preempted {len(preempting)} times: "
                                    f"{preempting}")
        by = [r.get("preempted_by") for r in job.get("recoveries", [])]
        check(by == [first["id"]], f"bob's job's preemptions: {by}")
        shown = c.ctl_ok("get", low_job["id"]).stdout
        want = f"preemptions: 1 time, by {first['id']} (carol)"
        check(want in shown, f"batonctl get does not say '{want}':\n{shown}")
        check(job["state"] == "JOB_STATE_RUNNING", f"bob's job is {job['state']}")
        print(f"  bob's {low_job['id']}: 8 jobs that never trained tried, 1 preemption "
              f"({first['id']}), 1 withdrawn; RUNNING at step {job.get('steps_done')}")
        c.ctl_ok("cancel", low_job["id"])
    finally:
        if frozen is not None:
            frozen.send_signal(signal.SIGCONT)
        c.stop_all()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin-dir", required=True, help="where batonctl, coordinator, worker are")
    parser.add_argument("--hostile-client", required=True, help="the hostile_client binary")
    parser.add_argument("--source-dir", required=True, help="the repository (scripts/)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    args = parser.parse_args()

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)

    tmp = tempfile.mkdtemp(prefix="baton-hostile-test.")
    tls, intruder = os.path.join(tmp, "tls"), os.path.join(tmp, "intruder")
    make_certs = os.path.join(args.source_dir, "scripts", "make-certs.sh")
    c = Cluster(args.bin_dir, "", tmp)
    ok = False
    try:
        for d, n in ((tls, "2"), (intruder, "1")):
            r = run(["bash", make_certs, d, n])
            check(r.returncode == 0, f"make-certs.sh {d}: {r.stderr}")
        tokens, quotas = write_users(tmp)
        join = os.path.join(tmp, "join-token")
        with open(join, "w") as f:
            f.write(JOIN_TOKEN + "\n")
        # Token shards of the test's own, and the default root the hostile client reads.
        data_dir = os.path.join(tmp, "data")
        os.makedirs(data_dir)
        data_roots = f"{data_dir},/usr/share/common-licenses"
        c.coordinator_flags = ["--tls_cert", f"{tls}/coordinator.pem",
                               "--tls_key", f"{tls}/coordinator.key", "--tls_ca", f"{tls}/ca.pem",
                               "--auth_tokens", tokens, "--join_token_file", join,
                               "--quotas", quotas, "--data_root", data_roots]
        certs = {"w-1": "worker-0", "w-2": "worker-1"}
        c.worker_flags = lambda w: ["--tls_cert", f"{tls}/{certs[w]}.pem",
                                    "--tls_key", f"{tls}/{certs[w]}.key",
                                    "--tls_ca", f"{tls}/ca.pem", "--join_token_file", join,
                                    "--data_root", data_roots]
        c.env = {"BATON_TLS_CA": f"{tls}/ca.pem", "BATON_TOKEN": TOKENS["alice"][0]}

        print("== a cluster with mutual TLS, tokens and a join token")
        c.start_coordinator()
        c.ensure_workers(2)
        workers = {w["worker_id"]: w for w in c.workers()}
        for w, cn in (("w-1", "baton-worker-0"), ("w-2", "baton-worker-1")):
            check(workers[w].get("identity") == cn,
                  f"{w} registered as {workers[w].get('identity')!r}, not {cn}")
        # Long enough to be running for the whole attack (a few seconds); checked below.
        spec = c.write_spec(tiny_gpt("under-attack", steps=STEPS, stages=2))
        job = c.submit(spec)
        check(job.get("submitted_by") == "alice", f"submitted_by is {job.get('submitted_by')!r}")
        c.wait_steps(job["id"], 2)

        print("== the hostile client, while the job runs")
        ports = [c.address] + list(c.worker_addresses.values())
        rss_before = {w: rss_mib(c.procs[w].pid) for w in ("w-1", "w-2")}
        r = run([args.hostile_client, "--coordinator", c.address,
                 "--workers", ",".join(c.worker_addresses.values()),
                 "--tls_dir", tls, "--intruder_dir", intruder,
                 "--viewer_token", TOKENS["vera"][0], "--alice_token", TOKENS["alice"][0],
                 "--bob_token", TOKENS["bob"][0], "--job", job["id"],
                 "--join_token", JOIN_TOKEN,
                 "--garbage_ports", ",".join(ports)], timeout=240)
        print(r.stdout, end="")
        check(r.returncode == 0, f"hostile_client: some attempts were not refused "
                                 f"(exit {r.returncode}): {r.stderr[-2000:]}")
        check(r.stdout.count("refused:") >= 20,
              f"only {r.stdout.count('refused:')} attempts were made")
        for w, before in rss_before.items():
            after = rss_mib(c.procs[w].pid)
            print(f"  {w}: {before:.0f} MiB resident before the attack, {after:.0f} MiB after")
            # Twelve refused 16 MiB tensors would add 192 MiB if they had been taken in.
            check(after - before < 96, f"{w} grew by {after - before:.0f} MiB under the attack")
        during = c.get(job["id"])
        check(during["state"] == "JOB_STATE_RUNNING",
              f"the job was {during['state']} when the attack ended, not RUNNING: make it longer")
        check(int(during.get("steps_done", 0)) < STEPS, "the job had already finished")

        print("== the job is unaffected")
        done = c.wait_state(job["id"], {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
                                        "JOB_STATE_CANCELLED"}, timeout=180)
        check(done["state"] == "JOB_STATE_SUCCEEDED",
              f"the job ended {done['state']}: {last_reason(done)}")
        check(int(done.get("steps_done", 0)) == STEPS, f"steps_done {done.get('steps_done')}")
        want = c.reference_digest(spec)
        check(done.get("weights_digest") == want,
              f"digest {done.get('weights_digest')} != reference {want}")
        print(f"  {job['id']} SUCCEEDED with the reference digest {want[:16]}...")

        print("== every service still serves")
        for name, proc in c.procs.items():
            check(proc.poll() is None, f"{name} exited ({proc.returncode}):\n{c.tail(name)}")
        c.wait_idle(2)
        # Two replicas of one stage: the replicas meet through the rendezvous the attack filled
        # with junk (it must have refused all of it).
        spec2 = c.write_spec(tiny_gpt("after-the-attack", steps=5, stages=1, dataParallel=2))
        job2 = c.submit(spec2)
        done2 = c.wait_state(job2["id"], {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 120)
        check(done2["state"] == "JOB_STATE_SUCCEEDED", f"a later job: {last_reason(done2)}")
        check(done2.get("weights_digest") == c.reference_digest(spec2), "a later job's digest")
        print(f"  {job2['id']} SUCCEEDED")

        cancel_reaches_an_evaluation(c, data_dir)
        exports_stream_without_holding_the_model(c)
        no_user_owns_the_checkpoint_root(c)
        preemption_churn_is_bounded(args.bin_dir, os.path.join(tmp, "preemption"))

        print("== no token and no job key in any log")
        c.stop_all()
        secrets = [t for t, _ in TOKENS.values()] + [JOIN_TOKEN]
        for name, log in c.logs.items():
            text = open(log, errors="replace").read()
            for s in secrets:
                check(s not in text, f"{name}'s log contains a secret")
            # A job key is a random 64-bit number: about 19 decimal digits.
            keys = re.findall(r"\b[0-9]{12,}\b", text)
            check(not keys, f"{name}'s log contains what looks like a job key: {keys[:3]}")
        check("WARNING" not in open(c.logs["coordinator"], errors="replace").read(),
              "the coordinator warns it is open although it runs with TLS, tokens and a "
              "join token")
        ok = True
    except Failure as e:
        print(f"hostile_test: {e}")
    except KeyboardInterrupt as e:
        print(f"hostile_test: interrupted ({e})")
    finally:
        c.stop_all()
        if not ok:
            for name in c.logs:
                print(f"--- last lines of {name} ---\n{c.tail(name, 15)}")
        if args.keep or not ok:
            print(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("hostile_test: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
