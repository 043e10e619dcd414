"""Client: one connection to a coordinator's JobService, and every call on it.

Each call has a deadline (the client's `timeout`, 10 s unless given; watching: 24 h) and
raises a BatonError subclass on failure: a coordinator that cannot be reached is
Unavailable (a ConnectionError) as soon as the connection attempt fails, and at the latest
when the deadline passes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional, Tuple, TypeVar, Union

import grpc

from baton._errors import (Cancelled, ConfigError, DeadlineExceeded, JobCancelled, JobFailed,
                           RpcError, Unavailable, WaitTimeout, from_grpc)
from baton._spec import SpecLike, to_job_spec
from baton._trace import chrome_trace
from baton._types import (Event, History, Job, JobFields, JobState, StateEvent, StepEvent,
                          Worker, event_from_proto)
from baton.v1 import jobs_pb2, jobs_pb2_grpc

DEFAULT_ADDRESS = "127.0.0.1:7070"
DEFAULT_TIMEOUT = 10.0
WATCH_TIMEOUT = 24 * 3600.0
# The coordinator caps gRPC messages at 64 MiB; a ListJobs page stays under 2 MiB.
_MAX_MESSAGE = 64 << 20

JobRef = Union[str, Job]
JobT = TypeVar("JobT", bound=JobFields)


@dataclass(frozen=True)
class TLS:
    """How to verify the coordinator, and optionally who this client is (mutual TLS).

    ca: PEM file of the CA that signed the coordinator's certificate (the cluster CA of
        the coordinator's --tls_ca); None trusts the system's roots.
    cert, key: PEM client certificate and key, for a coordinator that wants one (its
        JobService accepts tokens without one).
    server_name: the name to check the coordinator's certificate against instead of the
        host dialled (the coordinator's --tls_server_name; scripts/make-certs.sh puts
        "baton" in every certificate).
    """

    ca: Optional[str] = None
    cert: Optional[str] = None
    key: Optional[str] = None
    server_name: Optional[str] = None


def _read(path: Optional[str], what: str) -> Optional[bytes]:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"TLS {what} {path}: cannot read: {e.strerror or e}") from None


def _tls_settings(tls: Union[TLS, str, "os.PathLike[str]", bool, None]) -> Optional[TLS]:
    """The TLS to speak, None for plaintext (see Client's `tls`)."""
    if tls is None:
        ca = os.environ.get("BATON_TLS_CA")
        return TLS(ca=ca) if ca else None
    if tls is True:
        return TLS()
    if tls is False:
        return None
    if isinstance(tls, (str, os.PathLike)):
        return TLS(ca=os.fspath(tls))
    if isinstance(tls, TLS):
        return tls
    raise ConfigError(f"tls is a baton.TLS, a CA file path, True or False, got {tls!r}")


def _job_id(job: Union[str, JobFields]) -> str:
    if isinstance(job, JobFields):
        return job.id
    if isinstance(job, str) and job:
        return job
    raise ConfigError(f"a job is a Job or a job id string, got {job!r}")


@dataclass(frozen=True)
class _Connection:
    """What a client's channel is made of, checked: shared by Client and baton.aio.Client."""

    address: str
    timeout: float
    metadata: Tuple[Tuple[str, str], ...]
    options: List[Tuple[str, Any]]
    credentials: Any  # grpc.ChannelCredentials, or None for plaintext

    @staticmethod
    def of(address: Optional[str], token: Optional[str],
           tls: Union[TLS, str, bool, None], timeout: float) -> "_Connection":
        """The constructor arguments' defaults and checks (see Client)."""
        address = address or os.environ.get("BATON_COORDINATOR") or DEFAULT_ADDRESS
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigError(f"address wants host:port, got {address!r}")
        if not timeout or timeout <= 0:
            raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if token is None:
            token = os.environ.get("BATON_TOKEN", "").strip() or None
        settings = _tls_settings(tls)
        options: List[Tuple[str, Any]] = [("grpc.max_receive_message_length", _MAX_MESSAGE),
                                          ("grpc.max_send_message_length", _MAX_MESSAGE)]
        credentials = None
        if settings is not None:
            if (settings.cert is None) != (settings.key is None):
                raise ConfigError("TLS cert and key go together: give both or neither")
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(settings.ca, "ca"),
                private_key=_read(settings.key, "key"),
                certificate_chain=_read(settings.cert, "cert"))
            if settings.server_name:
                options.append(("grpc.ssl_target_name_override", settings.server_name))
        return _Connection(address, float(timeout),
                           (("authorization", f"Bearer {token}"),) if token else (), options,
                           credentials)

    def channel(self, api: Any) -> Any:
        """A channel to the coordinator from `api`: the grpc module, or grpc.aio."""
        if self.credentials is not None:
            return api.secure_channel(self.address, self.credentials, options=self.options)
        return api.insecure_channel(self.address, options=self.options)

    def __repr__(self) -> str:
        return (f"({self.address!r}, tls={self.credentials is not None}, "
                f"token={'set' if self.metadata else 'none'})")


