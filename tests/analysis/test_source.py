"""otelkit.analysis._source: the seam breakdown and report read spans through (the stores'
own readers are tested in test_clickhouse.py, test_jaeger.py and test_tempo.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from otelkit.analysis import load_spans
from otelkit.analysis._source import Selection, import_store, is_store, open_source, parse_time
from otelkit.analysis._store import StoreError
from otelkit.cli import main
from tests.analysis.test_store import DEMO


def test_times_are_unix_seconds_ago_or_iso() -> None:
    assert parse_time("1700000000.5") == 1700000000.5
    assert parse_time("90s", now_s=1000.0) == 910.0
    assert parse_time("15m", now_s=1000.0) == 100.0
    assert parse_time("1d", now_s=100_000.0) == 13_600.0
    assert parse_time("2026-11-29T10:00:00Z") == 1795946400.0
    assert parse_time("2026-11-29T11:00:00+01:00") == 1795946400.0
    with pytest.raises(ValueError, match="'yesterday': not a time"):
        parse_time("yesterday")


def test_local_files_are_read_whole(tmp_path: Path) -> None:
    source = open_source([DEMO])
    assert source.files == [DEMO] and not source.segments_only and not source.imported
    assert [s.span_id for s in source.spans()] == [s.span_id for s in load_spans(DEMO)]
    with pytest.raises(ValueError, match="local files are read whole"):
        open_source([DEMO], Selection(services=("gnn",)))
    with pytest.raises(FileNotFoundError):
        open_source([tmp_path / "missing"])


def test_a_store_is_known_by_its_scheme(tmp_path: Path) -> None:
    assert is_store("jaeger://host:16685") and is_store("tempo+https://tempo")
    assert is_store("chdb:///tmp/x") and not is_store("traces.jsonl")
    assert not is_store(Path("jaeger://host"))  # a path is a path
    with pytest.raises(StoreError, match="zipkin: not a trace store"):
        import_store("zipkin://host:9411", tmp_path)
    with pytest.raises(StoreError, match="an empty time window"):
        import_store("tempo://127.0.0.1:9", tmp_path, Selection(20, 10))


def test_the_commands_refuse_a_window_over_local_files(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["breakdown", str(DEMO), "--since", "2h"]) == 2
    assert "local files are read whole" in capsys.readouterr().err
    assert main(["breakdown", str(DEMO), "--since", "soon"]) == 2
    assert "'soon': not a time" in capsys.readouterr().err
    assert main(["breakdown"]) == 2
    assert "give trace paths, --source, or both" in capsys.readouterr().err
