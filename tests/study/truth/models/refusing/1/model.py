"""See tests/study/truth/behaviour.py."""

from tests.study.truth.behaviour import TritonPythonModel

__all__ = ["TritonPythonModel"]
