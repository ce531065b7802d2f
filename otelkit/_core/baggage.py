"""W3C Baggage header parsing and formatting (https://www.w3.org/TR/baggage/).

Private to ``otelkit._propagation``: entries live in the Context through OpenTelemetry's
``opentelemetry.baggage`` API, so OpenTelemetry's own code sees them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from urllib.parse import quote, unquote

from opentelemetry import baggage
from opentelemetry.context import Context

__all__ = ["MAX_BYTES", "MAX_MEMBERS", "format_baggage", "parse_baggage"]

_logger = logging.getLogger(__name__)

# The spec's floor for what a platform must propagate; beyond it members may be dropped.
MAX_MEMBERS = 64
MAX_BYTES = 8192

_OWS = r"[ \t]*"
_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"  # RFC 7230 section 3.2.6
# baggage-octet: printable US-ASCII less DQUOTE, comma, semicolon and backslash
_OCTETS = r"[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*"
_PROPERTY = rf"{_OWS};{_OWS}{_TOKEN}(?:{_OWS}={_OWS}{_OCTETS})?"
_MEMBER_RE = re.compile(rf"({_TOKEN}){_OWS}={_OWS}({_OCTETS})(?:{_PROPERTY})*")
_KEY_RE = re.compile(_TOKEN)
# Every baggage-octet but "%", which must be encoded for the value to decode back to itself.
_SAFE = "!#$&'()*+-./:<=>?@[]^_`{|}~"


def parse_baggage(header: str, context: Context) -> Context:
    """Add the members of a ``baggage`` header to the baggage of ``context``.

    Values are percent-decoded (invalid UTF-8 becomes U+FFFD, as the spec says); properties
    are dropped, since OpenTelemetry's baggage holds none; malformed members are skipped;
    members past ``MAX_MEMBERS`` are dropped.
    """
    kept = 0
    for member in header.split(","):
        member = member.strip(" \t")
        if not member:
            continue
        match = _MEMBER_RE.fullmatch(member)
        if match is None:
            _logger.debug("baggage: skipped malformed list-member %r", member)
            continue
        if kept == MAX_MEMBERS:
            _logger.debug("baggage: more than %d list-members, the rest dropped", MAX_MEMBERS)
            break
        kept += 1
        context = baggage.set_baggage(match[1], unquote(match[2]), context)
    return context


def format_baggage(entries: Mapping[str, object]) -> str:
    """The ``baggage`` header for ``entries``, values percent-encoded as UTF-8.

    A key that is not an RFC 7230 token cannot be sent and is skipped; whole members that
    would take the header past ``MAX_MEMBERS`` or ``MAX_BYTES`` are dropped, never cut.
    """
    members: list[str] = []
    size = -1  # the first member needs no comma
    for key, value in entries.items():
        if _KEY_RE.fullmatch(key) is None:
            _logger.debug("baggage: key %r is not an RFC 7230 token, not sent", key)
            continue
        member = f"{key}={quote(str(value), safe=_SAFE)}"
        if len(members) == MAX_MEMBERS or size + 1 + len(member) > MAX_BYTES:
            _logger.debug("baggage: member %r dropped by the W3C size limits", key)
            continue
        members.append(member)
        size += 1 + len(member)
    return ",".join(members)
