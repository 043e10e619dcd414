"""What the client returns: Job snapshots, watch events, a job's history, workers.

Each wraps the message it came from (`.proto`) and exposes its common fields as plain
Python values (str states, datetime times, float seconds).
"""

from __future__ import annotations

import datetime
import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Tuple, Union

from baton.v1 import cluster_pb2, jobs_pb2

if TYPE_CHECKING:  # pragma: no cover
    from baton._client import Client


class JobState(str, enum.Enum):
    """A job's state; compares equal to its name ("RUNNING")."""

    UNSPECIFIED = "UNSPECIFIED"
    QUEUED = "QUEUED"
    PLACING = "PLACING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    RECOVERING = "RECOVERING"
    PREEMPTED = "PREEMPTED"

    @classmethod
    def from_proto(cls, value: int) -> "JobState":
        name = jobs_pb2.JobState.Name(value).removeprefix("JOB_STATE_")
        return cls(name)

    @property
    def terminal(self) -> bool:
        """SUCCEEDED, FAILED or CANCELLED: the job will not change again."""
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

    def __str__(self) -> str:
        return self.value


def _time(ts) -> Optional[datetime.datetime]:
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    return ts.ToDatetime(tzinfo=datetime.timezone.utc)


def _seconds(d) -> float:
    return d.seconds + d.nanos / 1e9


class JobFields:
    """A job snapshot's fields: what Job (the Client's) and baton.aio.AsyncJob share."""

    def __init__(self, proto: jobs_pb2.Job):
        self.proto = proto

    @property
    def id(self) -> str:
        """The coordinator's id, e.g. "job-000042"."""
        return self.proto.id

    @property
    def name(self) -> str:
        """The spec's name."""
        return self.proto.spec.name

    @property
    def state(self) -> JobState:
        """The job's state (a JobState, equal to its name: "RUNNING")."""
        return JobState.from_proto(self.proto.state)

    @property
    def reason(self) -> str:
        """Why the job is in its state (the last state change's reason)."""
        return self.proto.history[-1].reason if self.proto.history else ""

    @property
    def done(self) -> bool:
        """True once the job SUCCEEDED, FAILED or was CANCELLED."""
        return self.state.terminal

    @property
    def succeeded(self) -> bool:
        """True when the job SUCCEEDED."""
        return self.state == JobState.SUCCEEDED

    @property
    def steps_done(self) -> int:
        """Steps finished so far."""
        return self.proto.steps_done

    @property
    def total_steps(self) -> int:
        """The steps the spec asks for."""
        return self.proto.spec.steps

    @property
    def last_loss(self) -> Optional[float]:
        """The loss of the last step reported, None before the first."""
        return self.proto.last_loss if self.proto.steps_done > 0 else None

    @property
    def weights_digest(self) -> str:
        """SHA-256 over the trained weights (set once SUCCEEDED), as `batonctl train-local`
        prints it for the same spec."""
        return self.proto.weights_digest

    @property
    def workers(self) -> List[str]:
        """Worker id per rank, once placed."""
        return list(self.proto.workers)

    @property
    def submission_id(self) -> str:
        """The idempotency key it was submitted with, or ""."""
        return self.proto.submission_id

    @property
    def submitted_by(self) -> str:
        """The name of the token that submitted it ("anonymous" without tokens)."""
        return self.proto.submitted_by

    @property
    def priority(self) -> int:
        """Its queue priority (JobSpec.priority): higher runs first."""
        return self.proto.spec.priority

    @property
    def queue_position(self) -> Optional[int]:
        """While it waits: its place in the queue (1: placed next); None otherwise."""
        return self.proto.queue_position or None

    @property
    def wait_reason(self) -> str:
        """While it waits: why (e.g. "first in line: waiting for 4 idle workers (2 idle)");
        "" otherwise."""
        return self.proto.wait_reason

    @property
    def spec(self):
        """The spec as the coordinator holds it (defaults filled in): a baton.v1.JobSpec."""
        return self.proto.spec

    @property
    def create_time(self) -> Optional[datetime.datetime]:
        """When it was submitted (UTC datetime)."""
        return _time(self.proto.create_time)

    def __repr__(self) -> str:
        loss = f", loss={self.last_loss:.4g}" if self.last_loss is not None else ""
        return (f"{type(self).__name__}(id={self.id!r}, name={self.name!r}, "
                f"state={self.state.value}, steps={self.steps_done}/{self.total_steps}{loss})")


class Job(JobFields):
    """A snapshot of one job, as the coordinator returned it; `refresh()` gets a new one.

    The methods that act on the job (`wait`, `watch`, `cancel`, `history`, `trace`) go
    through the Client that returned it.
    """

    def __init__(self, proto: jobs_pb2.Job, client: "Client"):
        super().__init__(proto)
        self._client = client

    def refresh(self) -> "Job":
        """A new snapshot of this job."""
        return self._client.get(self.id)

    def wait(self, timeout: float) -> "Job":
        """Client.wait(self, timeout)."""
        return self._client.wait(self, timeout)

    def watch(self, progress: bool = False, timeout: Optional[float] = None) -> Iterator["Event"]:
        """Client.watch(self, ...)."""
        return self._client.watch(self, progress=progress, timeout=timeout)

    def cancel(self, reason: str = "") -> "Job":
        """Client.cancel(self, reason)."""
        return self._client.cancel(self, reason)

    def history(self) -> "History":
        """Client.history(self): per-step loss and throughput."""
        return self._client.history(self)

    def trace(self, step: Optional[int] = None) -> dict:
        """Client.trace(self, step): Chrome trace JSON of one step."""
        return self._client.trace(self, step)


