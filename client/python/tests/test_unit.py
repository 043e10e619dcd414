"""The client's logic without a cluster: paging, error mapping, field names, overrides."""

import grpc
import pytest

import baton
from baton import _errors, _spec
from baton.v1 import job_pb2, jobs_pb2


class FakeStub:
    """Answers GetJobHistory and ListJobs from canned pages, recording the requests."""

    def __init__(self, history_pages=(), list_pages=()):
        self.history_pages = list(history_pages)
        self.list_pages = list(list_pages)
        self.requests = []

    def GetJobHistory(self, request, timeout, metadata):
        self.requests.append(request)
        return self.history_pages.pop(0)

    def ListJobs(self, request, timeout, metadata):
        self.requests.append(request)
        return self.list_pages.pop(0)


def history_page(steps, next_from_step):
    return jobs_pb2.JobHistory(job_id="job-000001", next_from_step=next_from_step,
                               steps=[jobs_pb2.StepProgress(step=s, loss=1.0 / s)
                                      for s in steps])


def test_history_follows_every_page():
    client = baton.Client("127.0.0.1:1")
    client._stub = FakeStub(history_pages=[history_page([1, 2], 3), history_page([3], 0)])
    h = client.history("job-000001")
    assert h.step == [1, 2, 3] and h.loss[2] == pytest.approx(1 / 3)
    assert [r.from_step for r in client._stub.requests] == [1, 3]


def test_history_refuses_a_page_that_does_not_advance():
    client = baton.Client("127.0.0.1:1")
    client._stub = FakeStub(history_pages=[history_page([1, 2], 3), history_page([], 2)])
    with pytest.raises(baton.RpcError, match="starts at step 2, not after step 3"):
        client.history("job-000001")


def test_list_follows_page_tokens():
    client = baton.Client("127.0.0.1:1")
    client._stub = FakeStub(list_pages=[
        jobs_pb2.ListJobsResponse(jobs=[jobs_pb2.Job(id="job-000003")], next_page_token="t1"),
        jobs_pb2.ListJobsResponse(jobs=[jobs_pb2.Job(id="job-000002"),
                                        jobs_pb2.Job(id="job-000001")])])
    assert [j.id for j in client.list(page_size=1)] == ["job-000003", "job-000002", "job-000001"]
    assert [(r.page_size, r.page_token) for r in client._stub.requests] == [(1, ""), (1, "t1")]


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


@pytest.mark.parametrize("code", list(grpc.StatusCode))
def test_every_status_code_becomes_a_baton_error(code):
    if code == grpc.StatusCode.OK:
        return
    e = _errors.from_grpc(FakeRpcError(code, "why"), "GetJob", "127.0.0.1:7070", 10.0)
    assert isinstance(e, baton.RpcError) and not isinstance(e, grpc.RpcError)
    assert e.code == code and e.method == "GetJob" and "why" in e.message


def test_a_deadline_before_any_connection_is_unavailable():
    e = _errors.from_grpc(FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"),
                          "ListJobs", "10.0.0.9:7070", 2.0, connected=False)
    assert isinstance(e, baton.Unavailable)
    assert "cannot reach the coordinator at 10.0.0.9:7070: no connection within 2 s" in str(e)
    e = _errors.from_grpc(FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"),
                          "ListJobs", "10.0.0.9:7070", 2.0, connected=True)
    assert isinstance(e, baton.DeadlineExceeded) and isinstance(e, TimeoutError)


@pytest.mark.parametrize("message, field", [
    ("model.gpt.heads: 3 does not divide d_model 32", "model.gpt.heads"),
    ("pipeline.partition[2]: 0 blocks", "pipeline.partition[2]"),
    ("invalid spec: data.text.path: '/etc/shadow' is outside the directories", "data.text.path"),
    ("steps: must be at least 1, got 0", "steps"),
    ("the job needs more memory than any worker has", None),
])
def test_field_of(message, field):
    assert _errors.field_of(message) == field


def test_overrides_replace_either_spelling_and_go_deeper():
    spec = {"data": {"batchSize": 8}, "pipeline": {"stages": 2}}
    _spec.apply_overrides(spec, {"data__batch_size": 16, "pipeline__schedule": "SCHEDULE_GPIPE",
                                 "optimizer__adamw__learning_rate": 0.5})
    assert spec == {"data": {"batch_size": 16},
                    "pipeline": {"stages": 2, "schedule": "SCHEDULE_GPIPE"},
                    "optimizer": {"adamw": {"learning_rate": 0.5}}}
    with pytest.raises(baton.SpecError, match="empty field name"):
        _spec.apply_overrides({}, {"pipeline____stages": 1})


def test_a_sharded_optimizer_is_an_override_like_any_field():
    spec = baton.to_job_spec({"pipeline": {"stages": 2}},
                             {"pipeline__data_parallel": 2, "optimizer__shard": True})
    assert spec.optimizer.shard and spec.pipeline.data_parallel == 2


def test_a_progress_bar_on_a_job_that_already_ended_shows_its_steps(capsys):
    # The watch of an ended job yields only its state; the bar starts from the snapshot.
    pytest.importorskip("tqdm")
    from baton._client import _with_progress
    from baton._types import StateEvent, JobState

    proto = jobs_pb2.Job(id="job-000007", state=jobs_pb2.JOB_STATE_SUCCEEDED, steps_done=3,
                         last_loss=2.5, spec=job_pb2.JobSpec(steps=3))
    asked = []

    def snapshot(job_id):
        asked.append(job_id)
        return baton.Job(proto, None)

    ended = StateEvent("job-000007", None, JobState.SUCCEEDED, "")
    assert list(_with_progress(iter([ended]), "job-000007", snapshot)) == [ended]
    assert asked == ["job-000007"]
    err = capsys.readouterr().err
    assert "3/3" in err and "loss=2.5000" in err and "SUCCEEDED" in err, err


def test_history_columns_and_a_tensorboard_file_that_tensorboard_reads(tmp_path):
    h = baton.History("job-000009")
    for step in (1, 2, 3):
        p = jobs_pb2.StepProgress(step=step, loss=4.0 - step, learning_rate=1e-3 * step,
                                  model_tflops=0.5, mfu=0.25)
        if step == 2:
            p.val_loss = 2.5
        p.grad_norm = 0.5 * step
        h.append(p)
    assert h.val_loss == [None, 2.5, None] and h.grad_norm == [0.5, 1.0, 1.5]
    assert h.learning_rate == pytest.approx([1e-3, 2e-3, 3e-3])
    path = h.to_tensorboard(str(tmp_path))
    assert path.startswith(str(tmp_path / "job-000009"))
    # TensorBoard's own reader gets every series back, each step where it had a value.
    accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator")
    acc = accumulator.EventAccumulator(str(tmp_path / "job-000009"))
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    assert {"train/loss", "val/loss", "train/learning_rate", "train/grad_norm",
            "perf/mfu"} <= set(scalars)
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 3.0), (2, 2.0),
                                                                       (3, 1.0)]
    assert [(e.step, e.value) for e in acc.Scalars("val/loss")] == [(2, 2.5)]
