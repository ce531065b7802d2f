"""Testing code instrumented with otelkit: capture its spans, wait for them, compare trees.

In this process (``MemoryCapture``) or from other processes through an embedded receiver
(``ReceiverCapture``), spans come as ``otelkit.analysis.Span`` records. For pytest, load the
fixtures in your ``conftest.py``: ``pytest_plugins = ["otelkit.testing.pytest_plugin"]``
(docs/testing.md). ``import otelkit`` does not import this package.

>>> import otelkit
>>> with MemoryCapture(service_name="shop") as capture:
...     with otelkit.stage("request"), otelkit.stage("scale"):
...         pass
...     tree(capture.wait_for_spans(count=2))
[(0, 'request', 'INTERNAL'), (1, 'scale', 'INTERNAL')]
"""

from __future__ import annotations

from otelkit.testing._capture import Capture, MemoryCapture, ReceiverCapture
from otelkit.testing._trees import components, tree
from otelkit.testing._wait import answers, wait_until

__all__ = [
    "Capture",
    "MemoryCapture",
    "ReceiverCapture",
    "answers",
    "components",
    "tree",
    "wait_until",
]