@dataclass(frozen=True)
class StateEvent:
    """The job changed state (the first event of a watch is its current state)."""

    job_id: str
    time: Optional[datetime.datetime]
    state: JobState
    reason: str


@dataclass(frozen=True)
class StepEvent:
    """A step finished: its mean loss over the micro-batches, throughput and duration (s),
    the learning rate it used, the gradient norm before clipping (None when the job does
    not clip), the validation loss (None on steps that did not evaluate), model TFLOP/s and
    MFU (0 when a device's peak is unknown), and per-rank timings (`stages`:
    baton.v1.StageTiming messages)."""

    job_id: str
    time: Optional[datetime.datetime]
    step: int
    total_steps: int
    loss: float
    samples_per_second: float
    tokens_per_second: float
    duration: float
    stages: Tuple[Any, ...] = field(default=(), repr=False)
    learning_rate: float = 0.0
    grad_norm: Optional[float] = None
    val_loss: Optional[float] = None
    model_tflops: float = 0.0
    mfu: float = 0.0


# What watch() yields.
Event = Union[StateEvent, StepEvent]


def event_from_proto(e: jobs_pb2.JobEvent) -> Optional[Event]:
    which = e.WhichOneof("event")
    if which == "state_change":
        s = e.state_change
        return StateEvent(e.job_id, _time(s.time) or _time(e.time), JobState.from_proto(s.state),
                          s.reason)
    if which == "step":
        s = e.step
        return StepEvent(e.job_id, _time(e.time), s.step, s.total_steps, s.loss,
                         s.samples_per_second, s.tokens_per_second, _seconds(s.duration),
                         tuple(s.stages), s.learning_rate,
                         s.grad_norm if s.HasField("grad_norm") else None,
                         s.val_loss if s.HasField("val_loss") else None,
                         s.model_tflops, s.mfu)
    return None  # a kind of event newer than this client: skipped


@dataclass
class History:
    """A job's per-step record, as lists of equal length in step order (no pandas needed).

    A step missing from `step` was never reported (the job failed before it, or the
    coordinator was down when it ended). A step trained again after a recovery shows its
    last run."""

    job_id: str
    step: List[int] = field(default_factory=list)
    loss: List[float] = field(default_factory=list)
    samples_per_second: List[float] = field(default_factory=list)
    tokens_per_second: List[float] = field(default_factory=list)
    duration: List[float] = field(default_factory=list)
    learning_rate: List[float] = field(default_factory=list)
    # None where the step had none (no clipping; no evaluation that step).
    grad_norm: List[Optional[float]] = field(default_factory=list)
    val_loss: List[Optional[float]] = field(default_factory=list)
    model_tflops: List[float] = field(default_factory=list)
    mfu: List[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.step)

    def append(self, p: jobs_pb2.StepProgress) -> None:
        self.step.append(p.step)
        self.loss.append(p.loss)
        self.samples_per_second.append(p.samples_per_second)
        self.tokens_per_second.append(p.tokens_per_second)
        self.duration.append(_seconds(p.duration))
        self.learning_rate.append(p.learning_rate)
        self.grad_norm.append(p.grad_norm if p.HasField("grad_norm") else None)
        self.val_loss.append(p.val_loss if p.HasField("val_loss") else None)
        self.model_tflops.append(p.model_tflops)
        self.mfu.append(p.mfu)

    def _columns(self) -> dict:
        return {"loss": self.loss, "samples_per_second": self.samples_per_second,
                "tokens_per_second": self.tokens_per_second, "duration": self.duration,
                "learning_rate": self.learning_rate, "grad_norm": self.grad_norm,
                "val_loss": self.val_loss, "model_tflops": self.model_tflops, "mfu": self.mfu}

    def to_tensorboard(self, logdir: str) -> str:
        """Writes the history as a TensorBoard event file under `logdir` (made if missing)
        and returns its path: one scalar series per column (train/loss, val/loss,
        train/learning_rate, train/grad_norm, perf/tokens_per_second, perf/model_tflops,
        perf/mfu, ...), steps as reported. No TensorBoard needed to write it; `tensorboard
        --logdir` (baton-client[tensorboard]) shows it."""
        from baton._tensorboard import write_scalars
        tags = {"loss": "train/loss", "val_loss": "val/loss",
                "learning_rate": "train/learning_rate", "grad_norm": "train/grad_norm",
                "samples_per_second": "perf/samples_per_second",
                "tokens_per_second": "perf/tokens_per_second", "duration": "perf/step_seconds",
                "model_tflops": "perf/model_tflops", "mfu": "perf/mfu"}
        series = {tags[name]: values for name, values in self._columns().items()}
        return write_scalars(logdir, self.job_id, self.step, series)

    def to_pandas(self):
        """A pandas DataFrame indexed by step, one column per list. Needs pandas."""
        try:
            import pandas
        except ImportError:
            raise ImportError("History.to_pandas() needs pandas: pip install pandas "
                              "(or baton-client[pandas])") from None
        return pandas.DataFrame(self._columns(), index=pandas.Index(self.step, name="step"))


@dataclass(frozen=True)
class Worker:
    """A worker as the coordinator sees it."""

    id: str
    address: str
    state: str  # "IDLE", "BUSY" or "DEAD"
    job_id: str
    device_kind: str  # "cpu" or "cuda"
    device_name: str
    identity: str  # its certificate's common name under mutual TLS, else ""
    last_heartbeat: Optional[datetime.datetime]
    proto: Any = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, w: cluster_pb2.WorkerInfo) -> "Worker":
        return cls(w.worker_id, w.address,
                   cluster_pb2.WorkerState.Name(w.state).removeprefix("WORKER_STATE_"),
                   w.job_id, w.device.kind, w.device.name, w.identity,
                   _time(w.last_heartbeat), w)
