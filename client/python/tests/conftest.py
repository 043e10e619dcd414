"""A real cluster for the client's tests: a coordinator and 4 workers from build/bin on
loopback (tests/cluster_test.py's harness), started once per session and stopped at the
end, with every wait bounded.

    pytest client/python/tests --bin-dir build/bin

The package under test is the installed one (scripts/python-client-test.sh installs it
into a fresh virtual environment); nothing here imports client/python/src directly.
"""

import contextlib
import os
import shutil
import socket
import sys
import tempfile
import threading

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests"))

import cluster_test  # noqa: E402  (the harness: Cluster, tiny_gpt)

NUM_WORKERS = 4


def pytest_addoption(parser):
    parser.addoption("--bin-dir", default=os.path.join(REPO, "build", "bin"),
                     help="where coordinator, worker and batonctl are")


def start_cluster(bin_dir, tmp, workers, configure=None):
    for binary in ("batonctl", "coordinator", "worker"):
        if not os.access(os.path.join(bin_dir, binary), os.X_OK):
            pytest.fail(f"{bin_dir}/{binary} is missing: build first (scripts/build.sh)")
    c = cluster_test.Cluster(bin_dir, os.path.join(REPO, "client", "examples"), tmp)
    try:
        if configure is not None:
            configure(c)
        c.start_coordinator()
        for i in range(1, workers + 1):
            c.start_worker(f"w-{i}")
        c.wait_idle(workers, timeout=30)
    except BaseException:
        c.stop_all()
        raise
    return c


@contextlib.contextmanager
def running_cluster(request, name, workers, configure=None):
    """A cluster in a temp dir of its own, stopped and removed on exit. configure(c) runs
    before anything starts (flags, certificates in c.tmp)."""
    tmp = tempfile.mkdtemp(prefix=f"baton-python-client-{name}.")
    c = None
    try:
        c = start_cluster(request.config.getoption("--bin-dir"), tmp, workers, configure)
        yield c
    finally:
        if c is not None:
            c.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster(request):
    with running_cluster(request, "test", NUM_WORKERS) as c:
        yield c


@pytest.fixture
def client(cluster):
    import baton
    with baton.Client(cluster.address, timeout=20) as c:
        yield c


@pytest.fixture
def idle(cluster):
    """Every worker idle before and after the test (a test that leaves a job running would
    hold up the next one's)."""
    cluster.wait_idle(NUM_WORKERS, timeout=60)
    yield cluster
    cluster.wait_idle(NUM_WORKERS, timeout=60)


def tiny_gpt(name, steps=6, stages=2, **pipeline):
    """A job of a second or two on 2 workers."""
    return cluster_test.tiny_gpt(name, steps=steps, stages=stages, **pipeline)


@contextlib.contextmanager
def tarpit():
    """The address of a port that accepts connections and never answers, until exit."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        held = []
        stop = threading.Event()

        def accept():
            listener.settimeout(0.2)
            while not stop.is_set():
                try:
                    held.append(listener.accept()[0])
                except OSError:
                    pass

        t = threading.Thread(target=accept, daemon=True)
        t.start()
        try:
            yield f"127.0.0.1:{listener.getsockname()[1]}"
        finally:
            stop.set()
            t.join(timeout=5)
            for conn in held:
                conn.close()
