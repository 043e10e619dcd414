"""A job step's trace (baton.v1.JobTrace) as Chrome trace-event JSON: the same document
`batonctl trace` writes (client/batonctl/trace_json.cc), as a dict. Save it with
json.dump and open it in Perfetto (ui.perfetto.dev) or chrome://tracing.

Layout: one process per rank ("rank R (worker W)"), one thread (track) per global stage,
a "gradient all-reduce" track for data-parallel all-reduces; every action a complete
event ("ph": "X") in microseconds from the earliest rank's step start.
"""

from __future__ import annotations

import re

from baton.v1 import jobs_pb2

_COMM_TID = 100000

# "{stage}{kind}{microbatch}", "{stage}REDUCE_GRAD", "{stage}TIE_GRAD", "CLIP_GRAD" or "STEP"
# (common/schedule/action.h).
_ACTION = re.compile(r"^(\d+)(F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B|REDUCE_GRAD|TIE_GRAD)(\d*)$")
_NO_MICROBATCH = ("REDUCE_GRAD", "TIE_GRAD")

_CATEGORY = {"F": "forward", "B": "backward", "I": "backward_input", "W": "backward_weight",
             "SEND_F": "send", "SEND_B": "send", "RECV_F": "recv_wait", "RECV_B": "recv_wait",
             "REDUCE_GRAD": "reduce_grad", "TIE_GRAD": "tie_grad", "CLIP_GRAD": "clip_grad",
             "STEP": "optimizer"}


def _us(ns: int) -> float:
    return float(f"{ns / 1e3:.3f}")


def _parse(text: str, rank: int):
    t = text.strip()
    if t in ("STEP", "CLIP_GRAD"):  # the rank's, no stage (like STEP)
        return t, 0, 0
    m = _ACTION.match(t)
    if m is None or (m.group(2) in _NO_MICROBATCH) != (m.group(3) == ""):
        raise ValueError(f"rank {rank}: action {text!r} does not parse")
    return m.group(2), int(m.group(1)), int(m.group(3) or 0)


def chrome_trace(trace: jobs_pb2.JobTrace) -> dict:
    """The Chrome trace-event document of `trace`. ValueError when an action does not
    parse or names a stage outside the job."""
    num_stages = trace.num_stages
    origin = min((r.start_unix_nanos for r in trace.ranks), default=0)
    events = []
    for r in trace.ranks:
        pid = r.rank
        stages = {s for s, owner in enumerate(trace.stage_to_rank) if owner == r.rank}
        body = []
        comm = False
        for span in r.actions:
            kind, stage, mb = _parse(span.action, r.rank)
            if kind in ("STEP", "CLIP_GRAD"):  # the rank's: its first stage's row
                stage = min(stages) if stages else 0
            else:
                if stage < 0 or (num_stages > 0 and stage >= num_stages):
                    raise ValueError(f"rank {r.rank}: action {span.action} names stage "
                                     f"{stage} of {num_stages}")
                stages.add(stage)
            if span.send_wait:
                name, cat = f"wait {span.action}", "send_wait"
            elif span.allreduce:
                name, cat = f"all-reduce {span.action}", "allreduce"
            else:
                name, cat = span.action, _CATEGORY[kind]
            comm = comm or span.allreduce
            args = {"action": span.action}
            if kind not in ("STEP", "CLIP_GRAD"):
                args["stage"] = stage
                args["microbatch"] = mb
            if span.bytes > 0:
                args["bytes"] = span.bytes
            if span.device_ns > 0:
                args["device_us"] = _us(span.device_ns)
            start = r.start_unix_nanos - origin + span.start_ns
            body.append({"name": name, "cat": cat, "ph": "X", "ts": _us(start),
                         "dur": _us(max(0, span.end_ns - span.start_ns)), "pid": pid,
                         "tid": _COMM_TID if span.allreduce else stage, "args": args})
        process = f"rank {r.rank}" + (f" ({r.worker_id})" if r.worker_id else "")
        events.append({"name": "process_name", "ph": "M", "pid": pid,
                       "args": {"name": process}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": pid,
                       "args": {"sort_index": pid}})
        for s in sorted(stages):
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": s,
                           "args": {"name": f"stage {s}"}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": s,
                           "args": {"sort_index": s}})
        if comm:
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": _COMM_TID,
                           "args": {"name": "gradient all-reduce"}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": pid,
                           "tid": _COMM_TID, "args": {"sort_index": _COMM_TID}})
        events.extend(body)
    return {"displayTimeUnit": "ms",
            "otherData": {"job_id": trace.job_id, "step": trace.step,
                          "schedule": trace.schedule, "num_stages": num_stages,
                          "ranks": len(trace.ranks)},
            "traceEvents": events}
