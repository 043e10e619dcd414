"""What the cluster benchmarks (recompute_bench.py, shard_bench.py) share: a fresh local
cluster whose workers serve metrics, a job submitted and watched to its end, and a worker's
allocator figures read from its metrics."""
import json
import os
import re
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, os.path.join(ROOT, "tests"))
import cluster_test  # noqa: E402  (the test harness's Cluster: processes, batonctl)


def fresh_cluster(bin_dir, tmp, workers):
    """A coordinator and `workers` idle workers (w-1, w-2, ...) in `tmp`, each serving
    metrics; the caller stops it (c.stop_all())."""
    c = cluster_test.Cluster(bin_dir, os.path.join(ROOT, "client", "examples"), tmp)
    c.worker_flags = lambda wid: ["--metrics_listen", "127.0.0.1:0", "--metrics_port_file",
                                  os.path.join(tmp, f"{wid}.metrics")]
    try:
        c.start_coordinator()
        for i in range(workers):
            c.start_worker(f"w-{i + 1}")
        c.wait_idle(workers)
    except BaseException:
        c.stop_all()
        raise
    return c


def watch_job(c, path, *flags):
    """Submits the spec at `path` with --watch; returns the finished job and its steps'
    durations in seconds. Exits when the job did not succeed."""
    r = c.ctl("submit", "-f", path, *flags, "--watch", "--output", "json", timeout=900)
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    job = c.get(lines[0]["id"])
    if job["state"] != "JOB_STATE_SUCCEEDED":
        raise SystemExit(f"job failed: {cluster_test.last_reason(job)}")
    return job, [float(e["step"]["duration"].rstrip("s")) for e in lines[1:] if "step" in e]


def worker_memory(tmp, worker_id):
    """A worker's baton_worker_device_memory_bytes by state ("peak", "in_use")."""
    with open(os.path.join(tmp, f"{worker_id}.metrics")) as f:
        address = f.read().strip()
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for state in ("peak", "in_use"):
        m = re.search(r'^baton_worker_device_memory_bytes\{[^}]*state="%s"[^}]*\} (\S+)$' % state,
                      text, re.M)
        out[state] = float(m.group(1)) if m else float("nan")
    return out
