"""The Python client against a real coordinator and workers (conftest.py): submitting in
every form, idempotency, watching, waiting, cancelling, errors, history, traces, workers;
the weights digest of a job submitted through the package equals the reference trainer's
(`batonctl train-local`)."""

import json
import socket
import time

import pytest

import baton
from baton.v1 import job_pb2

from conftest import NUM_WORKERS, tarpit, tiny_gpt

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def test_submit_file_wait_and_digest_equals_train_local(client, idle):
    path = idle.write_spec(tiny_gpt("py-file", steps=6, schedule="SCHEDULE_1F1B"))
    job = client.submit(path)
    assert job.id.startswith("job-") and job.name == "py-file"
    assert job.state in ("QUEUED", "PLACING", "RUNNING")
    done = client.wait(job, timeout=120)
    assert done.state is baton.JobState.SUCCEEDED and done.succeeded and done.done
    assert done.steps_done == done.total_steps == 6
    assert len(done.workers) == 2
    assert done.weights_digest == idle.reference_digest(path)
    # The history: every step, in order, and its last loss is the job's.
    h = done.history()
    assert h.job_id == done.id
    assert h.step == [1, 2, 3, 4, 5, 6]
    assert len(h.loss) == len(h.samples_per_second) == len(h.tokens_per_second) == 6
    assert h.loss[-1] == done.last_loss
    assert all(s > 0 for s in h.samples_per_second) and all(d > 0 for d in h.duration)
    assert h.loss[0] > h.loss[-1], f"the loss did not go down: {h.loss}"


def test_history_to_pandas(client, idle):
    pandas = pytest.importorskip("pandas")
    job = client.wait(client.submit(tiny_gpt("py-pandas", steps=3)), timeout=120)
    frame = job.history().to_pandas()
    assert isinstance(frame, pandas.DataFrame)
    assert list(frame.index) == [1, 2, 3] and frame.index.name == "step"
    assert list(frame.columns) == ["loss", "samples_per_second", "tokens_per_second",
                                   "duration", "learning_rate", "grad_norm", "val_loss",
                                   "model_tflops", "mfu"]
    assert frame.loc[3, "loss"] == pytest.approx(job.last_loss)
    # The CPU workers measured their peak at start: every step has an MFU.
    assert all(frame["model_tflops"] > 0) and all(0 < m < 1 for m in frame["mfu"]), frame


def test_dict_message_and_overrides_train_the_same_weights(client, idle):
    spec = tiny_gpt("py-dict", steps=20)
    # A dict with overrides (either spelling), and the same spec built as a message.
    a = client.submit(spec, steps=4, pipeline__schedule="SCHEDULE_GPIPE",
                      data__batch_size=8, name="py-overridden")
    assert a.name == "py-overridden" and a.total_steps == 4
    assert a.spec.pipeline.schedule == job_pb2.SCHEDULE_GPIPE
    message = baton.to_job_spec(spec, {"steps": 4, "pipeline__schedule": "SCHEDULE_GPIPE"})
    assert isinstance(message, job_pb2.JobSpec) and message.steps == 4
    b = client.submit(message, name="py-message")
    a, b = client.wait(a, timeout=120), client.wait(b, timeout=120)
    assert a.weights_digest == b.weights_digest != ""
    reference = idle.write_spec(dict(spec, steps=4, pipeline=dict(spec["pipeline"],
                                                                   schedule="SCHEDULE_GPIPE")))
    assert a.weights_digest == idle.reference_digest(reference)
    assert spec["steps"] == 20, "submit changed the caller's dict"


def test_submission_id_makes_submit_idempotent(client, idle):
    spec = tiny_gpt("py-idem", steps=2)
    first = client.submit(spec, submission_id="py-idem-1")
    again = client.submit(spec, submission_id="py-idem-1")
    assert again.id == first.id and again.submission_id == "py-idem-1"
    with pytest.raises(baton.AlreadyExists) as e:
        client.submit(spec, submission_id="py-idem-1", steps=3)
    assert "py-idem-1" in e.value.message
    other = client.submit(spec, submission_id="py-idem-2")
    assert other.id != first.id
    for j in (first, other):
        client.wait(j, timeout=120)
    assert sum(1 for j in client.list() if j.submission_id == "py-idem-1") == 1


def hold_every_worker(client):
    """A job on every worker that runs until cancelled, returned once it runs: a job
    submitted after it waits in the queue until it is cancelled."""
    holder = client.submit(tiny_gpt("py-holder", steps=1000000, stages=NUM_WORKERS))
    for event in client.watch(holder, timeout=120):
        if isinstance(event, baton.StepEvent):
            return holder
    pytest.fail(f"{holder.id} ended before its first step: {holder.refresh().reason}")


