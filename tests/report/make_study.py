"""Writes tests/report/data/study.jsonl, the study results the report tests read: a real study
of the staged test model on a Triton that otelkit launches (about a minute on 2 cores).

    PYTHONPATH=$PWD:$PWD/examples .venv/bin/python -m tests.report.make_study
"""

from __future__ import annotations

from otelkit.study import Load, Study, Tracing, Triton
from tests.paths import MODELS, TESTS

OUT = TESTS / "report" / "data" / "study.jsonl"


def main() -> None:
    results = Study(
        model="staged_fp32",
        server=Triton(MODELS),
        load=Load(seconds=1.5, warmup_s=0.3),
        sweep={"instances": [1, 2], "batch_size": [1, 8], "concurrency": [1, 2, 4]},
        tracing=Tracing(per_second=20),
        out=OUT,
        progress=False,
    ).run()
    print(results.summary())


if __name__ == "__main__":
    main()
