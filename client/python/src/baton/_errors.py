"""The exceptions baton raises. Every one derives from BatonError; no grpc.RpcError leaks.

RpcError and its subclasses carry the gRPC status code and the coordinator's message; the
subclass is picked by code (from_grpc), so callers catch what they care about:

    try:
        client.submit(spec)
    except baton.InvalidArgument as e:
        print("fix", e.field, ":", e.message)
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Optional

import grpc

if TYPE_CHECKING:  # pragma: no cover
    from baton._types import JobFields


class BatonError(Exception):
    """Base class of every error raised by this package."""


class SpecError(BatonError, ValueError):
    """A job spec could not be read or turned into a JobSpec on this side (not valid JSON,
    an unknown field or value, an override that does not fit). `source` names the file (or
    "spec"); `line` and `column` are set for JSON syntax errors."""

    def __init__(self, message: str, source: str = "spec", line: Optional[int] = None,
                 column: Optional[int] = None):
        super().__init__(message)
        self.source = source
        self.line = line
        self.column = column


class ConfigError(BatonError, ValueError):
    """The client's own settings are wrong: an address that is not host:port, a TLS file
    that cannot be read, a timeout that is not positive."""


class RpcError(BatonError):
    """A call to the coordinator failed. `code` is the grpc.StatusCode, `message` the
    coordinator's (or gRPC's) text, `method` the JobService method called."""

    def __init__(self, code: grpc.StatusCode, message: str, method: str = ""):
        name = code.name if isinstance(code, grpc.StatusCode) else str(code)
        super().__init__(f"{name}: {message}" if not method else f"{method}: {name}: {message}")
        self.code = code
        self.message = message
        self.method = method


class InvalidArgument(RpcError, ValueError):
    """INVALID_ARGUMENT: the coordinator refused the request. `field` is the spec field
    the message names (e.g. "pipeline.microbatches", "model.gpt.heads"), or None."""

    def __init__(self, code, message, method=""):
        super().__init__(code, message, method)
        self.field = field_of(message)


class NotFound(RpcError, LookupError):
    """NOT_FOUND: no such job (or no such step's trace)."""


class AlreadyExists(RpcError):
    """ALREADY_EXISTS: e.g. a submission id reused with a different spec."""


class FailedPrecondition(RpcError):
    """FAILED_PRECONDITION: the job is not in a state that allows the call."""


class PermissionDenied(RpcError, PermissionError):
    """PERMISSION_DENIED: the token's role does not allow the call."""


class Unauthenticated(RpcError, PermissionError):
    """UNAUTHENTICATED: no token, or one the coordinator does not know."""


class ResourceExhausted(RpcError):
    """RESOURCE_EXHAUSTED: e.g. too many watch streams from this host."""


class Unavailable(RpcError, ConnectionError):
    """UNAVAILABLE: the coordinator cannot be reached (or went away mid-call)."""


class DeadlineExceeded(RpcError, TimeoutError):
    """DEADLINE_EXCEEDED: the call did not finish within its timeout."""


class Cancelled(RpcError):
    """CANCELLED: the call was cancelled (on this side or by the server)."""


class Internal(RpcError):
    """INTERNAL, UNKNOWN, DATA_LOSS, UNIMPLEMENTED: a fault on the server's side (or a
    server that does not know the method)."""


class JobError(BatonError):
    """A job ended without succeeding. `job` is its final snapshot, `reason` why."""

    def __init__(self, job: "JobFields", reason: str):
        super().__init__(f"{job.id} {job.state.value}: {reason}")
        self.job = job
        self.reason = reason


class JobFailed(JobError):
    """The job FAILED (a worker lost, a bad data file, divergence...): see `reason`."""


class JobCancelled(JobError):
    """The job was CANCELLED: see `reason`."""


class WaitTimeout(BatonError, TimeoutError):
    """wait() ran out of time before the job ended. `job` is the last snapshot seen."""

    def __init__(self, job: "JobFields", timeout: float):
        super().__init__(f"{job.id} still {job.state.value} after {timeout:g} s "
                         f"({job.steps_done}/{job.total_steps} steps)")
        self.job = job
        self.timeout = timeout


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: FailedPrecondition,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNKNOWN: Internal,
    grpc.StatusCode.DATA_LOSS: Internal,
    grpc.StatusCode.UNIMPLEMENTED: Internal,
}

# A spec field path as the coordinator writes it: "model.gpt.heads",
# "pipeline.partition[2]", "data.text.path", "steps".
_FIELD = re.compile(r"(?:^|: )([a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*|\[\d+\])*): ")


def field_of(message: str) -> Optional[str]:
    """The field an INVALID_ARGUMENT message names ("pipeline.microbatches: must ..." ->
    "pipeline.microbatches"), or None when it names none."""
    m = _FIELD.search(message)
    return m.group(1) if m else None


def from_grpc(error: grpc.RpcError, method: str, address: str, timeout: Optional[float],
              connected: bool = True) -> RpcError:
    """The BatonError for a failed call: the subclass of its status code; UNAVAILABLE and
    DEADLINE_EXCEEDED messages say which coordinator and which deadline. A deadline that
    passed while the channel never connected (a host that accepts and never answers) is
    Unavailable, not DeadlineExceeded."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else None) or str(error)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and not connected:
        code = grpc.StatusCode.UNAVAILABLE
        details = f"no connection within {timeout:g} s" if timeout is not None else details
    if code == grpc.StatusCode.UNAVAILABLE:
        details = f"cannot reach the coordinator at {address}: {details}"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED and timeout is not None:
        details = f"no answer from the coordinator at {address} within {timeout:g} s ({details})"
    elif code == grpc.StatusCode.UNIMPLEMENTED:
        details = (f"the server at {address} does not serve JobService.{method} (not a baton "
                   f"coordinator, or an older one): {details}")
    return _BY_CODE.get(code, RpcError)(code, details, method)
