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
  4. bf16 mixed precision (docs/precision.md): train-local --precision bf16 tracks the fp32
     curve (each 25-step window's mean loss within BF16_WINDOW_TOL of fp32's, every
     validation loss within BF16_VAL_TOL), and the bf16 cluster job ends with train-local's
     bf16 digest, sending half the bytes between stages of the fp32 job. Both jobs'
     tokens/s and bytes are printed (docs/benchmarks.md).

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
BF16_WINDOW_TOL = 0.01
BF16_VAL_TOL = 0.02


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


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def check_bf16_tracks_fp32(fp32, bf16):
    """bf16's loss curve stays within the stated tolerances of fp32's."""
    check(len(fp32) == len(bf16), f"{len(bf16)} bf16 steps, {len(fp32)} fp32")
    a = [s["loss"] for s in fp32]
    b = [s["loss"] for s in bf16]
    check(a != b, "bf16 gave the fp32 losses: nothing was rounded")
    worst = 0.0
    for i in range(0, len(a), 25):
        wa, wb = a[i:i + 25], b[i:i + 25]
        worst = max(worst, abs(sum(wa) / len(wa) - sum(wb) / len(wb)))
    va = [s["val_loss"] for s in fp32 if "val_loss" in s]
    vb = [s["val_loss"] for s in bf16 if "val_loss" in s]
    check(len(va) == len(vb) > 0, f"validation losses: fp32 {va}, bf16 {vb}")
    val_worst = max(abs(x - y) for x, y in zip(va, vb))
    print(f"  bf16 vs fp32 over {len(a)} steps: 25-step window means differ by at most "
          f"{worst:.4f} (bound {BF16_WINDOW_TOL}), validation losses by at most "
          f"{val_worst:.4f} (bound {BF16_VAL_TOL}); final loss bf16 {b[-1]:.4f}, fp32 {a[-1]:.4f}")
    check(worst <= BF16_WINDOW_TOL, f"bf16 window means differ by {worst} > {BF16_WINDOW_TOL}")
    check(val_worst <= BF16_VAL_TOL, f"bf16 validation differs by {val_worst} > {BF16_VAL_TOL}")


def wire_bytes(c, job_id, tmp):
    """The bytes every rank sent to another stage in the job's latest traced step."""
    path = os.path.join(tmp, f"{job_id}.trace.json")
    c.ctl_ok("trace", job_id, "-o", path)
    events = json.load(open(path))
    events = events["traceEvents"] if isinstance(events, dict) else events
    return sum(e.get("args", {}).get("bytes", 0) for e in events
               if "SEND" in e.get("name", "") and not e["name"].startswith("wait"))


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
        r16 = c.ctl_ok("train-local", "-f", local_path, "--precision", "bf16", "--output",
                       "json", timeout=600)
        report16 = json.loads(r16.stdout)
        check_bf16_tracks_fp32(report["steps"], report16["steps"])
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
        # The same job in bf16: train-local's bf16 digest, half the bytes on the wire.
        bf16_spec = json.load(open(os.path.join(args.examples, "gpt2-gpl-bpe.json")))
        bf16_spec["precision"] = "PRECISION_BF16"
        bf16_path = os.path.join(tmp, "bf16.json")
        json.dump(bf16_spec, open(bf16_path, "w"))
        job16 = c.submit(bf16_path)["id"]
        done16 = c.wait_state(job16, cluster_test.TERMINAL, 600)
        check(done16["state"] == "JOB_STATE_SUCCEEDED",
              f"bf16: {done16['state']}: {cluster_test.last_reason(done16)}")
        check(done16["weights_digest"] == report16["weights_digest"],
              f"bf16 cluster digest {done16['weights_digest']} != train-local's "
              f"{report16['weights_digest']}")
        fp32_bytes, bf16_bytes = wire_bytes(c, job_id, tmp), wire_bytes(c, job16, tmp)
        check(fp32_bytes > 0 and 2 * bf16_bytes == fp32_bytes,
              f"bytes between stages in a step: fp32 {fp32_bytes}, bf16 {bf16_bytes}")
        tps = [median([s["tokens_per_second"] for s in c.ctl_json("history", j)["steps"]])
               for j in (job_id, job16)]
        print(f"  {job16}: bf16 SUCCEEDED, digest equals train-local --precision bf16; bytes "
              f"between stages per step {bf16_bytes} (fp32 {fp32_bytes}); median tokens/s "
              f"bf16 {tps[1]:.0f}, fp32 {tps[0]:.0f} ({tps[1] / tps[0]:.2f}x)")
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