def test_watch_sees_every_state_and_step(client, idle):
    # The job waits behind another until the watch is open (its first event: QUEUED), so
    # the watch sees every state and step of its run, however slowly this test gets there.
    holder = hold_every_worker(client)
    try:
        job = client.submit(tiny_gpt("py-watch", steps=5))
        watch = client.watch(job, timeout=120)
        first = next(watch)
    finally:
        client.cancel(holder, reason="the watched job's turn")
    events = [first, *watch]
    assert isinstance(events[0], baton.StateEvent) and events[0].state == "QUEUED", events[0]
    states = [e.state for e in events if isinstance(e, baton.StateEvent)]
    steps = [e for e in events if isinstance(e, baton.StepEvent)]
    assert states[-1] == "SUCCEEDED"
    assert "PLACING" in states and "RUNNING" in states, states
    assert [s.step for s in steps] == [1, 2, 3, 4, 5]
    assert all(s.total_steps == 5 and s.loss > 0 and s.duration > 0 for s in steps)
    # The timings of the ranks that had reported the step when the last rank did: at least
    # the last rank's.
    assert all(1 in {t.rank for t in s.stages} for s in steps), "per-rank timings missing"
    # The history says what the watch saw.
    assert job.history().loss == [s.loss for s in steps]
    # Watching a job that ended yields its state and ends.
    after = list(job.watch())
    assert len(after) == 1 and after[0].state == "SUCCEEDED"


def test_watch_with_a_progress_bar(client, idle, capsys):
    pytest.importorskip("tqdm")
    job = client.submit(tiny_gpt("py-progress", steps=3))
    events = list(client.watch(job, progress=True))
    assert events[-1].state == "SUCCEEDED"
    err = capsys.readouterr().err
    assert job.id in err and "3/3" in err and "loss=" in err, err[-400:]


def test_cancel_running_job_and_wait_raises_job_cancelled(client, idle):
    job = client.submit(tiny_gpt("py-cancel", steps=100000))
    for event in client.watch(job, timeout=60):
        if isinstance(event, baton.StepEvent):
            break
    cancelled = client.cancel(job, reason="enough from python")
    assert cancelled.state == "CANCELLED"
    assert "enough from python" in cancelled.reason
    with pytest.raises(baton.JobCancelled) as e:
        client.wait(job, timeout=10)
    assert e.value.job.id == job.id and "enough from python" in e.value.reason
    assert isinstance(e.value, baton.JobError)


def test_a_waiting_job_shows_its_place_and_why_and_its_priority_changes(client, idle):
    # More stages than there are workers: it waits, says why, and holds no one up.
    big = client.submit(tiny_gpt("py-too-big", stages=NUM_WORKERS + 1))
    try:
        deadline = time.monotonic() + 30
        while not big.refresh().wait_reason and time.monotonic() < deadline:
            time.sleep(0.1)
        big = big.refresh()
        assert big.state == "QUEUED"
        assert big.queue_position == 1
        assert "cannot run on the workers registered now" in big.wait_reason, big.wait_reason
        small = client.submit(tiny_gpt("py-small-behind"))
        assert client.wait(small, timeout=120).state == "SUCCEEDED"
        moved = client.set_priority(big, 3)  # the demo cluster's caller is an admin
        assert moved.priority == 3 and "priority 0 -> 3" in moved.reason
    finally:
        client.cancel(big)
    assert client.get(big).queue_position is None and client.get(big).wait_reason == ""


def test_failed_job_raises_job_failed_with_its_reason(client, idle):
    spec = tiny_gpt("py-diverges", steps=6)
    spec["optimizer"] = {"sgd": {"learningRate": 1e30}}
    job = client.submit(spec)
    with pytest.raises(baton.JobFailed) as e:
        job.wait(timeout=120)
    assert e.value.job.state == "FAILED"
    assert "diverged" in e.value.reason and e.value.reason == e.value.job.reason
    assert job.id in str(e.value)


def test_wait_times_out_with_the_last_snapshot(client, idle):
    job = client.submit(tiny_gpt("py-slow", steps=100000))
    try:
        start = time.monotonic()
        with pytest.raises(baton.WaitTimeout) as e:
            client.wait(job, timeout=1.5)
        # Not before its timeout; after it, by a bound that only catches a hang (the job
        # would run for many minutes).
        assert 1.5 <= time.monotonic() - start < 60
        assert isinstance(e.value, TimeoutError)
        assert e.value.job.id == job.id and not e.value.job.done
    finally:
        client.cancel(job)


def test_invalid_spec_names_the_field(client):
    with pytest.raises(baton.InvalidArgument) as e:
        client.submit(tiny_gpt("py-bad-heads", heads=3))
    assert e.value.field == "model.gpt.heads", e.value.message
    assert e.value.code.name == "INVALID_ARGUMENT" and e.value.method == "SubmitJob"
    assert isinstance(e.value, ValueError)
    with pytest.raises(baton.InvalidArgument) as e:
        client.submit(tiny_gpt("py-bad-mb"), pipeline__microbatches=3)
    assert e.value.field == "data.batch_size", e.value.message
    with pytest.raises(baton.InvalidArgument) as e:
        client.submit(tiny_gpt("py-zero"), steps=0)
    assert e.value.field == "steps", e.value.message


