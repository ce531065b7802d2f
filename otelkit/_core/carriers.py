"""Reading and writing header fields in the carriers an inference server meets.

Private to ``otelkit._propagation``. Header names match case-insensitively and repeated fields
are combined with "," (RFC 9110 section 5.3), whatever the carrier: a ``dict``, a mapping with
``get_all``/``getlist`` (``email.message.Message``, ``http.client.HTTPMessage``, starlette
``Headers``), a multidict, or ``(key, value)`` pairs of ``str`` or ``bytes`` (gRPC metadata,
``grpc.aio.Metadata``, ASGI raw headers).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, TypeAlias, TypeGuard, TypeVar, cast

if TYPE_CHECKING:
    from email.message import Message

__all__ = ["Carrier", "CarrierT", "read", "write"]

#: What ``extract`` reads: a header mapping (``dict``, starlette ``Headers``, ``HTTPMessage``)
#: or metadata as ``(key, value)`` pairs (gRPC metadata, ASGI raw headers).
Carrier: TypeAlias = "Mapping[str, Any] | Message | Iterable[tuple[str | bytes, str | bytes]]"
#: What ``inject`` writes to; a tuple comes back as a new tuple.
CarrierT = TypeVar(
    "CarrierT", bound="MutableMapping[str, Any] | Message | list[Any] | tuple[Any, ...]"
)


def _text(value: object) -> str:
    if value.__class__ is str:
        return value
    return value.decode("latin-1") if isinstance(value, bytes) else str(value)


def _lowered(keys: Iterable[Any]) -> list[str]:
    try:
        return [*map(str.lower, keys)]  # no Python-level loop: this runs on every request
    except TypeError:  # bytes keys: ASGI raw headers, gRPC metadata
        return [_text(key).lower() for key in keys]


def read(carrier: Carrier, names: frozenset[str]) -> dict[str, str]:
    """The fields of ``carrier`` named in ``names`` (lowercase), repeats joined with ","."""
    if type(carrier) is dict:  # the usual carrier: keys and one lookup, no pairs built
        keys = [*carrier]
        lowered = _lowered(keys)
        found = {}
        for name in names.intersection(lowered):
            value = carrier.get(name)
            if value.__class__ is str and lowered.count(name) == 1:
                found[name] = value
            else:
                found[name] = _join(
                    [carrier[k] for k, low in zip(keys, lowered, strict=True) if low == name]
                )
        return found
    if isinstance(carrier, Mapping) or (
        not isinstance(carrier, (list, tuple)) and _is_message(carrier)
    ):
        # Header mappings' get_all/getlist match names case-insensitively and give repeats
        # (Message, HTTPMessage, starlette Headers); other mappings through items(), which a
        # multidict gives with its repeats.
        get_all = getattr(carrier, "get_all", None) or getattr(carrier, "getlist", None)
        if get_all is not None:
            return {name: _join(values) for name in names if (values := get_all(name))}
        pairs = [*carrier.items()]
    else:  # (key, value) pairs; grpc.aio.Metadata, whose get_all is case-sensitive, too
        pairs = [*carrier]
    lowered = _lowered([pair[0] for pair in pairs])
    return {
        name: _join([pair[1] for pair, low in zip(pairs, lowered, strict=True) if low == name])
        for name in names.intersection(lowered)
    }


def _is_message(carrier: object) -> TypeGuard[Message]:
    """Whether ``carrier`` is an ``email.message.Message`` (``http.client.HTTPMessage`` is one),
    without importing ``email``, which ``import otelkit`` would otherwise pay for: a message
    exists only once its module has been imported."""
    module = sys.modules.get("email.message")
    return module is not None and isinstance(carrier, module.Message)


def _join(values: Iterable[Any]) -> str:
    """The values of a repeated field combined into one, as RFC 9110 says."""
    texts: list[str] = []
    for value in values:
        if isinstance(value, (list, tuple)):  # OpenTelemetry's dict-of-lists carriers
            texts.extend(map(_text, value))
        else:
            texts.append(_text(value))
    return ",".join(texts)


def write(carrier: CarrierT, fields: list[tuple[str, str]], owned: frozenset[str]) -> CarrierT:
    """Replace every field named in ``owned``, in any letter case, with ``fields``."""
    if isinstance(carrier, (list, tuple)):
        as_bytes = bool(carrier) and isinstance(carrier[0][0], bytes)  # ASGI raw headers
        new = [(k.encode(), v.encode()) for k, v in fields] if as_bytes else fields
        lowered = _lowered([pair[0] for pair in carrier])
        kept = [pair for pair, low in zip(carrier, lowered, strict=True) if low not in owned]
        if isinstance(carrier, tuple):
            return cast("CarrierT", (*kept, *new))
        carrier[:] = [*kept, *new]
        return carrier
    mapping: MutableMapping[Any, str] = carrier  # type: ignore[assignment]
    try:  # the usual case, none of ours there yet, checked without building lists
        clash = not owned.isdisjoint(map(str.lower, mapping))
    except TypeError:  # keys that are not str
        clash = True
    if clash:
        keys = [*mapping]
        for key, low in zip(keys, _lowered(keys), strict=True):
            if low in owned:
                with contextlib.suppress(KeyError):  # a Message drops all casings at once
                    del mapping[key]
    for name, value in fields:
        mapping[name] = value
    return carrier
