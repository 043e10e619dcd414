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
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_test import Cluster, Failure, check, last_reason, tiny_gpt  # noqa: E402

TOKENS = {
    "alice": ("alice-0f3c9a7e5b1d4c2a8e6f0b9d", "submitter"),
    "bob": ("bob-8d2e4f6a0c1b3d5e7f9a2c4e6b", "submitter"),
    "vera": ("vera-3b5d7f9a1c3e5a7b9d1f3a5c", "viewer"),
}
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
        tokens = os.path.join(tmp, "tokens")
        with open(tokens, "w") as f:
            for name, (token, role) in TOKENS.items():
                f.write(f"{token} {name} {role}\n")
        join = os.path.join(tmp, "join-token")
        with open(join, "w") as f:
            f.write(JOIN_TOKEN + "\n")
        c.coordinator_flags = ["--tls_cert", f"{tls}/coordinator.pem",
                               "--tls_key", f"{tls}/coordinator.key", "--tls_ca", f"{tls}/ca.pem",
                               "--auth_tokens", tokens, "--join_token_file", join]
        certs = {"w-1": "worker-0", "w-2": "worker-1"}
        c.worker_flags = lambda w: ["--tls_cert", f"{tls}/{certs[w]}.pem",
                                    "--tls_key", f"{tls}/{certs[w]}.key",
                                    "--tls_ca", f"{tls}/ca.pem", "--join_token_file", join]
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
