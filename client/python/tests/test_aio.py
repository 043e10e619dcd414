"""baton.aio against the same real cluster (conftest.py): jobs submitted, waited for and
watched concurrently from one event loop end with train-local's digests; cancelling,
errors and deadlines as baton.Client's."""

import asyncio
import contextlib
import socket
import time

import pytest

import baton
import baton.aio

from conftest import NUM_WORKERS, tarpit, tiny_gpt


def run(coro, timeout=300):
    """Runs a test's coroutine on a fresh event loop, bounded."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_concurrent_jobs_end_with_train_locals_digests(cluster, idle):
    paths = [idle.write_spec(tiny_gpt(f"aio-{s}", steps=s, schedule="SCHEDULE_1F1B"))
             for s in (4, 6)]

    async def main():
        async with baton.aio.Client(cluster.address, timeout=20) as client:
            jobs = [await client.submit(p) for p in paths]
            assert all(isinstance(j, baton.aio.AsyncJob) for j in jobs)
            assert all(j.state in ("QUEUED", "PLACING", "RUNNING") for j in jobs)
            # Both run at once (2 stages each on 4 workers), waited for together.
            done = await asyncio.gather(*(client.wait(j, timeout=120) for j in jobs))
            history = await done[1].history()
            # Many calls in flight on one channel.
            again = await asyncio.gather(*(client.get(j) for j in jobs * 20))
            workers = await client.workers()
            refreshed = await done[0].refresh()
            return done, history, again, workers, refreshed

    done, history, again, workers, refreshed = run(main())
    for job, path, steps in zip(done, paths, (4, 6)):
        assert job.state is baton.JobState.SUCCEEDED and job.succeeded
        assert job.steps_done == job.total_steps == steps
        assert job.weights_digest == idle.reference_digest(path)
    assert history.step == [1, 2, 3, 4, 5, 6] and history.loss[-1] == done[1].last_loss
    assert [j.id for j in again] == [j.id for j in done] * 20
    assert all(j.state == "SUCCEEDED" for j in again)
    assert sorted(w.id for w in workers) == [f"w-{i}" for i in range(1, NUM_WORKERS + 1)]
    assert refreshed.weights_digest == done[0].weights_digest
    assert repr(refreshed).startswith(f"AsyncJob(id={done[0].id!r}")


def test_watch_list_trace_and_cancel(cluster, idle):
    async def main():
        async with baton.aio.Client(cluster.address, timeout=20) as client:
            job = await client.submit(tiny_gpt("aio-cancel", steps=100000))
            seen = []
            async with contextlib.aclosing(job.watch(timeout=60)) as events:
                async for event in events:
                    seen.append(event)
                    if isinstance(event, baton.StepEvent):
                        break
            listed = [j.id async for j in client.list(page_size=2)]
            cancelled = await job.cancel("enough from asyncio")
            with pytest.raises(baton.JobCancelled) as e:
                await client.wait(job, timeout=10)
            # A finished job's watch: its state, then the end.
            ended = [ev async for ev in client.watch(job, timeout=10)]
            short = await client.wait(await client.submit(tiny_gpt("aio-trace", steps=2)),
                                      timeout=120)
            trace = await short.trace()
            with pytest.raises(baton.ConfigError):
                await client.trace(short, step=0)
            return job, seen, listed, cancelled, e.value, ended, trace

    job, seen, listed, cancelled, error, ended, trace = run(main())
    assert isinstance(seen[0], baton.StateEvent) and isinstance(seen[-1], baton.StepEvent)
    assert seen[-1].step >= 1 and seen[-1].loss > 0
    assert listed[0] == job.id and len(listed) == len(set(listed))
    assert cancelled.state == "CANCELLED" and "enough from asyncio" in cancelled.reason
    assert error.job.id == job.id and "enough from asyncio" in error.reason
    assert [type(ev) for ev in ended] == [baton.StateEvent]
    assert ended[0].state == "CANCELLED"
    assert trace["otherData"]["step"] == 2
    assert {"0F0", "1B0", "STEP"} <= {e["name"] for e in trace["traceEvents"]}


def test_errors_and_deadlines_are_baton_clients(cluster):
    async def main():
        async with baton.aio.Client(cluster.address, timeout=20) as client:
            with pytest.raises(baton.NotFound):
                await client.get("job-999999")
            with pytest.raises(baton.InvalidArgument) as bad:
                await client.submit(tiny_gpt("aio-zero"), steps=0)
            assert bad.value.field == "steps", bad.value.message
            with pytest.raises(baton.ConfigError, match="positive timeout"):
                await client.wait("job-000001", timeout=0)
            with pytest.raises(baton.ConfigError, match="a job is a Job"):
                await client.get("")
        # Nothing listens: refused at once, an Unavailable (a ConnectionError).
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        async with baton.aio.Client(f"127.0.0.1:{port}", timeout=60) as client:
            start = time.monotonic()
            with pytest.raises(baton.Unavailable) as e:
                await client.get("job-000001")
            # Refused, not the deadline: not "no connection within 60 s", long before it.
            assert "within" not in str(e.value) and time.monotonic() - start < 30, str(e.value)
            assert f"127.0.0.1:{port}" in str(e.value) and isinstance(e.value, ConnectionError)

    run(main())
    with pytest.raises(baton.ConfigError, match="host:port"):
        baton.aio.Client("no-port")


def test_a_port_that_never_answers_is_unavailable_by_the_deadline():
    async def main(address):
        async with baton.aio.Client(address, timeout=2) as client:
            start = time.monotonic()
            with pytest.raises(baton.Unavailable) as e:
                [j async for j in client.list()]
            elapsed = time.monotonic() - start
            # Ended by the client's deadline (its error says so), not before it; the upper
            # bound only catches a hang.
            assert 1.5 < elapsed < 60, elapsed
            assert "no connection within 2 s" in str(e.value), str(e.value)
            assert address in str(e.value)

    with tarpit() as address:
        run(main(address), timeout=120)
