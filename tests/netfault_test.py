#!/usr/bin/env python3
"""Real network faults between hosts: workers on their own network namespaces.

Each worker runs in its own network namespace (`ip netns`), joined to the coordinator's
namespace by a veth pair on a bridge: several hosts on one machine, with real links to
break. Needs root (CAP_NET_ADMIN); without it, or without the kernel features, the test
says why and exits 77 (ctest: skipped). Everything it creates is removed at the end.

Cases:
  1. A worker's link cut mid-job (its veth down): the job, with restart, notices (the lease
     TTL, 2 s, or a neighbour's transport), recovers on the other workers and a spare from
     its last checkpoint, naming the cut-off worker, and ends with the uninterrupted run's
     digest; once the link is back, the cut-off worker drops its job and is IDLE again.
  2. Delay and loss on one link (`tc netem delay 20ms loss 1%`): the job still ends with the
     uninterrupted run's digest. Skipped, saying so, where the kernel has no netem.

usage: netfault_test.py --bin-dir build/bin [--keep]
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_test import (HANG_S, Cluster, Failure, check, last_reason,  # noqa: E402
                          run_cases, tiny_gpt, wait_for)
from recovery_test import (LEASE_TTL_S, RECOVERED_STEPS, TERMINAL,  # noqa: E402
                           check_recovered, complete_steps, wait_checkpoint)

SKIP = 77


def sh(*args, check_rc=True):
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if check_rc and r.returncode != 0:
        raise Failure(f"{' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
    return r


class Net:
    """A bridge in this namespace (the coordinator's host) and one namespace per worker."""

    def __init__(self):
        tag = os.getpid() % 100000
        self.subnet = f"10.{200 + tag % 50}.{tag % 250}"
        self.bridge = f"btb{tag}"
        self.hub_ip = f"{self.subnet}.1"
        self.hosts = {}  # worker id -> (namespace, host-side veth, ip)
        self.made_bridge = False

    def up(self):
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        self.made_bridge = True
        # A bridge without an address of its own takes the lowest of its ports' MACs, so
        # adding a worker's veth could change it under the workers already running: their
        # neighbour entries then name the old MAC, their frames to the coordinator are
        # dropped, and TCP's own traffic keeps the stale entry "reachable" (an idle worker
        # lost its lease that way). A fixed, locally administered address never changes.
        tag = os.getpid() % 100000
        sh("ip", "link", "set", self.bridge, "address",
           f"02:ba:70:{tag >> 16 & 0xff:02x}:{tag >> 8 & 0xff:02x}:{tag & 0xff:02x}")
        sh("ip", "addr", "add", f"{self.hub_ip}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")

    def add_host(self, worker_id, index):
        tag = os.getpid() % 100000
        ns = f"bt{tag}-{worker_id}"
        veth, peer = f"bt{tag}h{index}", f"bt{tag}n{index}"
        ip = f"{self.subnet}.{10 + index}"
        sh("ip", "netns", "add", ns)
        self.hosts[worker_id] = (ns, veth, ip)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
        sh("ip", "link", "set", peer, "netns", ns)
        sh("ip", "link", "set", veth, "master", self.bridge)
        sh("ip", "link", "set", veth, "up")
        sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", peer)
        sh("ip", "-n", ns, "link", "set", peer, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        return ns, ip

    def link(self, worker_id, up):
        sh("ip", "link", "set", self.hosts[worker_id][1], "up" if up else "down")

    def down(self):
        for ns, veth, _ in self.hosts.values():
            sh("ip", "link", "del", veth, check_rc=False)
            sh("ip", "netns", "del", ns, check_rc=False)
        if self.made_bridge:
            sh("ip", "link", "del", self.bridge, check_rc=False)


class NetCluster(Cluster):
    """The cluster_test harness with each worker on its own namespace."""

    def __init__(self, bin_dir, tmp, net):
        super().__init__(bin_dir, "", tmp)
        self.net = net
        self.index = 0
        # The test's own bridge between namespaces: plaintext, asked for explicitly.
        self.coordinator_flags = ["--insecure"]

    def start_worker(self, worker_id):
        if worker_id not in self.net.hosts:
            self.index += 1
            self.net.add_host(worker_id, self.index)
        ns, _, ip = self.net.hosts[worker_id]
        port_file = os.path.join(self.tmp, f"{worker_id}.port")
        argv = ["ip", "netns", "exec", ns, os.path.join(self.bin_dir, "worker"),
                "--coordinator", self.address, "--listen", f"{ip}:0",
                "--worker_id", worker_id, "--port_file", port_file, "--insecure",
                "--checkpoint_root", self.tmp]
        address = self._start(worker_id, argv, port_file, f"worker {worker_id} in {ns}")
        self.worker_addresses[worker_id] = address
        print(f"  worker {worker_id} listening on {address} (namespace {ns})")
        return address


def restart_spec(c, ckpt, name, steps, stages):
    spec = tiny_gpt(name, steps=steps, stages=stages)
    plain = c.write_spec(spec)
    spec["checkpoint"] = {"everySteps": 5, "dir": ckpt}
    spec["restart"] = {"maxRestarts": 2, "minStages": 2}
    return c.write_spec(spec), plain


def case_link_cut(c, ckpt):
    c.ensure_workers(4)
    spec, plain = restart_spec(c, ckpt, "link-cut", RECOVERED_STEPS, stages=3)
    job_id = c.submit(spec)["id"]
    wait_checkpoint(c, job_id, 10)
    job = c.get(job_id)
    victim = job["workers"][1]
    start = time.monotonic()
    c.net.link(victim, up=False)
    print(f"  cut the link of {victim} (rank 1) at step {job['steps_done']}")
    try:
        job = wait_for(lambda: (lambda j: j if j.get("recoveries") or j["state"] in TERMINAL
                                else None)(c.get(job_id)), HANG_S,
                       f"{job_id} to notice the cut")
        detect = time.monotonic() - start
        print(f"  {job_id} {job['state']} {detect:.1f} s after the cut (lease TTL "
              f"{LEASE_TTL_S:g} s): "
              f"{(job.get('recoveries') or [{}])[0].get('reason', last_reason(job))[:120]}")
        job = c.wait_state(job_id, TERMINAL, 2 * HANG_S)
        check_recovered(c, job, plain, stages_after=3, lost=victim)
        check(victim not in job["workers"], f"the cut-off {victim} is among {job['workers']}")
    finally:
        c.net.link(victim, up=True)
    # Back on the network: it learns its lease is gone, drops the job, registers again.
    c.wait_idle(4, timeout=HANG_S, ids=["w-1", "w-2", "w-3", "w-4"])
    print(f"  link of {victim} restored; all 4 workers IDLE")


def case_netem(c, ckpt):
    c.ensure_workers(3)
    ns, _, _ = c.net.hosts["w-2"]
    r = sh("ip", "-n", ns, "link", "show", check_rc=True)
    dev = [line.split(":")[1].strip().split("@")[0] for line in r.stdout.splitlines()
           if ": bt" in line]
    check(dev, f"no veth in {ns}: {r.stdout}")
    q = sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev[0], "root", "netem",
           "delay", "20ms", "loss", "1%", check_rc=False)
    if q.returncode != 0:
        print(f"  SKIP: tc netem is not available here ({q.stderr.strip()}); the delay and "
              f"loss case needs a kernel with sch_netem")
        return "skipped"
    try:
        spec = c.write_spec(tiny_gpt("netem", steps=30, stages=3))
        job = c.wait_state(c.submit(spec)["id"], TERMINAL, 2 * HANG_S)
        check(job["state"] == "JOB_STATE_SUCCEEDED", f"{job['id']} {job['state']}: "
                                                     f"{last_reason(job)}")
        check(job["weights_digest"] == c.reference_digest(spec),
              "with delay and loss on a link the digest differs from the reference")
        print(f"  {job['id']} over a 20 ms, 1% loss link: digest matches")
    finally:
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev[0], "root",
           check_rc=False)


