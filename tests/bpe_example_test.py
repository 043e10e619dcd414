#!/usr/bin/env python3
"""The example GPT-2 on real BPE tokens trains, evaluates, and equals train-local.

  1. scripts/prepare-data.py makes llm.c shards of the GNU licence texts (the GPL family in
     /usr/share/common-licenses) with a 512-token byte-level BPE, as the demo does.
  2. `batonctl train-local` trains client/examples/gpt2-gpl-bpe.json (warmup and cosine,
     clipping at 1.0, validation every 50 steps) for its 300 steps: the training loss ends
     below TRAIN_BELOW and the validation loss below VAL_BELOW (both start at ln 512 = 6.24),
     and every evaluation's loss is below the one before.
  3. The same spec as a cluster job on 4 workers (4 stages, 1F1B) ends with train-local's
     weights digest, and its history has the same validation losses.

usage: bpe_example_test.py --bin-dir build/bin --examples client/examples
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import cluster_test  # noqa: E402
from cluster_test import Failure, check  # noqa: E402

LICENSES = "/usr/share/common-licenses"
TEXTS = ["GPL-1", "GPL-2", "GPL-3", "LGPL-2", "LGPL-2.1", "LGPL-3", "GFDL-1.2", "GFDL-1.3"]
TRAIN_BELOW = 2.6
VAL_BELOW = 3.8


def prepare(data_dir):
    venv = subprocess.run([os.path.join(ROOT, "scripts", "data-venv.sh")], capture_output=True,
                          text=True, timeout=600)
    check(venv.returncode == 0, f"scripts/data-venv.sh failed: {venv.stderr[-800:]}")
    out = os.path.join(data_dir, "gpl-bpe")
    r = subprocess.run([os.path.join(venv.stdout.strip(), "bin", "python"),
                        os.path.join(ROOT, "scripts", "prepare-data.py"), "--vocab-size", "512",
                        "--context", "64", "-o", out,
                        *[os.path.join(LICENSES, t) for t in TEXTS]],
                       capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, f"prepare-data.py failed: {r.stderr[-800:]}")
    print("  " + (r.stdout + r.stderr).strip().splitlines()[-1])
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--examples", required=True)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="baton-bpe-test.")
    data = os.path.join(tmp, "data")
    c = cluster_test.Cluster(args.bin_dir, args.examples, tmp)
    ok = False
    try:
        shards = prepare(data)
        example = json.load(open(os.path.join(args.examples, "gpt2-gpl-bpe.json")))
        # train-local has no data roots: the same spec with absolute shard paths.
        local = json.loads(json.dumps(example))
        for split in ("train", "val"):
            local["data"]["tokens"][split] = [os.path.join(data, p)
                                              for p in example["data"]["tokens"][split]]
        local_path = os.path.join(tmp, "local.json")
        json.dump(local, open(local_path, "w"))
        r = c.ctl_ok("train-local", "-f", local_path, "--output", "json", timeout=600)
        report = json.loads(r.stdout)
        steps = report["steps"]
        vals = [(int(s["step"]), s["val_loss"]) for s in steps if "val_loss" in s]
        final = steps[-1]["loss"]
        print(f"  train-local: loss {steps[0]['loss']:.3f} -> {final:.3f}; validation "
              + ", ".join(f"{v:.3f} at {k}" for k, v in vals))
        check(final < TRAIN_BELOW, f"the training loss ended at {final}, not below {TRAIN_BELOW}")
        check([k for k, _ in vals] == [50, 100, 150, 200, 250, 300],
              f"evaluations after steps {[k for k, _ in vals]}, not every 50")
        check(vals[-1][1] < VAL_BELOW,
              f"the validation loss ended at {vals[-1][1]}, not below {VAL_BELOW}")
        check(all(b < a for (_, a), (_, b) in zip(vals, vals[1:])),
              f"the validation loss did not fall at every evaluation: {vals}")
        want = report["weights_digest"]

        c.coordinator_flags = ["--data_root", data]
        c.worker_flags = lambda worker_id: ["--data_root", data]
        c.start_coordinator()
        for i in range(1, 5):
            c.start_worker(f"w-{i}")
        c.wait_idle(4)
        job_id = c.submit(os.path.join(args.examples, "gpt2-gpl-bpe.json"))["id"]
        job = c.wait_state(job_id, cluster_test.TERMINAL, 600)
        check(job["state"] == "JOB_STATE_SUCCEEDED",
              f"{job['state']}: {cluster_test.last_reason(job)}")
        check(job["weights_digest"] == want,
              f"cluster digest {job['weights_digest']} != train-local's {want}")
        history = c.ctl_json("history", job_id)
        cluster_vals = [(int(s["step"]), s["val_loss"]) for s in history["steps"]
                        if "val_loss" in s]
        check(cluster_vals == vals, f"the cluster's validation losses {cluster_vals} differ "
                                    f"from train-local's {vals}")
        mfu = [s.get("mfu", 0) for s in history["steps"]]
        check(all(0 < m < 1 for m in mfu), f"steps without an MFU: {mfu[:5]}")
        print(f"  {job_id}: SUCCEEDED on 4 workers, digest and validation losses equal "
              f"train-local's ({want[:16]}...), MFU {min(mfu):.2%}..{max(mfu):.2%} of the "
              f"CPUs' measured peak")
        ok = True
    except Failure as e:
        print(f"bpe_example_test: FAIL: {e}")
        for name in list(c.procs):
            print(c.tail(name))
    finally:
        c.stop_all()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"files kept in {tmp}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
