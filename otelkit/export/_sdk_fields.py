"""What otelkit's OTLP encoders of SDK spans share (``otlp_proto``: protobuf, ``otlp_json_encode``:
JSON): the grouping, the reading of a span's parts, and protobuf's rules for strings and int64.

Both mirror opentelemetry-exporter-otlp-proto-common's ``encode_spans``, which builds protobuf
objects through protobuf's Python API; they write the same request directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry.sdk.trace import ReadableSpan

# A span's parts, read without the copies its properties make (SDK private fields, guarded).
from otelkit._core.deps.otel import attribute_items
from otelkit._core.deps.otel import span_contents as contents

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "attribute_items",
    "contents",
    "grouped",
    "int64",
    "proto_string",
]

T = TypeVar("T")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # what protobuf's int64 holds


def grouped(
    spans: Sequence[ReadableSpan], encode: Callable[[ReadableSpan], T]
) -> dict[Resource, dict[InstrumentationScope | None, list[T]]]:
    """Each span ``encode``d, grouped as ``encode_spans`` groups them: by equal resource, then
    equal scope, in order of first appearance; of equal resources (or scopes) the first is the
    key."""
    groups: dict[Resource, dict[InstrumentationScope | None, list[T]]] = {}
    # Finding a resource by equality hashes its attributes as JSON: once per object, not per span.
    by_identity: dict[tuple[int, int], tuple[list[T], Resource, Any]] = {}
    for span in spans:
        resource, scope = span.resource, span.instrumentation_scope or None
        known = by_identity.get((id(resource), id(scope)))
        if known is None:  # the objects are kept in the value, so their ids stay theirs
            group = groups.setdefault(resource, {}).setdefault(scope, [])
            known = by_identity[id(resource), id(scope)] = (group, resource, scope)
        known[0].append(encode(span))
    return groups


def proto_string(value: object) -> str:
    """What protobuf stores for a string field given ``value``, or its error."""
    if isinstance(value, str):
        if not value.isascii():
            value.encode()  # UnicodeEncodeError on a lone surrogate, as protobuf raises
        return str.__str__(value)
    if isinstance(value, bytes):
        return value.decode()
    if value is None:
        return ""
    raise TypeError(f"bad argument type for a string field: {type(value)}")


def int64(value: int) -> int:
    """``value`` as protobuf's int64 takes it, or its error."""
    number = int(value)
    if not INT64_MIN <= number <= INT64_MAX:
        raise ValueError(f"Value out of range: {number}")
    return number