class Client:
    """A connection to a baton coordinator's job service.

    address: "host:port" of the coordinator (its --listen); default $BATON_COORDINATOR,
        else 127.0.0.1:7070, as batonctl.
    token: bearer token for a coordinator started with --auth_tokens; default $BATON_TOKEN.
    tls: a TLS(...), a CA file path (str), True (TLS with the system's roots) or False
        (plaintext); default: TLS with $BATON_TLS_CA when that is set, else plaintext.
    timeout: the deadline of each call, in seconds (watch and wait take their own).

    Usable as a context manager (closes the channel). Thread-safe: calls may be made from
    several threads at once.
    """

    def __init__(self, address: Optional[str] = None, token: Optional[str] = None,
                 tls: Union[TLS, str, bool, None] = None, *, timeout: float = DEFAULT_TIMEOUT):
        self._connection = _Connection.of(address, token, tls, timeout)
        self.address = self._connection.address
        self.timeout = self._connection.timeout
        self._metadata = self._connection.metadata
        self._channel = self._connection.channel(grpc)
        self._stub = jobs_pb2_grpc.JobServiceStub(self._channel)
        # The channel's last connectivity state (set on gRPC's thread): a deadline missed
        # while not READY means the coordinator was never reached.
        self._connectivity = None
        self._channel.subscribe(self._on_connectivity, try_to_connect=False)

    def _on_connectivity(self, state) -> None:
        self._connectivity = state

    def _error(self, e: grpc.RpcError, method: str, timeout: Optional[float]) -> RpcError:
        connected = self._connectivity == grpc.ChannelConnectivity.READY
        return from_grpc(e, method, self.address, timeout, connected)

    # -- plumbing --------------------------------------------------------------------
    def _unary(self, method: str, request, timeout: Optional[float] = None):
        t = self.timeout if timeout is None else timeout
        try:
            return getattr(self._stub, method)(request, timeout=t, metadata=self._metadata)
        except grpc.RpcError as e:
            raise self._error(e, method, t) from None

    def _events(self, job_id: str, timeout: float) -> Iterator[Event]:
        call = self._stub.WatchJob(jobs_pb2.WatchJobRequest(job_id=job_id), timeout=timeout,
                                   metadata=self._metadata)
        try:
            for e in call:
                event = event_from_proto(e)
                if event is not None:
                    yield event
        except grpc.RpcError as e:
            raise self._error(e, "WatchJob", timeout) from None
        finally:
            call.cancel()

    def close(self) -> None:
        """Closes the channel; the client cannot be used afterwards."""
        self._channel.unsubscribe(self._on_connectivity)
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client{self._connection!r}"

    # -- jobs ------------------------------------------------------------------------
    def submit(self, spec: SpecLike, submission_id: Optional[str] = None,
               **overrides: Any) -> Job:
        """Submits a job and returns it (QUEUED, or further along).

        spec: the path of a JSON spec (the file batonctl submit -f reads), a dict of the
            same form, or a baton.v1.JobSpec message.
        submission_id: an idempotency key: submitting again with the same id (and the same
            spec) returns the first job instead of creating another; a different spec
            under a used id is refused.
        overrides: fields to set on the spec before sending it; a double underscore goes
            one message deeper: steps=20, name="run-2", pipeline__stages=2,
            pipeline__schedule="SCHEDULE_GPIPE", optimizer__adamw__learning_rate=1e-3.

        Raises SpecError when the spec cannot be read or built (naming the file and, for
        bad JSON, the line and column), InvalidArgument (with .field) when the coordinator
        refuses it.
        """
        request = jobs_pb2.SubmitJobRequest(submission_id=submission_id or "",
                                            spec=to_job_spec(spec, overrides))
        return Job(self._unary("SubmitJob", request), self)

    def get(self, job: JobRef) -> Job:
        """The job's current snapshot. NotFound when the coordinator has no such job."""
        return Job(self._unary("GetJob", jobs_pb2.GetJobRequest(job_id=_job_id(job))), self)

    def list(self, page_size: Optional[int] = None) -> Iterator[Job]:
        """Every job, newest first, fetched a page at a time as the iteration goes."""
        token = ""
        while True:
            page = self._unary("ListJobs", jobs_pb2.ListJobsRequest(page_size=page_size or 0,
                                                                     page_token=token))
            for j in page.jobs:
                yield Job(j, self)
            token = page.next_page_token
            if not token:
                return

    def cancel(self, job: JobRef, reason: str = "") -> Job:
        """Cancels the job (its workers are stopped when this returns) and returns it.
        Cancelling a job that already ended returns it unchanged."""
        request = jobs_pb2.CancelJobRequest(job_id=_job_id(job), reason=reason)
        return Job(self._unary("CancelJob", request), self)

    def set_priority(self, job: JobRef, priority: int) -> Job:
        """Sets a waiting job's priority (admins only; PermissionDenied otherwise) and
        returns it; the queue reorders at once. FailedPrecondition once it runs."""
        request = jobs_pb2.SetJobPriorityRequest(job_id=_job_id(job), priority=priority)
        return Job(self._unary("SetJobPriority", request), self)

    def watch(self, job: JobRef, progress: bool = False,
              timeout: Optional[float] = None) -> Iterator[Event]:
        """Yields the job's events as they happen: first a StateEvent with its current
        state, then a StateEvent per change and a StepEvent per step; ends after the job
        reaches a terminal state. A job that already ended yields its state and ends.

        progress: also draw a tqdm progress bar (steps, loss) on stderr; needs tqdm. The
            bar starts at the job's progress when the watch begins (a job watched mid-run,
            or after it ended, shows its steps so far).
        timeout: bound on the whole watch in seconds (default 24 h); DeadlineExceeded
            when it passes first.
        """
        job_id = _job_id(job)
        events = self._events(job_id, WATCH_TIMEOUT if timeout is None else timeout)
        return _with_progress(events, job_id, self.get) if progress else events

    def wait(self, job: JobRef, timeout: float) -> Job:
        """Waits until the job ends and returns its final snapshot if it SUCCEEDED.

        Raises JobFailed or JobCancelled (with .job and .reason) when it ended otherwise,
        WaitTimeout (with the last snapshot) when `timeout` seconds pass first. A
        coordinator that goes away after the first answer (a restart) is waited for,
        within `timeout`; one that cannot be reached at all raises Unavailable at once.
        """
        if timeout is None or timeout <= 0:
            raise ConfigError(f"wait needs a positive timeout in seconds, got {timeout!r}")
        job_id = _job_id(job)
        deadline = time.monotonic() + timeout
        last = self.get(job_id)
        while not last.done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(last, timeout)
            try:
                for event in self._events(job_id, remaining):
                    if isinstance(event, StateEvent) and event.state.terminal:
                        break
            except DeadlineExceeded:
                pass
            except (Unavailable, Cancelled):
                # The coordinator went away (a restart cancels its watch streams, then
                # refuses connections for a moment): look again shortly.
                time.sleep(max(0.0, min(0.5, deadline - time.monotonic())))
            try:
                last = self.get(job_id)
            except (Unavailable, DeadlineExceeded, Cancelled):
                if time.monotonic() >= deadline:
                    raise WaitTimeout(last, timeout) from None
        return _outcome(last)

    def history(self, job: JobRef) -> History:
        """The job's per-step loss, throughput and duration so far (lists, in step order;
        History.to_pandas() for a DataFrame)."""
        job_id = _job_id(job)
        out = History(job_id)
        from_step = 1
        while from_step:
            page = self._unary("GetJobHistory",
                               jobs_pb2.GetJobHistoryRequest(job_id=job_id, from_step=from_step))
            from_step = _add_history_page(out, page, from_step)
        return out

    def trace(self, job: JobRef, step: Optional[int] = None) -> dict:
        """One step's action timeline on every rank, as Chrome trace-event JSON (a dict:
        json.dump it and open it in Perfetto or chrome://tracing). step: 1-based; None for
        the latest step every rank has reported. NotFound names the steps kept."""
        return _trace_json(self._unary("GetJobTrace", _trace_request(job, step)))

    # -- cluster ---------------------------------------------------------------------
    def workers(self) -> List[Worker]:
        """Every worker the coordinator knows, with its state and device."""
        response = self._unary("ListWorkers", jobs_pb2.ListWorkersRequest())
        return [Worker.from_proto(w) for w in response.workers]


