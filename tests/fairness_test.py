#!/usr/bin/env python3
"""A shared cluster under load: three users, mixed priorities and sizes, 200 jobs.

Starts a coordinator with tokens (alice, bob and carol submit; an admin watches) and quotas
(each user's workers held, jobs queued and highest priority), and 5 workers. The users
submit 200 jobs in four waves: short jobs of 1 to 3 stages and long ones that write
checkpoints (which higher-priority jobs may preempt), each at a priority its quota allows.
While they run, the admin samples every job (batonctl list) and checks that no user ever
holds more workers than its quota. In the end:
  - every job SUCCEEDED: none waits forever, none fails;
  - every job's digest equals batonctl train-local's for its spec;
  - every preemption stopped its job at a step whose checkpoint it resumed from, with no
    step lost, and named the job that preempted it;
  - at least one job was preempted (the mix is made so that some are).
Prints the jobs each user ran, how long they waited to be placed, and the preemptions.
"""
import argparse
import datetime
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_test import Cluster, Failure, check, last_reason, tiny_gpt  # noqa: E402

TOKENS = {
    "alice": ("alice-7c1e9a3b5d7f9b1d3f5a7c9e", "submitter"),
    "bob": ("bob-2a4c6e8a0c2e4a6c8e0a2c4e6a", "submitter"),
    "carol": ("carol-9e7c5a3e1c9a7e5c3a1e9c7a", "submitter"),
    "root": ("root-4f6a8c0e2a4c6e8a0c2e4a6c", "admin"),
}
# user: (max_workers, max_queued, max_priority)
QUOTAS = {"alice": (3, 200, 2), "bob": (3, 200, 1), "carol": (4, 200, 3)}
WORKERS = 5
JOBS = 200
WAVES = 4


