"""The ``stages`` parameter of a truth-table model's config.pbtxt: ``name=kind:ms`` joined by
``;`` (tests/study/truth/behaviour.py says what each kind does). Its own module, with no
imports, because both a model's stub process and the test process read it."""

from __future__ import annotations

KINDS = ("sleep", "spin", "lock", "rows")


def pool_size(kind: str) -> int | None:
    """k of a ``poolK`` stage (a pool of k, ``pool2``), None for any other kind."""
    if kind.startswith("pool") and kind[4:].isdigit() and int(kind[4:]) > 0:
        return int(kind[4:])
    return None


def parse(text: str) -> list[tuple[str, str, float]]:
    """``prep=sleep:2;match=lock:6`` as [(name, kind, seconds)]."""
    stages = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, _, rest = part.partition("=")
        kind, _, ms = rest.partition(":")
        if kind not in KINDS and pool_size(kind) is None:
            raise ValueError(f"stage {name}: no kind {kind!r}")
        stages.append((name, kind, float(ms) / 1e3))
    return stages