def _outcome(last: JobT) -> JobT:
    """wait's result: the snapshot of a job that SUCCEEDED; JobFailed or JobCancelled."""
    if last.state == JobState.SUCCEEDED:
        return last
    if last.state == JobState.CANCELLED:
        raise JobCancelled(last, last.reason)
    raise JobFailed(last, last.reason)


def _add_history_page(out: History, page: jobs_pb2.JobHistory,
                      from_step: int) -> int:
    """Appends a GetJobHistory page asked from `from_step`; the next page's first step, 0
    after the last. DATA_LOSS when the next page would not start after this one."""
    for p in page.steps:
        out.append(p)
    if page.next_from_step and page.next_from_step <= from_step:
        raise RpcError(grpc.StatusCode.DATA_LOSS,
                       f"the coordinator's next page of {out.job_id} starts at step "
                       f"{page.next_from_step}, not after step {from_step}", "GetJobHistory")
    return page.next_from_step


def _trace_request(job: Union[str, JobFields],
                   step: Optional[int]) -> jobs_pb2.GetJobTraceRequest:
    if step is not None and step <= 0:
        raise ConfigError(f"step is 1-based, got {step}")
    return jobs_pb2.GetJobTraceRequest(job_id=_job_id(job), step=step or 0)


def _trace_json(trace: jobs_pb2.JobTrace) -> dict:
    try:
        return chrome_trace(trace)
    except ValueError as e:
        raise RpcError(grpc.StatusCode.DATA_LOSS, str(e), "GetJobTrace") from None


def _with_progress(events: Iterator[Event], job_id: str,
                   snapshot: Callable[[str], Job]) -> Iterator[Event]:
    try:
        from tqdm import tqdm
    except ImportError:
        raise ImportError("watch(progress=True) needs tqdm: pip install tqdm "
                          "(or baton-client[progress])") from None
    bar = tqdm(desc=job_id, unit="step")
    seeded = False
    try:
        for event in events:
            if not seeded:
                # The watch's first event is the current state; the steps before it are
                # not replayed, so the bar starts from a snapshot taken after it (any step
                # the snapshot already counts is at most repeated by a later StepEvent).
                seeded = True
                job = snapshot(job_id)
                bar.total = job.total_steps or None
                bar.n = job.steps_done
                if job.last_loss is not None:
                    bar.set_postfix(loss=f"{job.last_loss:.4f}", refresh=False)
            if isinstance(event, StepEvent):
                if event.total_steps and bar.total != event.total_steps:
                    bar.total = event.total_steps
                bar.n = event.step
                bar.set_postfix(loss=f"{event.loss:.4f}", refresh=False)
                bar.refresh()
            elif isinstance(event, StateEvent):
                bar.set_description(f"{job_id} {event.state.value}")
            yield event
    finally:
        bar.close()
