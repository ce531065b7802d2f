"""pytest fixtures for code instrumented with otelkit; load them in your ``conftest.py``:

    pytest_plugins = ["otelkit.testing.pytest_plugin"]

- ``otelkit_spans``: a ``MemoryCapture`` for the test: otelkit configured to keep this
  process's spans and metrics in memory, shut down after the test;
- ``otelkit_receiver``: a ``ReceiverCapture`` of the session's embedded receiver, reading only
  what arrived during the test; other processes export to its ``traces_url``;
- ``otelkit_receiver_server``: that ``Receiver`` itself, started once per session;
- ``wait_until``: ``otelkit.testing.wait_until``, as a fixture.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from otelkit.receiver import Receiver
from otelkit.testing import MemoryCapture, ReceiverCapture
from otelkit.testing import wait_until as _wait_until

__all__ = ["otelkit_receiver", "otelkit_receiver_server", "otelkit_spans", "wait_until"]


@pytest.fixture
def otelkit_spans() -> Iterator[MemoryCapture]:
    """This process's spans and otelkit's metrics during the test (``MemoryCapture``)."""
    with MemoryCapture() as capture:
        yield capture


@pytest.fixture(scope="session")
def otelkit_receiver_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    """An embedded OTLP/HTTP receiver on a free loopback port, for the whole session; servers
    started by many tests at once export to it (16 requests decoded at a time)."""
    with Receiver(tmp_path_factory.mktemp("otelkit-receiver"), max_concurrent=16) as running:
        yield running


@pytest.fixture
def otelkit_receiver(otelkit_receiver_server: Receiver) -> ReceiverCapture:
    """The spans the session's receiver stores during the test (``ReceiverCapture``)."""
    return ReceiverCapture(otelkit_receiver_server)


@pytest.fixture
def wait_until() -> Callable[..., Any]:
    """``otelkit.testing.wait_until``: poll a check until it holds, fail naming what it awaited."""
    return _wait_until
