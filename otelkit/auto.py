"""``opentelemetry-instrument python script.py``: otelkit for a script that never imports it.

``opentelemetry-instrument`` (from ``opentelemetry-instrumentation``) runs a ``sitecustomize``
before the script that loads one distro (entry point group ``opentelemetry_distro``, picked by
``OTEL_PYTHON_DISTRO`` when several are installed) and configures it, then at most one
configurator (``opentelemetry_configurator``), then every instrumentor
(``opentelemetry_instrumentor``). otelkit registers ``OtelkitDistro`` and
``TritonClientInstrumentor`` there and no configurator: the distro builds otelkit's pipeline
itself, from the same ``OTEL_*`` / ``OTELKIT_*`` variables as ``otelkit.configure()``.

Start-up failures are logged on stderr and the script runs untraced: an observability tool
never stops the job it observes.

>>> # shell: OTEL_SERVICE_NAME=tracker opentelemetry-instrument python track.py
>>> TritonClientInstrumentor().instrument()  # the same, by hand, once an SDK is set up
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection
from typing import Any

from otelkit import telemetry
from otelkit._errors import ConfigError, MissingExtraError

# distro.py and instrumentor.py start with a file-wide ``# type: ignore``, so mypy sees neither
# base class: the ignores below say so, and nothing else.
try:
    from opentelemetry.instrumentation.dependencies import get_dependency_conflicts
    from opentelemetry.instrumentation.distro import BaseDistro  # type: ignore[attr-defined]
    from opentelemetry.instrumentation.environment_variables import OTEL_PYTHON_CONFIGURATOR
    from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
        BaseInstrumentor,
    )
except ImportError as missing:  # only when imported by hand: the loader itself brings these
    raise MissingExtraError(
        "opentelemetry-instrumentation", "instrument", "opentelemetry-instrument"
    ) from missing

__all__ = ["OtelkitDistro", "TritonClientInstrumentor"]

logger = logging.getLogger("otelkit")

# The name of the configurator otelkit stands for. No entry point has it: otelkit's distro has
# configured the process, and a second SDK set-up (opentelemetry-distro's configurator, say)
# could only fail to install its providers; the loader instead says which one it skipped.
_CONFIGURATOR = "otelkit"


class OtelkitDistro(BaseDistro):  # type: ignore[misc]
    """Configures otelkit from the environment when ``opentelemetry-instrument`` starts.

    Chosen when it is the only distro installed, or with ``OTEL_PYTHON_DISTRO=otelkit``. An
    otelkit already configured in the process is kept. With no endpoint set, traces go to
    OTLP-JSON-lines files under ``./otelkit-traces``, as with ``otelkit.configure()``.

    >>> # shell: OTEL_PYTHON_DISTRO=otelkit opentelemetry-instrument python track.py
    """

    def _configure(self, **kwargs: Any) -> None:
        os.environ.setdefault(OTEL_PYTHON_CONFIGURATOR, _CONFIGURATOR)
        if telemetry.current() is not None:
            logger.debug("otelkit: already configured; opentelemetry-instrument keeps it")
            return
        try:
            telemetry.configure()
        except ConfigError as error:  # the user's mistake: say what to fix, no traceback
            logger.error("%s; the script runs untraced", error)
        except Exception:
            logger.exception("otelkit: configuration failed, the script runs untraced")


class TritonClientInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Traces every tritonclient HTTP and gRPC client, as ``otelkit.instrument()`` does.

    Spans go to otelkit's pipeline when otelkit is configured (``OtelkitDistro`` does that),
    else to the global tracer provider, such as another distro's. Without tritonclient, or
    with a version otelkit does not support, it does nothing.

    >>> TritonClientInstrumentor().instrument()
    >>> TritonClientInstrumentor().uninstrument()
    """

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("tritonclient >= 2.40",)

    def _instrument(self, **kwargs: Any) -> None:
        # opentelemetry-instrument skips the dependency check of instrument(): it checks an
        # ``instruments`` extra of the whole distribution, which would gate every integration
        # otelkit has on tritonclient. Check this one's own dependency here instead.
        conflict = get_dependency_conflicts(self.instrumentation_dependencies())
        if conflict is not None:
            log = logger.warning if conflict.found else logger.debug
            log("otelkit: tritonclient not instrumented: %s", conflict)
            return
        from otelkit import client

        try:
            modules = client.instrument_classes()
        except Exception:
            logger.exception("otelkit: instrumenting tritonclient failed; the script runs untraced")
            return
        logger.debug("otelkit: instrumented %s", ", ".join(modules) or "nothing")

    def _uninstrument(self, **kwargs: Any) -> None:
        from otelkit import client

        client.uninstrument_classes()
