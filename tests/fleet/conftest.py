"""The fleet's tests share one etcd (each test under a key prefix of its own)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from otelkit.fleet import EtcdRegistry
from tests.fleet.components import EtcdServer


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd")).start()
    yield server
    server.stop()


@pytest.fixture
def registry(etcd: EtcdServer) -> EtcdRegistry:
    """A registry of its own in the shared etcd."""
    return EtcdRegistry(etcd.url, prefix=f"/tests/{uuid.uuid4().hex}/")