CASES = [
    ("1", "a worker's link cut mid-job: recovered without it, bit-exact; back IDLE after",
     case_link_cut),
    ("2", "delay and loss on one link (tc netem): bit-exact", case_netem),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("netfault_test: SKIP: needs root (network namespaces, veth, a bridge)")
        return SKIP
    if shutil.which("ip") is None or shutil.which("tc") is None:
        print("netfault_test: SKIP: needs ip and tc (Debian iproute2; scripts/setup.sh "
              "installs it)")
        return SKIP
    net = Net()
    try:
        net.up()
    except Failure as e:
        print(f"netfault_test: SKIP: cannot make a bridge here: {e}")
        net.down()
        return SKIP

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)

    tmp = tempfile.mkdtemp(prefix="baton-netfault-test.")
    ckpt = os.path.join(tmp, "ckpt")
    c = NetCluster(args.bin_dir, tmp, net)
    passed, failed, skipped = [], [], []
    try:
        c.start_coordinator(listen=f"{net.hub_ip}:0")
        passed, failed, skipped = run_cases(c, CASES, set(), args=(ckpt,), tail_all=True,
                                            tail_lines=10)
    except Failure as e:
        print(f"netfault_test: {e}")
        failed.append("setup")
    except KeyboardInterrupt as e:
        print(f"netfault_test: interrupted ({e})")
        failed.append("interrupted")
    finally:
        c.stop_all()
        net.down()
        if args.keep or failed:
            print(f"\nlogs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{len(passed)} passed, {len(failed)} failed, {len(skipped)} skipped"
          + (f" (failed: {', '.join(failed)})" if failed else ""))
    return 0 if not failed and passed else 1


if __name__ == "__main__":
    sys.exit(main())
