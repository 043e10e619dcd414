#!/usr/bin/env python3
"""Submits the example GPT job, watches it with a progress bar, and saves its loss curve.

    pip install ./client/python matplotlib tqdm
    scripts/demo.sh --serve &                 # or any cluster: --coordinator HOST:PORT
    python client/examples/python/plot_loss.py --steps 100 -o loss.png

The coordinator, token and TLS come from --coordinator or the environment batonctl uses
($BATON_COORDINATOR, $BATON_TOKEN, $BATON_TLS_CA). Exits 1 when the job does not succeed,
saying why.
"""

import argparse
import os
import sys

import baton

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--coordinator", help="host:port (default $BATON_COORDINATOR, "
                        "else 127.0.0.1:7070)")
    parser.add_argument("--spec", default=os.path.join(HERE, "..", "gpt.json"),
                        help="job spec (default: client/examples/gpt.json)")
    parser.add_argument("--steps", type=int, help="override the spec's steps")
    parser.add_argument("--stages", type=int, help="override the spec's pipeline stages")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait")
    parser.add_argument("-o", "--output", default="loss.png", help="PNG to write")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    args = parser.parse_args()

    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    overrides = {}
    if args.steps:
        overrides["steps"] = args.steps
    if args.stages:
        overrides["pipeline__stages"] = args.stages

    with baton.Client(args.coordinator) as client:
        job = client.submit(args.spec, **overrides)
        print(f"submitted {job.id} ({job.name}) to {client.address}")
        for _ in client.watch(job, progress=not args.no_progress, timeout=args.timeout):
            pass
        try:
            job = client.wait(job, timeout=60)
        except baton.JobError as e:
            print(f"{e.job.id} did not succeed: {e.reason}", file=sys.stderr)
            return 1
        history = job.history()

    fig, loss_axis = plt.subplots(figsize=(8, 4.5))
    loss_axis.plot(history.step, history.loss, color="tab:blue", label="loss")
    loss_axis.set_xlabel("step")
    loss_axis.set_ylabel("loss (mean over micro-batches)")
    speed_axis = loss_axis.twinx()
    speed_axis.plot(history.step, history.tokens_per_second, color="tab:gray", alpha=0.4,
                    linewidth=0.8, label="tokens/s")
    speed_axis.set_ylabel("tokens/s")
    loss_axis.set_title(f"{job.id} {job.name}: {len(history)} steps, "
                        f"final loss {history.loss[-1]:.4f}")
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"{job.id} {job.state}: final loss {history.loss[-1]:.4f}, "
          f"digest {job.weights_digest[:16]}...; loss curve in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
