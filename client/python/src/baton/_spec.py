"""Job specs as data: a JSON file (the one batonctl reads), a dict, or a JobSpec message,
with keyword overrides, turned into a baton.v1.JobSpec.

Nothing here checks whether a spec makes sense: the coordinator does, and its refusals
come back as InvalidArgument naming the field. This side only reports what stops it from
building the message at all (a file that is not JSON, a field the message does not have).
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any, Mapping, Optional, Union

from google.protobuf import json_format

from baton._errors import SpecError
from baton.v1 import job_pb2

SpecLike = Union[str, "os.PathLike[str]", Mapping[str, Any], job_pb2.JobSpec]


def _same_key(a: str, b: str) -> bool:
    # JSON names are lowerCamel ("batchSize"), proto names snake ("batch_size"): both parse.
    return a.replace("_", "").lower() == b.replace("_", "").lower()


def apply_overrides(spec: dict, overrides: Mapping[str, Any]) -> dict:
    """Sets each override in `spec` (a JSON-form dict), in place, and returns it.

    A key names a field; a double underscore goes one message deeper:
    steps=10, name="run-2", pipeline__stages=2, optimizer__adamw__learning_rate=1e-3.
    Either spelling of a name works (batch_size or batchSize); the override replaces
    whichever spelling the spec used. Setting one member of a oneof (model__mlp=...) does
    not remove another the spec set: the message then refuses both.
    """
    for key, value in overrides.items():
        path = key.split("__")
        if not all(path):
            raise SpecError(f"override {key!r}: empty field name (use a__b for a.b)")
        node = spec
        for depth, part in enumerate(path[:-1], start=1):
            name = next((k for k in node if _same_key(k, part)), part)
            child = node.setdefault(name, {})
            if not isinstance(child, dict):
                raise SpecError(f"override {key!r}: {'.'.join(path[:depth])} is "
                                f"{type(child).__name__}, not a message")
            node = child
        for k in [k for k in node if _same_key(k, path[-1])]:
            del node[k]
        node[path[-1]] = value
    return spec


def _load_file(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise SpecError(f"{path}: cannot read the spec: {e.strerror or e}", source=path) from None
    except UnicodeDecodeError as e:
        raise SpecError(f"{path}: not UTF-8 text (byte {e.start})", source=path) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"{path}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}",
                        source=path, line=e.lineno, column=e.colno) from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a job spec is a JSON object, got {type(data).__name__}",
                        source=path)
    return data


def to_job_spec(spec: SpecLike, overrides: Optional[Mapping[str, Any]] = None) -> job_pb2.JobSpec:
    """The baton.v1.JobSpec for `spec` (a JSON file path, a dict or a JobSpec) with
    `overrides` applied (as Client.submit takes them). SpecError names the source."""
    if isinstance(spec, job_pb2.JobSpec):
        source = "spec"
        data = json_format.MessageToDict(spec, preserving_proto_field_name=True)
    elif isinstance(spec, (str, os.PathLike)):
        source = os.fspath(spec)
        data = _load_file(source)
    elif isinstance(spec, Mapping):
        source = "spec"
        data = copy.deepcopy(dict(spec))
    else:
        raise SpecError(f"a spec is a path, a dict or a baton.v1.JobSpec, got "
                        f"{type(spec).__name__}")
    apply_overrides(data, overrides or {})
    try:
        return json_format.ParseDict(data, job_pb2.JobSpec())
    except json_format.ParseError as e:
        raise SpecError(f"{source}: {e}", source=source) from None
