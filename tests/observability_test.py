#!/usr/bin/env python3
"""Metrics, dashboard and traces against real processes.

A coordinator and two workers on loopback, a real Prometheus server (Debian's `prometheus`)
scraping them with the shipped scrape config (deploy/prometheus/prometheus.yml, its targets
pointed at the local ports), and an interleaved job (2 ranks x 2 chunks: 4 stages) watched
while it runs, as a user watches the dashboard; it is cancelled at the end. Then:
  1. Every expression of the Grafana dashboard (tests/dashboard_test.py --print-exprs),
     queried through Prometheus' HTTP API, returns at least one series with a number
     (polled: rates need two scrapes of a changing counter), and its template variables
     resolve to the running job.
  2. `batonctl trace` of the job is valid trace-event JSON with one track per stage, and
     per rank exactly the actions of the rank's clock (`batonctl plan --output json`).
  3. `promtool check metrics` passes on the coordinator's and a worker's /metrics;
     `promtool check config` passes on the shipped config and on the one used here.

usage: observability_test.py --bin-dir build/bin [--prometheus PATH] [--keep]
"""

import argparse
import collections
import json
import math
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import cluster_test  # noqa: E402  (the process harness: Cluster, check, wait_for)
from cluster_test import Failure, check, wait_for  # noqa: E402

SCRAPE_S = 1


WORKERS = 4  # two replicas of a two-stage pipeline


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=30):  # a bound on a hang: Prometheus answers in milliseconds
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def promtool(*args, stdin=None):
    r = subprocess.run(["promtool", *args], input=stdin, capture_output=True, text=True,
                       timeout=60)
    check(r.returncode == 0, f"promtool {' '.join(args)} failed:\n{r.stdout}{r.stderr}")
    return r.stdout + r.stderr


def local_scrape_config(tmp, coordinator_metrics, worker_metrics):
    """The shipped config with its targets replaced by the local ports, scraping every 1 s."""
    shipped = os.path.join(ROOT, "deploy", "prometheus", "prometheus.yml")
    text = open(shipped).read()
    text, n = re.subn(r"targets: \[coordinator:9470\]",
                      f"targets: [{coordinator_metrics}]", text)
    check(n == 1, f"{shipped}: no coordinator:9470 target to point at the local coordinator")
    text, n = re.subn(r"targets: \[worker-0:9471[^\]]*\]",
                      f"targets: [{', '.join(worker_metrics)}]", text)
    check(n == 1, f"{shipped}: no worker-N:9471 targets to point at the local workers")
    text = re.sub(r"scrape_interval: \S+", f"scrape_interval: {SCRAPE_S}s", text)
    text = re.sub(r"evaluation_interval: \S+", f"evaluation_interval: {SCRAPE_S}s", text)
    path = os.path.join(tmp, "prometheus.yml")
    with open(path, "w") as f:
        f.write(text)
    rules = os.path.join(ROOT, "deploy", "prometheus", "rules.yml")
    if os.path.exists(rules):
        shutil.copy(rules, os.path.join(tmp, "rules.yml"))
    promtool("check", "config", shipped)
    promtool("check", "config", path)
    return path


