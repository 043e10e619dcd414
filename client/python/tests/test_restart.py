"""wait() rides out a coordinator restart: a job with checkpoints and `restart` is failed by
the restart, recovered from its newest checkpoint, and succeeds; the client waiting on it
all along returns the successful job, whose digest equals the reference trainer's."""

import os
import signal
import threading

import pytest

import baton

from conftest import running_cluster, tiny_gpt


@pytest.fixture(scope="module")
def own_cluster(request):
    with running_cluster(request, "restart", 2) as c:
        yield c


# Long enough to be still running when the coordinator stops, however slowly this test gets
# there on a loaded machine (a step takes milliseconds); the recovery below says it was.
STEPS = 1500


def test_wait_rides_out_a_coordinator_restart(own_cluster):
    c = own_cluster
    spec = tiny_gpt("py-restart", steps=STEPS)
    spec["checkpoint"] = {"everySteps": 5, "dir": os.path.join(c.tmp, "ckpt")}
    spec["restart"] = {"maxRestarts": 2}
    path = c.write_spec(spec)
    client = baton.Client(c.address, timeout=10)
    job = client.submit(path)
    for event in client.watch(job, timeout=120):
        if isinstance(event, baton.StepEvent) and event.step >= 12:
            break
    outcome = {}
    # The coordinator goes away after wait() had its first answer (one unreachable from the
    # start is an error at once).
    answered = threading.Event()
    first_get = client.get

    def get(j):
        snapshot = first_get(j)
        answered.set()
        return snapshot
    client.get = get

    def waiter():
        try:
            outcome["job"] = client.wait(job, timeout=240)
        except BaseException as e:  # reported below
            outcome["error"] = e
    t = threading.Thread(target=waiter)
    t.start()
    assert answered.wait(timeout=30), "wait() did not ask for the job"
    port = c.address.rsplit(":", 1)[1]
    assert c.stop("coordinator", signal.SIGTERM) == 0
    c.start_coordinator(listen=f"127.0.0.1:{port}")
    t.join(timeout=300)
    assert not t.is_alive(), "wait() did not return"
    assert "error" not in outcome, f"wait() raised {outcome.get('error')!r}"
    done = outcome["job"]
    assert done.state == "SUCCEEDED" and done.steps_done == STEPS
    assert len(done.proto.recoveries) >= 1, \
        f"{done.id} has no recovery: it ended before the coordinator stopped"
    assert "coordinator restarted" in done.proto.recoveries[0].reason
    assert done.weights_digest == c.reference_digest(path)
    # Steps the ranks finished while the coordinator was down were never reported (on 2
    # cores the rest of this job may run in that gap; the ranks then resume from their
    # newest checkpoint, the last step): the history holds what was reported, in order.
    steps = done.history().step
    assert steps[:12] == list(range(1, 13)) and steps == sorted(set(steps))
    assert steps[-1] <= STEPS
    client.close()
