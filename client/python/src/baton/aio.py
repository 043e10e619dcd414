"""baton.aio: the client for asyncio programs (grpc.aio underneath).

    import asyncio, baton.aio

    async def main():
        async with baton.aio.Client("127.0.0.1:7070") as client:
            jobs = [await client.submit("client/examples/gpt.json", steps=s) for s in (20, 40)]
            done = await asyncio.gather(*(client.wait(j, timeout=600) for j in jobs))
            print([j.weights_digest for j in done])

    asyncio.run(main())

The same calls, arguments, defaults, deadlines and errors as baton.Client, as coroutines;
list() and watch() are async iterators. They return AsyncJob snapshots, whose actions are
coroutines too. watch() draws no progress bar: its StepEvents carry the step and loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import AsyncGenerator, List, Optional, Union

import grpc

from baton._client import (DEFAULT_TIMEOUT, TLS, WATCH_TIMEOUT, _add_history_page, _Connection,
                           _job_id, _outcome, _trace_json, _trace_request)
from baton._errors import (Cancelled, ConfigError, DeadlineExceeded, RpcError, Unavailable,
                           WaitTimeout, from_grpc)
from baton._spec import SpecLike, to_job_spec
from baton._types import Event, History, JobFields, StateEvent, Worker, event_from_proto
from baton.v1 import jobs_pb2, jobs_pb2_grpc

AsyncJobRef = Union[str, JobFields]

__all__ = ["Client", "AsyncJob"]


class AsyncJob(JobFields):
    """A snapshot of one job, as a baton.aio.Client returned it: baton.Job's fields, and
    its actions as coroutines (`await job.wait(600)`; `async for e in job.watch()`)."""

    def __init__(self, proto: jobs_pb2.Job, client: "Client"):
        super().__init__(proto)
        self._client = client

    async def refresh(self) -> "AsyncJob":
        """A new snapshot of this job."""
        return await self._client.get(self.id)

    async def wait(self, timeout: float) -> "AsyncJob":
        """Client.wait(self, timeout)."""
        return await self._client.wait(self, timeout)

    def watch(self, timeout: Optional[float] = None) -> AsyncGenerator[Event, None]:
        """Client.watch(self, timeout): an async iterator of the job's events."""
        return self._client.watch(self, timeout=timeout)

    async def cancel(self, reason: str = "") -> "AsyncJob":
        """Client.cancel(self, reason)."""
        return await self._client.cancel(self, reason)

    async def history(self) -> History:
        """Client.history(self): per-step loss and throughput."""
        return await self._client.history(self)

    async def trace(self, step: Optional[int] = None) -> dict:
        """Client.trace(self, step): Chrome trace JSON of one step."""
        return await self._client.trace(self, step)