def stamp(text):
    """Seconds since the epoch of a JSON Timestamp ("2026-11-27T04:10:01.123456Z")."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def kinds(tmp):
    """Short and long (checkpointing) specs; the long ones' checkpoint.dir is per user (a
    user may not write inside another's), so it is set at submission."""
    mlp = {"model": {"mlp": {"inputDim": 4, "width": 8, "depth": 5, "outputDim": 2}},
           "data": {"synthetic": {}, "batchSize": 8},
           "optimizer": {"sgd": {"learningRate": 0.05}}, "seed": 3}
    out = {}
    for stages in (1, 2, 3):
        out[f"short-mlp-{stages}"] = dict(mlp, name=f"short-mlp-{stages}", steps=4,
                                          pipeline={"stages": stages, "microbatches": 2})
    out["short-gpt-2"] = tiny_gpt("short-gpt-2", steps=3, stages=2)
    for stages in (2, 3):
        out[f"long-gpt-{stages}"] = tiny_gpt(f"long-gpt-{stages}", steps=400, stages=stages)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin-dir", required=True, help="where batonctl, coordinator, worker are")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, db)")
    parser.add_argument("--seed", type=int, default=30, help="the job mix's random seed")
    args = parser.parse_args()

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)

    tmp = tempfile.mkdtemp(prefix="baton-fairness-test.")
    c = Cluster(args.bin_dir, "", tmp)
    ok = False
    try:
        tokens = os.path.join(tmp, "tokens")
        with open(tokens, "w") as f:
            for name, (token, role) in TOKENS.items():
                f.write(f"{token} {name} {role}\n")
        quotas = os.path.join(tmp, "quotas")
        with open(quotas, "w") as f:
            f.write("# scope name max_workers max_queued max_priority\n")
            for user, (workers, queued, priority) in QUOTAS.items():
                f.write(f"user {user} {workers} {queued} {priority}\n")
        # A head waits 2 s before it holds workers: reservations happen within the test.
        # Leases last 10 s, not the cluster test's 2: this test is about the queue, and on
        # a loaded 2-core machine (CI, beside another test) 200 jobs, their workers and the
        # sampling can starve a heartbeat for longer than 2 s, which would end a job as a
        # lost worker rather than show anything about fairness.
        c.coordinator_flags = ["--auth_tokens", tokens, "--quotas", quotas,
                               "--reserve_after", "2s", "--lease_ttl", "10s"]
        c.env = {"BATON_TOKEN": TOKENS["root"][0]}
        c.start_coordinator()
        c.ensure_workers(WORKERS)

        specs = kinds(tmp)
        reference = {}
        for name, spec in specs.items():
            reference[name] = c.reference_digest(c.write_spec(spec))
        print(f"== train-local digests of {len(specs)} specs")

        rng = random.Random(args.seed)
        users = sorted(QUOTAS)
        plan = []  # (user, kind, priority)
        for i in range(JOBS):
            user = users[i % len(users)]
            kind = rng.choice(["short-mlp-1", "short-mlp-2", "short-mlp-3", "short-gpt-2"] * 4 +
                              ["long-gpt-2", "long-gpt-3"] * 2)
            plan.append((user, kind, rng.randint(0, QUOTAS[user][2])))
        paths = {}
        for user in users:
            for name, spec in specs.items():
                spec = json.loads(json.dumps(spec))
                if name.startswith("long"):
                    spec["checkpoint"] = {"everySteps": 100,
                                          "dir": os.path.join(tmp, f"ckpt-{user}")}
                paths[(user, name)] = c.write_spec(spec)

        # Sample every job while they run: no user may hold more workers than its quota.
        stop = threading.Event()
        samples, over = [0], []

        def monitor():
            while not stop.is_set():
                try:
                    r = c.ctl("list", "--all", "--page-size", "1000", "--output", "json")
                    if r.returncode == 0:
                        held = {u: 0 for u in users}
                        for j in json.loads(r.stdout).get("jobs", []):
                            if j["state"] in ("JOB_STATE_PLACING", "JOB_STATE_RUNNING"):
                                u = j.get("submitted_by", "")
                                held[u] = held.get(u, 0) + len(j.get("workers", []))
                        samples[0] += 1
                        for u, n in held.items():
                            if u in QUOTAS and n > QUOTAS[u][0]:
                                over.append(f"{u} held {n} workers (quota {QUOTAS[u][0]})")
                except Exception as e:  # noqa: BLE001 -- recorded, checked below
                    over.append(f"monitor: {e}")
                time.sleep(0.1)
        watcher = threading.Thread(target=monitor, daemon=True)
        watcher.start()

        jobs = []  # (id, user, kind, priority, submitted at)
        start = time.monotonic()
        per_wave = JOBS // WAVES
        for wave in range(WAVES):
            for user, kind, priority in plan[wave * per_wave:(wave + 1) * per_wave]:
                c.env = {"BATON_TOKEN": TOKENS[user][0]}
                job = c.submit(paths[(user, kind)], "--priority", str(priority))
                jobs.append((job["id"], user, kind, priority, time.monotonic()))
            c.env = {"BATON_TOKEN": TOKENS["root"][0]}
            print(f"== wave {wave + 1}: {per_wave} jobs submitted at "
                  f"{time.monotonic() - start:.1f} s")
            time.sleep(1.5)

        failures, preempted, waits = [], [], {u: [] for u in users}
        for job_id, user, kind, priority, submitted in jobs:
            try:
                job = c.wait_state(job_id, ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
                                            "JOB_STATE_CANCELLED"], 300)
            except Failure as e:
                failures.append(f"{job_id} ({user}, {kind}): {e}")
                continue
            if job["state"] != "JOB_STATE_SUCCEEDED":
                failures.append(f"{job_id} ({user}, {kind}) {job['state']}: {last_reason(job)}")
                continue
            check(job.get("submitted_by") == user, f"{job_id} submitted_by {job.get('submitted_by')}")
            if job.get("weights_digest") != reference[kind]:
                failures.append(f"{job_id} ({kind}): digest {job.get('weights_digest')} != "
                                f"train-local's {reference[kind]}")
            for r in job.get("recoveries", []):
                if not r.get("preempted_by"):
                    failures.append(f"{job_id} recovered from a failure: {r.get('reason')}")
                    continue
                preempted.append((job_id, r["preempted_by"], int(r.get("from_step", 0))))
                if int(r.get("lost_steps", 0)) != 0 or int(r.get("from_step", 0)) <= 0:
                    failures.append(f"{job_id} preempted by {r['preempted_by']} lost steps: {r}")
            placed = [h for h in job.get("history", []) if h["state"] == "JOB_STATE_PLACING"]
            if placed and job.get("create_time"):
                waits[user].append((stamp(placed[0]["time"]) - stamp(job["create_time"])))
        stop.set()
        watcher.join(timeout=10)
        elapsed = time.monotonic() - start

        check(not failures, f"{len(failures)} of {JOBS} jobs did not end as they should: "
                            f"{failures[:5]}")
        check(samples[0] >= 10, f"only {samples[0]} samples of the held workers were taken")
        check(not over, f"quotas broken in {len(over)} samples: {over[:5]}")
        check(preempted, "no job was preempted: the mix did not exercise preemption")
        for job_id, by, step in preempted:
            ids = [j[0] for j in jobs]
            check(by in ids, f"{job_id} preempted by an unknown job {by}")
        counts = {u: sum(1 for j in jobs if j[1] == u) for u in users}
        for u in users:
            w = sorted(waits[u])
            print(f"   {u}: {counts[u]} jobs, quota {QUOTAS[u][0]} workers, priority <= "
                  f"{QUOTAS[u][2]}; wait to placement median {w[len(w) // 2]:.1f} s, "
                  f"longest {w[-1]:.1f} s")
        print(f"== all {JOBS} jobs SUCCEEDED with train-local's digests in {elapsed:.0f} s "
              f"({', '.join(f'{u} {counts[u]}' for u in users)}); quotas held in "
              f"{samples[0]} samples; {len(preempted)} preemptions, each resumed from the "
              f"step it stopped at (e.g. {preempted[0][0]} by {preempted[0][1]} after step "
              f"{preempted[0][2]})")
        ok = True
    except Failure as e:
        print(f"FAIL: {e}")
        print("--- coordinator log ---")
        print(c.tail("coordinator", 30))
    finally:
        c.stop_all()
        if args.keep or not ok:
            print(f"(logs kept in {tmp})")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
