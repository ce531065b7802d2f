"""A gRPC response's tensor bytes, counted from its wire format while it is parsed.

otelkit rebuilds a gRPC client's ``ModelInfer`` with a deserialiser that, besides parsing,
counts the response's tensor bytes (the lengths of its ``raw_output_contents``) and outputs
from the top-level field keys and lengths of the bytes on the wire (``_sync.attach_model_infer``).
Reading the same from the parsed message copies every tensor out (about 50 us for 600 kB), and
walking the outputs' shapes costs 5 to 7 us right after a network wait; this costs under 2.

The counts wait in ``RECEIVED``, keyed by the parsed message, until the call that asked for
them takes them (``received_tensors``); when too many wait, nobody was taking them and they go.
"""

from __future__ import annotations

from typing import Any

from otelkit._internal import internal_error

__all__ = ["KEEP_WIRE_BYTES", "RECEIVED", "counted_on_wire", "keep_received", "received_tensors",
           "wire_tensors"]  # fmt: skip

_OUTPUTS_KEY = 0x2A  # field 5, length-delimited: ModelInferResponse.outputs
_RAW_OUTPUT_KEY = 0x32  # field 6, length-delimited: ModelInferResponse.raw_output_contents
# A call keeps a response up to this size to count it off the caller's path (about 2 us saved
# right after the network wait); a larger one is counted as it arrives, so that calls waiting
# for the worker (at most ``Later``'s limit, 4,096) never hold more than 64 MiB of responses.
KEEP_WIRE_BYTES = 16 * 1024
MAX_WAITING = 64  # each keeps its message alive: a bound on memory, not only on entries

RECEIVED: dict[int, tuple[Any, int, int]] = {}  # id(message) -> (message, bytes, outputs)


def _varint(raw: bytes, pos: int) -> tuple[int, int]:
    """The varint that starts at ``pos``, and the position after it."""
    value = shift = 0
    while True:
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def wire_tensors(raw: bytes) -> tuple[int, int]:
    """The tensor bytes and the number of outputs of a serialised ``ModelInferResponse``.

    Keys and most lengths fit one byte: those are read inline, the rest by ``_varint``.
    Raises ``ValueError`` or ``IndexError`` for bytes that are not a protobuf message.
    """
    pos, end = 0, len(raw)
    total = outputs = 0
    while pos < end:
        key = raw[pos]
        pos += 1
        if key > 0x7F:
            key, pos = _varint(raw, pos - 1)
        wire = key & 7
        if wire == 2:
            length = raw[pos]
            pos += 1
            if length > 0x7F:
                length, pos = _varint(raw, pos - 1)
            if key == _RAW_OUTPUT_KEY:
                total += length
            elif key == _OUTPUTS_KEY:
                outputs += 1
            pos += length
        elif wire == 0:
            _, pos = _varint(raw, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"wire type {wire} before byte {pos}")
    if pos != end:
        raise ValueError("the last field runs past the end of the message")
    return total, outputs


def counted_on_wire(raw: bytes) -> tuple[int, int] | None:
    """``wire_tensors(raw)``, or ``None`` when that fails (otelkit's own error, counted)."""
    try:
        return wire_tensors(raw)
    except Exception:
        internal_error("counting a gRPC response's tensor bytes")
        return None


def keep_received(message: Any, raw: bytes) -> None:
    """Count ``raw`` (the bytes ``message`` was parsed from) for its call to take."""
    counted = counted_on_wire(raw)
    if counted is None:
        return
    if len(RECEIVED) >= MAX_WAITING:
        RECEIVED.clear()  # one step under the GIL: no lock needed
    RECEIVED[id(message)] = (message, *counted)


def received_tensors(message: Any) -> tuple[int, int] | None:
    """The tensor bytes and outputs counted for ``message``, once; ``None`` when it did not come
    through a rebuilt ``ModelInfer`` (a stream's response) or waited too long."""
    found = RECEIVED.pop(id(message), None)
    if found is None or found[0] is not message:
        return None
    return found[1], found[2]