class Client:
    """A connection to a baton coordinator's job service, for asyncio.

    Arguments as baton.Client's (address, token, tls, timeout), with the same defaults
    ($BATON_COORDINATOR, $BATON_TOKEN, $BATON_TLS_CA). Make it inside the event loop that
    uses it; `async with` closes it. Any number of calls may be in flight at once.
    """

    def __init__(self, address: Optional[str] = None, token: Optional[str] = None,
                 tls: Union[TLS, str, bool, None] = None, *, timeout: float = DEFAULT_TIMEOUT):
        self._connection = _Connection.of(address, token, tls, timeout)
        self.address = self._connection.address
        self.timeout = self._connection.timeout
        self._metadata = self._connection.metadata
        self._channel = self._connection.channel(grpc.aio)
        self._stub = jobs_pb2_grpc.JobServiceStub(self._channel)

    def _error(self, e: grpc.RpcError, method: str, timeout: Optional[float]) -> RpcError:
        # A deadline missed while the channel is not READY: the coordinator was never reached.
        connected = (self._channel.get_state(try_to_connect=False) ==
                     grpc.ChannelConnectivity.READY)
        return from_grpc(e, method, self.address, timeout, connected)

    async def _unary(self, method: str, request, timeout: Optional[float] = None):
        t = self.timeout if timeout is None else timeout
        try:
            return await getattr(self._stub, method)(request, timeout=t,
                                                     metadata=self._metadata)
        except grpc.RpcError as e:
            raise self._error(e, method, t) from None

    async def _events(self, job_id: str, timeout: float) -> AsyncGenerator[Event, None]:
        call = self._stub.WatchJob(jobs_pb2.WatchJobRequest(job_id=job_id), timeout=timeout,
                                   metadata=self._metadata)
        try:
            async for e in call:
                event = event_from_proto(e)
                if event is not None:
                    yield event
        except grpc.RpcError as e:
            raise self._error(e, "WatchJob", timeout) from None
        finally:
            call.cancel()

    async def close(self) -> None:
        """Closes the channel (calls in flight end CANCELLED); the client cannot be used
        afterwards."""
        await self._channel.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"aio.Client{self._connection!r}"

    # -- jobs ------------------------------------------------------------------------
    async def submit(self, spec: SpecLike, submission_id: Optional[str] = None,
                     **overrides) -> AsyncJob:
        """baton.Client.submit: submits a job and returns it (QUEUED, or further along)."""
        request = jobs_pb2.SubmitJobRequest(submission_id=submission_id or "",
                                            spec=to_job_spec(spec, overrides))
        return AsyncJob(await self._unary("SubmitJob", request), self)

    async def get(self, job: AsyncJobRef) -> AsyncJob:
        """The job's current snapshot. NotFound when the coordinator has no such job."""
        request = jobs_pb2.GetJobRequest(job_id=_job_id(job))
        return AsyncJob(await self._unary("GetJob", request), self)

    async def list(self, page_size: Optional[int] = None) -> AsyncGenerator[AsyncJob, None]:
        """Every job, newest first, fetched a page at a time as the iteration goes."""
        token = ""
        while True:
            page = await self._unary("ListJobs", jobs_pb2.ListJobsRequest(
                page_size=page_size or 0, page_token=token))
            for j in page.jobs:
                yield AsyncJob(j, self)
            token = page.next_page_token
            if not token:
                return

    async def cancel(self, job: AsyncJobRef, reason: str = "") -> AsyncJob:
        """Cancels the job (its workers are stopped when this returns) and returns it."""
        request = jobs_pb2.CancelJobRequest(job_id=_job_id(job), reason=reason)
        return AsyncJob(await self._unary("CancelJob", request), self)

    async def set_priority(self, job: AsyncJobRef, priority: int) -> AsyncJob:
        """Sets a waiting job's priority (admins only) and returns it."""
        request = jobs_pb2.SetJobPriorityRequest(job_id=_job_id(job), priority=priority)
        return AsyncJob(await self._unary("SetJobPriority", request), self)

    def watch(self, job: AsyncJobRef,
              timeout: Optional[float] = None) -> AsyncGenerator[Event, None]:
        """baton.Client.watch without the progress bar, as an async iterator: the job's
        events as they happen, ending after it reaches a terminal state; DeadlineExceeded
        when `timeout` seconds (default 24 h) pass first. Leaving the loop early ends the
        watch when the iterator is closed (contextlib.aclosing closes it at once)."""
        return self._events(_job_id(job), WATCH_TIMEOUT if timeout is None else timeout)

    async def wait(self, job: AsyncJobRef, timeout: float) -> AsyncJob:
        """baton.Client.wait: the final snapshot of a job that SUCCEEDED; JobFailed,
        JobCancelled or WaitTimeout otherwise. A coordinator that restarts is waited for."""
        if timeout is None or timeout <= 0:
            raise ConfigError(f"wait needs a positive timeout in seconds, got {timeout!r}")
        job_id = _job_id(job)
        deadline = time.monotonic() + timeout
        last = await self.get(job_id)
        while not last.done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(last, timeout)
            try:
                async with contextlib.aclosing(self._events(job_id, remaining)) as events:
                    async for event in events:
                        if isinstance(event, StateEvent) and event.state.terminal:
                            break
            except DeadlineExceeded:
                pass
            except (Unavailable, Cancelled):
                # The coordinator went away (a restart): look again shortly.
                await asyncio.sleep(max(0.0, min(0.5, deadline - time.monotonic())))
            try:
                last = await self.get(job_id)
            except (Unavailable, DeadlineExceeded, Cancelled):
                if time.monotonic() >= deadline:
                    raise WaitTimeout(last, timeout) from None
        return _outcome(last)

    async def history(self, job: AsyncJobRef) -> History:
        """The job's per-step loss, throughput and duration so far."""
        job_id = _job_id(job)
        out = History(job_id)
        from_step = 1
        while from_step:
            page = await self._unary("GetJobHistory", jobs_pb2.GetJobHistoryRequest(
                job_id=job_id, from_step=from_step))
            from_step = _add_history_page(out, page, from_step)
        return out

    async def trace(self, job: AsyncJobRef, step: Optional[int] = None) -> dict:
        """One step's action timeline on every rank, as Chrome trace-event JSON."""
        return _trace_json(await self._unary("GetJobTrace", _trace_request(job, step)))

    # -- cluster ---------------------------------------------------------------------
    async def workers(self) -> List[Worker]:
        """Every worker the coordinator knows, with its state and device."""
        response = await self._unary("ListWorkers", jobs_pb2.ListWorkersRequest())
        return [Worker.from_proto(w) for w in response.workers]