class Prometheus:
    def __init__(self, binary, config, tmp):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = os.path.join(tmp, "prometheus.log")
        argv = [binary, f"--config.file={config}",
                f"--storage.tsdb.path={os.path.join(tmp, 'tsdb')}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle"]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL,
                                         preexec_fn=cluster_test._die_with_parent)

        def ready():
            if self.proc.poll() is not None:
                raise Failure(f"prometheus exited {self.proc.returncode}:\n{self.tail()}")
            try:
                return http_get(self.url + "/-/ready", timeout=1) is not None
            except (urllib.error.URLError, ConnectionError, OSError):
                return False
        wait_for(ready, 60, "prometheus to be ready", interval=0.2)

    def tail(self, lines=15):
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def query(self, expr):
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            body = json.loads(http_get(url))
        except urllib.error.HTTPError as e:
            raise Failure(f"prometheus refused {expr!r}: {e.read().decode(errors='replace')}")
        check(body.get("status") == "success", f"query {expr!r}: {body}")
        return body["data"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def values(data):
    """The numeric values of an instant-query result (vector or scalar)."""
    if data["resultType"] == "scalar":
        return [float(data["result"][1])]
    return [float(s["value"][1]) for s in data["result"]]


def write_token_shards(tmp):
    """Raw uint16 training and validation shards (ids below the tiny gpt's 40) under
    tmp/data, the cluster's data root; returns their paths."""
    data = os.path.join(tmp, "data")
    os.makedirs(data, exist_ok=True)
    paths = []
    for name, tokens, salt in (("train.bin", 20000, 1), ("val.bin", 2000, 3)):
        path = os.path.join(data, name)
        with open(path, "wb") as f:
            f.write(struct.pack(f"<{tokens}H", *((i * 7 + salt * i // 5) % 40
                                                for i in range(tokens))))
        paths.append(path)
    return paths


def start_cluster(c, tmp):
    os.makedirs(os.path.join(tmp, "data"), exist_ok=True)  # the data root (token shards)
    coord_metrics_file = os.path.join(tmp, "coordinator.metrics")
    argv = [os.path.join(c.bin_dir, "coordinator"), "--listen", "127.0.0.1:0",
            "--data_root", os.path.join(tmp, "data"),
            "--db", c.db, "--port_file", os.path.join(tmp, "coordinator.port"),
            "--metrics_listen", "127.0.0.1:0", "--metrics_port_file", coord_metrics_file,
            "--heartbeat_interval", "0.5s", "--lease_ttl", "3s"]
    c.address = c._start("coordinator", argv, os.path.join(tmp, "coordinator.port"),
                         "the coordinator")
    coordinator_metrics = open(coord_metrics_file).read().strip()
    worker_metrics = []
    for i in range(1, WORKERS + 1):
        port_file = os.path.join(tmp, f"w-{i}.port")
        metrics_file = os.path.join(tmp, f"w-{i}.metrics")
        argv = [os.path.join(c.bin_dir, "worker"), "--coordinator", c.address,
                "--listen", "127.0.0.1:0", "--worker_id", f"w-{i}", "--port_file", port_file,
                "--data_root", os.path.join(tmp, "data"),
                "--metrics_listen", "127.0.0.1:0", "--metrics_port_file", metrics_file]
        c._start(f"w-{i}", argv, port_file, f"worker w-{i}")
        worker_metrics.append(wait_for(lambda: _read(metrics_file), 30,
                                       f"{metrics_file}"))
    c.wait_idle(WORKERS)
    print(f"  coordinator {c.address} (metrics {coordinator_metrics}), "
          f"worker metrics {' '.join(worker_metrics)}")
    return coordinator_metrics, worker_metrics


def _read(path):
    try:
        text = open(path).read().strip()
        return text or None
    except FileNotFoundError:
        return None


def check_endpoints(coordinator_metrics, worker_metrics):
    """promtool check metrics on both kinds of endpoint (after a job, so every family has
    series)."""
    for name, addr in (("coordinator", coordinator_metrics), ("worker", worker_metrics[0])):
        body = http_get(f"http://{addr}/metrics")
        check("baton_build_info{" in body, f"{name} /metrics has no baton_build_info:\n"
                                           f"{body[:500]}")
        out = promtool("check", "metrics", stdin=body)
        check(out.strip() == "", f"promtool check metrics on the {name} reported:\n{out}")
        families = sorted({line.split()[2] for line in body.splitlines()
                           if line.startswith("# TYPE baton_")})
        print(f"  promtool check metrics: {name} clean ({len(families)} baton_ families)")


def dashboard_exprs(job_id):
    r = subprocess.run([sys.executable, os.path.join(HERE, "dashboard_test.py"),
                        "--print-exprs", job_id], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"dashboard_test.py --print-exprs failed: {r.stderr}")
    exprs = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    check(len(exprs) >= 10, f"only {len(exprs)} dashboard expressions")
    return exprs


def check_dashboard(prom, job_id, timeout=120):
    """Polls until every dashboard expression has a numeric value; Failure names the ones
    that never did."""
    # The GPU row reads dcgm-exporter and the GPU workers' device times, which need GPUs:
    # none here, so they have no data.
    all_exprs = dashboard_exprs(job_id)
    gpu_only = ("DCGM_", "baton_worker_action_device_seconds")
    exprs = [e for e in all_exprs if not any(g in e["expr"] for g in gpu_only)]
    if len(exprs) < len(all_exprs):
        print(f"  {len(all_exprs) - len(exprs)} GPU-only expressions skipped: no GPUs")
    empty = []

    def all_have_data():
        empty.clear()
        for e in exprs:
            data = prom.query(e["expr"])
            if not [v for v in values(data) if not math.isnan(v)]:
                empty.append(f"  {e['panel']} [{e['refId']}]: {e['expr']} -> {data['result']}")
        return not empty
    try:
        wait_for(all_have_data, timeout, "every dashboard expression to return data",
                 interval=2)
    except Failure as e:
        raise Failure(f"{e}; without data:\n" + "\n".join(empty))
    print(f"  all {len(exprs)} dashboard expressions return data")


def check_variables(prom, job_id):
    """Every template variable of the dashboard resolves: its label_values(metric, label)
    query, asked of Prometheus as Grafana asks it, lists the running job."""
    with open(os.path.join(ROOT, "deploy", "grafana", "dashboards", "baton.json")) as f:
        variables = json.load(f).get("templating", {}).get("list", [])
    check(variables, "the dashboard has no template variables")
    for v in variables:
        query = v.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        m = re.fullmatch(r"\s*label_values\(\s*(\w+)\s*,\s*(\w+)\s*\)\s*", query or "")
        check(m, f"variable {v.get('name')}: query {query!r} is not label_values(metric, label)")
        metric, label = m.groups()
        url = (prom.url + f"/api/v1/label/{label}/values?" +
               urllib.parse.urlencode({"match[]": metric}))
        got = json.loads(http_get(url))["data"]
        check(job_id in got, f"variable {v['name']} ({query}) resolves to {got}, not {job_id}")
    print(f"  {len(variables)} dashboard variable(s) resolve to the running job")


def check_trace(c, tmp, job_id, spec_path):
    out = os.path.join(tmp, "trace.json")
    c.ctl_ok("trace", job_id, "-o", out)
    with open(out) as f:
        doc = json.load(f)  # valid JSON, or this raises
    events = doc["traceEvents"]
    step = doc["otherData"]["step"]
    done = int(c.get(job_id).get("steps_done", 0))  # read after the trace: the job runs on
    check(1 <= step <= done, f"trace of step {step}, but {done} steps are done")
    plan = json.loads(c.ctl_ok("plan", "-f", spec_path, "--output", "json").stdout)
    num_stages = plan["num_stages"]
    num_ranks = len(plan["ranks"])
    replicas = int(c.get(job_id).get("pipeline", {}).get("data_parallel", 1) or 1)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    tracks = {k for k, v in names.items() if v.startswith("stage ")}
    comm = {k for k, v in names.items() if v == "gradient all-reduce"}
    # Global rank d * S + r runs replica d's copy of stage r's clock.
    check(len(tracks) == num_stages * replicas,
          f"{len(tracks)} stage tracks for {num_stages} stages x {replicas} replicas: "
          f"{sorted(tracks)}")
    for d in range(replicas):
        for stage, rank in enumerate(plan["stage_to_rank"]):
            check((d * num_ranks + rank, stage) in tracks,
                  f"no track for stage {stage} on rank {rank} of replica {d}")
    check(len(comm) == (num_ranks * replicas if replicas > 1 else 0),
          f"{len(comm)} all-reduce tracks for {num_ranks} ranks x {replicas} replicas")
    for e in events:
        if e["ph"] != "X":
            continue
        check((e["pid"], e["tid"]) in names, f"event on an unnamed track: {e}")
        check(e["dur"] >= 0 and e["ts"] >= 0, f"negative time: {e}")
    for pid in range(num_ranks * replicas):
        clock = collections.Counter(plan["ranks"][pid % num_ranks])
        got = collections.Counter(e["name"] for e in events
                                  if e["ph"] == "X" and e["pid"] == pid
                                  and e["cat"] not in ("send_wait", "allreduce"))
        check(got == clock,
              f"rank {pid}: trace actions differ from its clock: "
              f"missing {clock - got}, extra {got - clock}")
        reduces = sum(n for a, n in clock.items() if "REDUCE_GRAD" in a)
        allreduces = sum(1 for e in events
                         if e["ph"] == "X" and e["pid"] == pid and e["cat"] == "allreduce")
        check(allreduces == reduces,
              f"rank {pid}: {allreduces} all-reduce spans for {reduces} REDUCE_GRAD actions")
    # An earlier step by number; a step not run yet is NOT_FOUND, naming the kept steps.
    if step > 1:
        c.ctl_ok("trace", job_id, "--step", str(step - 1), "-o",
                 os.path.join(tmp, "earlier.json"))
    r = c.ctl("trace", job_id, "--step", "999999999")
    check(r.returncode == 1 and "NOT_FOUND" in r.stderr and "are kept" in r.stderr,
          f"step 999999999: {r.returncode} {r.stderr}")
    print(f"  trace: {num_stages} stages x {replicas} replicas, "
          f"{sum(len(x) for x in plan['ranks'])} actions per replica as in the clocks, "
          f"{len(comm)} all-reduce tracks")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--prometheus", default=shutil.which("prometheus") or "/usr/bin/prometheus")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    for tool in (args.prometheus, shutil.which("promtool")):
        if not tool or not os.path.exists(tool):
            print("observability_test: needs prometheus and promtool (Debian package "
                  "`prometheus`; scripts/setup.sh installs it)", file=sys.stderr)
            return 1

    tmp = tempfile.mkdtemp(prefix="baton-observability-")
    c = cluster_test.Cluster(os.path.abspath(args.bin_dir), None, tmp)
    prom = None
    ok = False
    try:
        print("observability: cluster, Prometheus, a job")
        coordinator_metrics, worker_metrics = start_cluster(c, tmp)
        prom = Prometheus(args.prometheus,
                          local_scrape_config(tmp, coordinator_metrics, worker_metrics), tmp)

        def all_up():
            data = prom.query("up")
            ups = {s["metric"]["instance"]: s["value"][1] for s in data["result"]}
            return len(ups) == WORKERS + 1 and all(v == "1" for v in ups.values())
        wait_for(all_up, 30, "Prometheus to scrape every service", interval=0.5)

        # Runs until cancelled: the dashboard is checked while the job trains, as a user
        # watches it, however fast this machine is.
        # Two replicas of a two-stage interleaved pipeline: every panel has data, the
        # data-parallel ones included.
        # It trains on token shards with validation every 2 steps, a learning-rate schedule
        # and clipping, so the panels of those have data too.
        train, val = write_token_shards(tmp)
        spec = cluster_test.tiny_gpt("observed", steps=1000000, microbatches=4,
                                     schedule="SCHEDULE_INTERLEAVED_1F1B", stages=2,
                                     virtualStages=2, dataParallel=2)
        spec["data"] = {"tokens": {"train": [train], "val": [val]}, "batchSize": 8}
        spec["eval"] = {"every": 2, "batches": 1}
        spec["optimizer"] = {"adamw": {"learningRate": 0.003},
                             "lrSchedule": {"warmupSteps": 10, "decay": "LR_DECAY_COSINE",
                                            "minLr": 0.0003},
                             "clipGradNorm": 1.0}
        spec_path = c.write_spec(spec)
        job_id = c.submit(spec_path)["id"]
        c.wait_steps(job_id, 5, timeout=120)

        check_dashboard(prom, job_id)
        check_variables(prom, job_id)
        check_trace(c, tmp, job_id, spec_path)
        job = c.ctl_json("cancel", job_id, "--reason", "observability test done")
        check(job["state"] == "JOB_STATE_CANCELLED", f"cancel left the job {job['state']}")
        check_endpoints(coordinator_metrics, worker_metrics)
        ok = True
        print("observability: ok")
        return 0
    except Failure as e:
        print(f"observability: FAILED: {e}", file=sys.stderr)
        for name in list(c.logs):
            print(f"---- {name} log (tail)\n{c.tail(name)}", file=sys.stderr)
        if prom is not None:
            print(f"---- prometheus log (tail)\n{prom.tail()}", file=sys.stderr)
        return 1
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        if prom is not None:
            prom.stop()
        c.stop_all()
        if args.keep or not ok:
            print(f"observability: files kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
