"""What an ``HTTPParseError`` of tritonclient's HTTP client says about who broke the response.

tritonclient's HTTP client reads responses with geventhttpclient, whose parser is llhttp. Its
error ``('Invalid header token', 10)`` is llhttp's error number 10 (``HPE_INVALID_HEADER_TOKEN``,
not a byte 10): a header line of the response whose name holds a byte a header name cannot
(a space, a NUL, a non-ASCII byte) or that has no colon, after a valid status line. Bytes of
another response read from the middle would fail on the status line instead (error 8). And
the client cannot send a broken header: geventhttpclient refuses a header name or value with a
control character before anything is sent (``ValueError``), and ``Remote`` gives each thread
its own HTTP client. So a parse error whose bytes begin with a status line is Triton's
malformed response; one whose bytes do not is a connection that carried another response's
bytes, ours to fix.

``keep_response_heads()`` makes every response keep its first bytes as received, so that the
error carries them; ``explain()`` says which of the two it was, with the bytes.
"""

from __future__ import annotations

__all__ = ["HEAD_BYTES", "explain", "keep_response_heads"]

HEAD_BYTES = 1024  # of each response, kept: the status line and headers, a little body
_HEAD = "_gnn_tracking_head"
_KEEPS = "_gnn_tracking_keeps_heads"


def keep_response_heads() -> None:
    """From now on, in this process, an ``HTTPParseError`` of geventhttpclient carries the
    first ``HEAD_BYTES`` bytes of the response it failed on (``received``). Once is enough."""
    from geventhttpclient import response

    feed = response.HTTPResponse.feed
    if getattr(feed, _KEEPS, False):
        return

    def keeping(self: response.HTTPResponse, data: str | bytes) -> None:
        head: bytes = self.__dict__.get(_HEAD, b"")
        if len(head) < HEAD_BYTES:
            chunk = data.encode("latin-1") if isinstance(data, str) else bytes(data)
            head += chunk[: HEAD_BYTES - len(head)]
            self.__dict__[_HEAD] = head
        try:
            feed(self, data)
        except response.HTTPParseError as error:
            error.received = head  # type: ignore[attr-defined]
            raise

    setattr(keeping, _KEEPS, True)
    response.HTTPResponse.feed = keeping  # type: ignore[method-assign]


def explain(error: BaseException) -> str | None:
    """Whose fault an ``HTTPParseError`` was, with the bytes received when they were kept
    (``keep_response_heads``); ``None`` for any other error.

    >>> from geventhttpclient.response import HTTPParseError
    >>> failed = HTTPParseError("Invalid header token", 10)
    >>> failed.received = b"HTTP/1.1 200 OK\\r\\nContent-Length: 8\\r\\n\\x00\\x01"
    >>> print(explain(failed))  # doctest: +ELLIPSIS
    Triton's response was malformed (upstream): ...
    """
    if not any(kind.__name__ == "HTTPParseError" for kind in type(error).__mro__):
        return None  # by name: a gRPC-only install has no geventhttpclient to import
    received: bytes | None = getattr(error, "received", None)
    what = f"HTTPParseError{error.args}"
    if received is None:
        return f"{what}; the bytes received were not kept (keep_response_heads)"
    if received.startswith(b"HTTP/"):
        return (
            f"Triton's response was malformed (upstream): {what} in a response that begins with "
            f"a status line, from a connection only this thread uses, to headers the client "
            f"checked before sending; received {received!r}"
        )
    return (
        f"the connection carried bytes that begin no response (ours: a client shared between "
        f"threads, or a response not read to its end): {what}; received {received!r}"
    )
