"""baton: submit, watch and inspect pipeline-parallel training jobs on a baton cluster.

    import baton
    client = baton.Client("127.0.0.1:7070")
    job = client.submit("client/examples/gpt.json", steps=50)
    job = client.wait(job, timeout=600)
    print(job.weights_digest, job.history().loss[-1])

Every error is a BatonError (see baton._errors); the gRPC messages themselves are in
baton.v1 (jobs_pb2, job_pb2, ...), generated from the repository's proto/ at build time.
"""

from baton._client import Client, TLS
from baton._errors import (AlreadyExists, BatonError, Cancelled, ConfigError, DeadlineExceeded,
                           FailedPrecondition, Internal, InvalidArgument, JobCancelled, JobError,
                           JobFailed, NotFound, PermissionDenied, ResourceExhausted, RpcError,
                           SpecError, Unauthenticated, Unavailable, WaitTimeout)
from baton._spec import to_job_spec
from baton._types import History, Job, JobState, StateEvent, StepEvent, Worker

__version__ = "0.1.0"

__all__ = [
    "Client", "TLS", "Job", "JobState", "StateEvent", "StepEvent", "History", "Worker",
    "to_job_spec",
    "BatonError", "ConfigError", "SpecError", "RpcError", "InvalidArgument", "NotFound",
    "AlreadyExists", "FailedPrecondition", "PermissionDenied", "Unauthenticated",
    "ResourceExhausted", "Unavailable", "DeadlineExceeded", "Cancelled", "Internal",
    "JobError", "JobFailed", "JobCancelled", "WaitTimeout",
]
