"""The gRPC stubs of baton.v1, generated from proto/baton/v1 when the package is built
(jobs_pb2, jobs_pb2_grpc, job_pb2, training_pb2, cluster_pb2, ...)."""