def test_spec_errors_name_the_file_and_position(client, tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text('{\n  "model": {"gpt": {"layers": 2,}}\n}\n')
    with pytest.raises(baton.SpecError) as e:
        client.submit(bad)
    assert str(bad) in str(e.value) and "line 2 column 33" in str(e.value)
    assert (e.value.source, e.value.line, e.value.column) == (str(bad), 2, 33)
    with pytest.raises(baton.SpecError, match="no field named \"stepz\""):
        client.submit({"stepz": 3})
    with pytest.raises(baton.SpecError, match="missing.json: cannot read"):
        client.submit(tmp_path / "missing.json")
    with pytest.raises(baton.SpecError, match="a JSON object"):
        (tmp_path / "list.json").write_text("[1, 2]")
        client.submit(tmp_path / "list.json")
    with pytest.raises(baton.SpecError, match="not a message"):
        client.submit(tiny_gpt("x"), steps__deeper=1)


def test_unknown_job_is_not_found(client):
    for call in (client.get, client.cancel, client.history, client.trace,
                 lambda j: list(client.watch(j))):
        with pytest.raises(baton.NotFound) as e:
            call("job-does-not-exist")
        assert "job-does-not-exist" in e.value.message and isinstance(e.value, LookupError)


def test_unreachable_coordinator_is_a_connection_error_within_the_deadline():
    # Nothing listens: refused at once.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = baton.Client(f"127.0.0.1:{port}", timeout=60)
    start = time.monotonic()
    with pytest.raises(baton.Unavailable) as e:
        c.get("job-000001")
    # Refused, not the deadline: the error is not "no connection within 60 s", and it came
    # long before that.
    assert "within" not in str(e.value) and time.monotonic() - start < 30, str(e.value)
    assert f"127.0.0.1:{port}" in str(e.value) and isinstance(e.value, ConnectionError)
    # A port that accepts and never answers: ended by the client's deadline (its error says
    # so), not before it.
    with tarpit() as address:
        c = baton.Client(address, timeout=2)
        start = time.monotonic()
        with pytest.raises(baton.Unavailable) as e:
            list(c.list())
        elapsed = time.monotonic() - start
        assert 1.5 < elapsed < 60, elapsed
        assert "no connection within 2 s" in str(e.value), str(e.value)
        assert address in str(e.value)
        with pytest.raises(baton.Unavailable):
            c.wait("job-000001", timeout=2)


def test_bad_client_settings_are_refused():
    with pytest.raises(baton.ConfigError, match="host:port"):
        baton.Client("no-port")
    with pytest.raises(baton.ConfigError, match="positive"):
        baton.Client("127.0.0.1:1", timeout=0)
    with pytest.raises(baton.ConfigError, match="cannot read"):
        baton.Client("127.0.0.1:1", tls=baton.TLS(ca="/nonexistent/ca.pem"))
    with pytest.raises(baton.ConfigError, match="together"):
        baton.Client("127.0.0.1:1", tls=baton.TLS(cert="/x.pem"))
    with pytest.raises(baton.ConfigError, match="positive timeout"):
        baton.Client("127.0.0.1:1").wait("job-000001", timeout=0)


def test_list_iterates_every_page_newest_first(client, idle):
    ids = [client.submit(tiny_gpt(f"py-list-{i}", steps=1)).id for i in range(3)]
    for i in ids:
        client.wait(i, timeout=120)
    listed = [j.id for j in client.list(page_size=1)]
    assert len(listed) == len(set(listed)) >= 3
    assert listed[:3] == ids[::-1]
    assert listed == [j.id for j in client.list()]


def test_workers(client, idle):
    workers = client.workers()
    assert sorted(w.id for w in workers) == [f"w-{i}" for i in range(1, NUM_WORKERS + 1)]
    for w in workers:
        assert w.state == "IDLE" and w.device_kind == "cpu" and w.address.startswith("127.0.0.1:")
        assert w.last_heartbeat is not None


def test_trace_equals_batonctl_trace(client, idle, tmp_path):
    job = client.wait(client.submit(tiny_gpt("py-trace", steps=3)), timeout=120)
    for step in (None, 2):
        ours = client.trace(job, step=step)
        out = tmp_path / f"trace-{step}.json"
        args = ["trace", job.id, "-o", str(out)] + (["--step", str(step)] if step else [])
        idle.ctl_ok(*args)
        assert ours == json.loads(out.read_text())
        assert ours["otherData"]["step"] == (step or 3)
        names = {e["name"] for e in ours["traceEvents"]}
        assert {"0F0", "1B0", "STEP"} <= names, sorted(names)[:20]
    with pytest.raises(baton.ConfigError):
        client.trace(job, step=0)
