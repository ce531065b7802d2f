"""A gRPC response's tensor bytes, counted from its wire format.

otelkit rebuilds a gRPC client's ``ModelInfer`` with a deserialiser that tells a sampled call
when its response came back (``_transport.attach_model_infer``); it also hands the call the
bytes on the wire, whose tensor bytes (the lengths of its ``raw_output_contents``) and outputs
are counted here from the top-level field keys and lengths: reading the same from the parsed
message would copy every tensor out of it.
"""

from __future__ import annotations

from otelkit._core.guard import internal_error

__all__ = ["KEEP_WIRE_BYTES", "counted_on_wire", "wire_tensors"]

_OUTPUTS_KEY = 0x2A  # field 5, length-delimited: ModelInferResponse.outputs
_RAW_OUTPUT_KEY = 0x32  # field 6, length-delimited: ModelInferResponse.raw_output_contents
# A sampled call keeps a response's bytes up to this size to count them off the caller's path
# (not right after the network wait); a larger one is counted as it arrives, so that calls
# waiting for the worker (at most ``Later``'s limit, 4,096) never hold more than 64 MiB of
# wire bytes besides their parsed results (and as much of request messages, kept up to the
# same size: ``_call.Call``).
KEEP_WIRE_BYTES = 16 * 1024


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
