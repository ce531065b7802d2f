"""The one HTML file: styles, the Vega libraries, the data and the page's script, all inline.

Nothing on the page is fetched: the Vega, Vega-Lite and vega-embed libraries come from
vl-convert's bundle, written into a ``<script>`` element; the charts' data and the waterfall's
traces sit in one JSON block. The page opens the same from ``file://``, a mail attachment or an
air-gapped machine.

vl-convert builds its bundle in about 4 s; it depends only on vl-convert's version, so it is
built once per version and kept in the user's cache directory.

>>> html = render_page("t", ["<p>hi</p>"], {"charts": []}, bundle="/* vega */")
>>> "<p>hi</p>" in html and "https://" not in html
True
>>> json_for_script({"a": "</script>"})
'{"a":"\\\\u003c/script>"}'
"""

from __future__ import annotations

import html
import json
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from otelkit._core.extras import require

__all__ = ["json_for_script", "render_page", "script", "vega_bundle"]

_END = re.compile(r"</script|<!--", re.IGNORECASE)


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "otelkit"


def vega_bundle() -> str:
    """Vega, Vega-Lite and vega-embed as one script that sets ``window.vegaEmbed``."""
    vl_convert = require("vl_convert", extra="report", feature="otelkit report")
    path = _cache_dir() / f"vega-bundle-{vl_convert.__version__}.js"
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        pass
    bundle: str = vl_convert.javascript_bundle()
    try:  # written whole or not at all: two reports at once never read half a file
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as file:
            file.write(bundle)
        os.replace(file.name, path)
    except OSError:
        pass  # a read-only home: build it again next time
    return bundle


def json_for_script(data: Any) -> str:
    """``data`` as JSON that no HTML parser reads as markup: every ``<`` escaped (JSON allows
    ``\\u003c`` wherever it allows ``<``: inside strings)."""
    return json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def script(code: str) -> str:
    """A ``<script>`` element of ``code``; refuses code that would end the element early.

    Escaping ``</`` in arbitrary JavaScript would break its regular expressions (``/</g``), so
    the code is checked instead: the bundle and the page's script hold no such text.
    """
    if _END.search(code):
        raise ValueError("script code holds '</script' or '<!--': it cannot be inlined as is")
    return f"<script>{code}</script>"


def _asset(name: str) -> str:
    return resources.files("otelkit.report").joinpath(name).read_text(encoding="utf-8")


def render_page(
    title: str, sections: Sequence[str], data: Mapping[str, Any], bundle: str | None = None
) -> str:
    """The whole page: ``sections`` (HTML fragments) in order, ``data`` for the script."""
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            # no request may leave the page, whatever a library tries
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            "script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; "
            'img-src data:">',
            f"<title>{html.escape(title)}</title>",
            f"<style>{_asset('page.css')}</style>",
            "</head><body>",
            *sections,
            f'<script type="application/json" id="otelkit-data">{json_for_script(data)}</script>',
            script(vega_bundle() if bundle is None else bundle),
            script(_asset("page.js")),
            "</body></html>",
        ]
    )
