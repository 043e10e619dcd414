"""A TensorBoard event-file writer with no dependencies: TFRecord framing (masked CRC-32C)
around hand-encoded tensorflow.Event protocol buffers carrying scalar summaries.

The format (tensorflow/core/util/event.proto, tensorflow/core/lib/io/record_writer.cc):
each record is uint64 length, uint32 masked_crc32c(length), the bytes, uint32
masked_crc32c(bytes), little-endian. The first Event says file_version "brain.Event:2";
each scalar is an Event{wall_time=1, step=2, summary=5{value=1{tag=1, simple_value=2}}}.
"""

import os
import socket
import struct
import time
from typing import Dict, List, Optional, Sequence

_CRC_TABLE: List[int] = []


def _crc32c(data: bytes) -> int:
    if not _CRC_TABLE:
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            _CRC_TABLE.append(c)
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return _varint((number << 3) | wire) + payload


def _bytes_field(number: int, data: bytes) -> bytes:
    return _field(number, 2, _varint(len(data)) + data)


def _event(wall_time: float, step: int, body: bytes) -> bytes:
    return _field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(step)) + body


def _record(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", _masked(_crc32c(length))) + data +
            struct.pack("<I", _masked(_crc32c(data))))


def write_scalars(logdir: str, run: str, steps: Sequence[int],
                  series: Dict[str, Sequence[Optional[float]]]) -> str:
    """Writes every series (tag -> one value per step; None skips that step) into a new
    event file under logdir/run and returns its path."""
    directory = os.path.join(logdir, run)
    os.makedirs(directory, exist_ok=True)
    now = time.time()
    path = os.path.join(directory,
                        f"events.out.tfevents.{int(now)}.{socket.gethostname()}.baton")
    with open(path + ".tmp", "wb") as f:
        f.write(_record(_event(now, 0, _bytes_field(3, b"brain.Event:2"))))
        for i, step in enumerate(steps):
            values = b""
            for tag, column in series.items():
                v = column[i]
                if v is None:
                    continue
                values += _bytes_field(1, _bytes_field(1, tag.encode()) +
                                       _field(2, 5, struct.pack("<f", float(v))))
            if values:
                f.write(_record(_event(now, int(step), _bytes_field(5, values))))
    os.replace(path + ".tmp", path)
    return path
