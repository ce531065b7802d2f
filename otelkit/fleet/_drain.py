"""Saturation-aware draining, per server: a server whose queue stays long is taken out of
Envoy's rotation until it recovers.

Each server's saturation is SuperSONIC's signal, queue milliseconds per execution
(``nv_inference_queue_duration_us`` over ``nv_inference_exec_count``, every model summed),
read from its metrics endpoint every ``interval_s`` and taken over the last ``window_s``. A
server at or above ``high_ms`` for ``sustain_s`` is **drained**: the renderer writes it with
Envoy's ``DRAINING`` health status, so Envoy sends it no new request while those it has finish.
It comes back once at or below ``low_ms`` (half of ``high_ms`` by default) for ``sustain_s``:
the gap between the two and the time held keep a server near the threshold from flapping. A
drained server gets no new work, so its queue empties and it returns: draining spreads a hot
spot; it does not shed load. Servers are never all drained: when every server is saturated the
fleet is (scale it, or let clients back off), and taking any out would only move the queue.

SuperSONIC compares the whole deployment's mean with its threshold and refuses only new
clients; this acts per server and per request. Each decision is a log line and a metric
(``otelkit_fleet_drained{server}``, ``otelkit_fleet_saturation_milliseconds{server}``). A
server whose metrics cannot be read keeps its state, and says so once.

>>> drain = Draining(high_ms=100.0, window_s=2.0, sustain_s=2.0)
>>> for t in (0.0, 1.0, 2.0, 3.0):  # 150 ms queued per execution, held 2 s: drained
...     decisions = drain.observe({"a": (150_000.0 * t, t), "b": (0.0, t)}, now=t)
>>> sorted(drain.drained)
['a']
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from otelkit import semconv
from otelkit.fleet._record import ServerRecord

__all__ = ["Draining", "read_counters"]

_log = logging.getLogger("otelkit.fleet")

#: A server's cumulative (queue microseconds, executions), or None when unreadable.
Counters = tuple[float, float]
Fetch = Callable[[str, float], str]


def _fetch(url: str, timeout_s: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return str(response.read(1 << 24).decode("utf-8", "replace"))


def read_counters(text: str) -> Counters:
    """``(queue µs, executions)`` over every model of a Triton ``/metrics`` page."""
    queue = executions = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # the parser names a counter's samples <family>_total; Triton's have no suffix
            name = family.name if sample.name == f"{family.name}_total" else sample.name
            if name == semconv.TRITON_QUEUE_DURATION_US:
                queue += float(sample.value)
            elif name == semconv.TRITON_EXECUTION_COUNT:
                executions += float(sample.value)
    return queue, executions


@dataclass
class _Server:
    samples: deque[tuple[float, float, float]] = field(default_factory=deque)  # at, queue, execs
    since: float | None = None  # when it last crossed its threshold, still beyond it
    drained: bool = False
    saturation_ms: float | None = None
    unreadable: bool = False


class Draining:
    """Decides, from each server's saturation, which servers Envoy should drain."""

    def __init__(
        self,
        *,
        high_ms: float = 100.0,
        low_ms: float | None = None,
        window_s: float = 5.0,
        sustain_s: float = 5.0,
        interval_s: float = 1.0,
        timeout_s: float = 1.0,
        fetch: Fetch = _fetch,
    ) -> None:
        low = high_ms / 2 if low_ms is None else low_ms
        if not 0 <= low < high_ms or not window_s > 0 or not sustain_s >= 0 or not interval_s > 0:
            raise ValueError(
                "draining: 0 <= low_ms < high_ms, window_s and interval_s above 0, sustain_s >= 0"
            )
        self.high_ms, self.low_ms, self.window_s, self.sustain_s = high_ms, low, window_s, sustain_s
        self.interval_s, self.timeout_s, self._fetch = interval_s, timeout_s, fetch
        self._servers: dict[str, _Server] = {}
        self._lock = threading.Lock()
        self.decisions = 0  # drains and returns so far

    @property
    def drained(self) -> set[str]:
        with self._lock:
            return {name for name, s in self._servers.items() if s.drained}

    def saturation(self) -> dict[str, float]:
        """Each server's queue ms per execution over the window, where known."""
        with self._lock:
            return {
                n: s.saturation_ms for n, s in self._servers.items() if s.saturation_ms is not None
            }

    def poll(self, servers: Mapping[str, ServerRecord]) -> set[str]:
        """Read every server's metrics now and decide; the servers to drain."""
        readings: dict[str, Counters | None] = {}
        for name, record in servers.items():
            if record.metrics is None:
                continue
            try:
                readings[name] = read_counters(
                    self._fetch(f"http://{record.metrics}/metrics", self.timeout_s)
                )
            except (OSError, ValueError) as error:
                readings[name] = None
                server = self._servers.get(name)
                if server is None or not server.unreadable:
                    _log.warning(
                        "fleet: %s: metrics unreadable, its drain state kept: %s", name, error
                    )
        return self.observe(readings, now=time.monotonic())

    def observe(self, readings: Mapping[str, Counters | None], *, now: float) -> set[str]:
        """Take one reading a server (``None``: unreadable) at ``now``; the servers to drain."""
        with self._lock:
            for gone in set(self._servers) - set(readings):
                del self._servers[gone]  # left the fleet
            for name, reading in readings.items():
                server = self._servers.setdefault(name, _Server())
                server.unreadable = reading is None
                if reading is not None:
                    self._update(name, server, reading, now)
            drained = {n for n, s in self._servers.items() if s.drained}
            if drained and drained == set(readings):
                return set()  # every server saturated: the fleet is; draining moves nothing
            return drained

    def _update(self, name: str, server: _Server, reading: Counters, now: float) -> None:
        queue, executions = reading
        samples = server.samples
        if samples and (queue < samples[-1][1] or executions < samples[-1][2]):
            samples.clear()  # counters went back: a restart
        samples.append((now, queue, executions))
        while len(samples) > 2 and samples[1][0] <= now - self.window_s:
            samples.popleft()
        first = samples[0]
        if now - first[0] <= 0:
            return
        executed = executions - first[2]
        # no execution in the window: nothing waits (a drained server's queue has emptied)
        server.saturation_ms = (queue - first[1]) / executed / 1e3 if executed > 0 else 0.0
        beyond = (
            server.saturation_ms <= self.low_ms
            if server.drained
            else server.saturation_ms >= self.high_ms
        )
        if not beyond:
            server.since = None
            return
        if server.since is None:
            server.since = now
        if now - server.since >= self.sustain_s:
            server.drained, server.since = not server.drained, None
            self.decisions += 1
            if server.drained:
                _log.warning(
                    "fleet: %s drained: queue %.0f ms per execution over %.0f s "
                    "(drains at %.0f ms, back at %.0f ms)",
                    name,
                    server.saturation_ms,
                    self.window_s,
                    self.high_ms,
                    self.low_ms,
                )
            else:
                _log.info(
                    "fleet: %s back in rotation: queue %.0f ms per execution",
                    name,
                    server.saturation_ms,
                )
