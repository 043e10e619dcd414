"""Builds baton-client, generating its gRPC stubs from proto/baton/v1 on the way.

Everything else about the package is in pyproject.toml. The protos are looked for in
$BATON_PROTO_DIR, then in the repository this directory belongs to (../../proto); the
stubs (baton/v1/*_pb2.py, *_pb2.pyi, *_pb2_grpc.py) are written straight into the build
directory, so the source tree never holds generated code.
"""

import glob
import os
import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).parent.resolve()


def proto_root():
    candidates = []
    if os.environ.get("BATON_PROTO_DIR"):
        candidates.append(pathlib.Path(os.environ["BATON_PROTO_DIR"]))
    candidates.append(HERE.parent.parent / "proto")
    for root in candidates:
        if (root / "baton" / "v1" / "jobs.proto").is_file():
            return root
    raise SystemExit(
        "baton-client: cannot find proto/baton/v1/jobs.proto (looked in "
        + ", ".join(str(c) for c in candidates)
        + "); install from a baton checkout (pip install ./client/python) or set "
        "BATON_PROTO_DIR to its proto/ directory")


class BuildPyWithStubs(build_py):
    """build_py, then grpc_tools.protoc into the build directory."""

    def run(self):
        super().run()
        import grpc_tools
        from grpc_tools import protoc

        root = proto_root()
        protos = sorted(glob.glob(str(root / "baton" / "v1" / "*.proto")))
        out = self.build_lib
        # google/protobuf/*.proto (duration, timestamp) come with grpcio-tools.
        well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        args = ["grpc_tools.protoc", f"-I{root}", f"-I{well_known}", f"--python_out={out}",
                f"--pyi_out={out}", f"--grpc_python_out={out}", *protos]
        if protoc.main(args) != 0:
            raise SystemExit(f"baton-client: protoc failed on {root}/baton/v1")


setup(cmdclass={"build_py": BuildPyWithStubs})
