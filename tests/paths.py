"""Where the tests find the repository's files, whichever folder a test lives in."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository
TESTS = ROOT / "tests"
MODELS = TESTS / "models"  # Triton model repository of the test models
FIXTURES = TESTS / "fixtures"
GPU_FIXTURES = FIXTURES / "gpu"
EXAMPLES = ROOT / "examples"
BENCHMARKS = ROOT / "benchmarks"
