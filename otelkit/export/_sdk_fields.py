"""What otelkit's OTLP encoders of SDK spans share (``otlp_proto``: protobuf, ``otlp_json_encode``:
JSON): the grouping, the reading of a span's parts, and protobuf's rules for strings and int64.

Both mirror opentelemetry-exporter-otlp-proto-common's ``encode_spans``, which builds protobuf
objects through protobuf's Python API; they write the same request directly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import ReadableSpan

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Link

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


def contents(
    span: ReadableSpan,
) -> tuple[Mapping[str, Any] | None, Sequence[Event], Sequence[Link]]:
    """A span's attributes, events and links. A ``ReadableSpan``'s properties wrap the first in
    a proxy and copy the others into tuples, on every read; its own fields read at once."""
    if type(span) is ReadableSpan:
        return span._attributes, span._events, span._links
    return span.attributes, span.events, span.links


def attribute_items(attributes: Mapping[Any, Any] | None) -> Iterable[tuple[Any, Any]]:
    # BoundedAttributes iterates in Python, a generator step and a __getitem__ a pair; its dict
    # holds the same pairs in the same order, and reads at a third of the cost. The dict is
    # private: should the SDK rename it, this falls back to the public way. (Spans are immutable
    # once ended, so nothing changes the dict while it is read.)
    if type(attributes) is BoundedAttributes:
        pairs = getattr(attributes, "_dict", None)
        if type(pairs) is dict:
            return pairs.items()
    return attributes.items() if attributes else ()


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
