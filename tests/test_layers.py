"""The package's architecture, declared once and checked on every import in ``otelkit/``.

Each top-level module or subpackage of ``otelkit`` is a unit; units sit in layers, lowest
first. A module may import from its own layer or a lower one, never a higher one; no two
modules import each other, directly or through others; and a name private to one unit (a name
beginning with ``_``) is not imported by another. Modules whose names begin with ``_`` are
private to otelkit, not to their unit: users import from the packages (whose public names
tests/test_exported_members.py fixes), other units may import their public names.
Imports under ``if TYPE_CHECKING:`` are for annotations only and do not count.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "otelkit"

#: The layer order, lowest first.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_errors", "semconv"),  # names and exceptions: import nothing of otelkit's
    ("_config", "_resource"),  # settings and who emits
    ("_core", "_propagation"),  # what every signal shares: spans, hot series, worker, context
    ("export",),  # what takes telemetry out: encoders, exporters, batch processor, Prometheus
    ("gpu",),  # NVML and torch sampling, CUDA-timed spans
    ("telemetry",),  # configure(): providers and pipelines built from the settings
    ("client", "server"),  # instrumentation of tritonclient; stages and model servers
    ("analysis", "receiver", "tritonserver", "dashboards", "fleet"),  # tools: read or run things
    ("study",),  # sweeps a deployment: drives clients, runs servers, reads traces and metrics
    ("report",),  # one HTML page and paper figures from traces and study results
    ("testing",),  # users' tests of their instrumented code: capture, wait, compare trees
    ("_instrumentation", "auto", "cli", "__init__"),  # the public entry points
)
LAYER_OF = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports(module: str, source: str | None = None) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for each otelkit import in ``module``."""
    tree = ast.parse(MODULES[module].read_text() if source is None else source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found: list[tuple[str, str | None, int]] = []
    for node in ast.walk(tree):
        if _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            found += [
                (a.name, None, node.lineno) for a in node.names if a.name.startswith("otelkit")
            ]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "otelkit":
                continue
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if submodule in MODULES:
                    found.append((submodule, None, node.lineno))
                else:
                    found.append((node.module, alias.name, node.lineno))
    return found


def test_every_unit_has_a_layer() -> None:
    units = {unit_of(m) for m in MODULES}
    assert units - set(LAYER_OF) == set(), "declare the new unit in LAYERS"
    assert set(LAYER_OF) - units == set(), "a declared unit no longer exists"


def layering_problems(module: str, source: str | None = None) -> list[str]:
    unit = unit_of(module)
    problems = []
    for target, name, line in imports(module, source):
        target_unit = unit_of(target)
        where = f"{module}:{line} imports {target}{'.' + name if name else ''}"
        if LAYER_OF[target_unit] > LAYER_OF[unit]:
            problems.append(f"{where}: upward ({unit} is below {target_unit})")
        if target_unit != unit and name is not None and name.startswith("_"):
            problems.append(f"{where}: a name private to {target_unit}")
    return problems


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_downward_and_keep_private_names_private(module: str) -> None:
    assert layering_problems(module) == []


def find_cycles(graph: dict[str, set[str]]) -> list[str]:
    cycles = []
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_no_import_cycles() -> None:
    graph = {m: {t for t, _, _ in imports(m) if t in MODULES and t != m} for m in MODULES}
    assert find_cycles(graph) == []
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a -> b -> c -> a"]


def test_the_checks_catch_what_they_forbid() -> None:
    """The rules above, on source written to break each: the checks are not vacuous."""
    source = (
        "from otelkit.telemetry import configure\n"  # upward from _core
        "from otelkit.client._call import Call\n"  # another unit's module: its public names
        "def later():\n"
        "    from otelkit.export._processor import _delivered\n"  # another unit's private name
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from otelkit.cli import main\n"  # annotations only: allowed
    )
    assert layering_problems("otelkit._core.spans", source) == [
        "otelkit._core.spans:1 imports otelkit.telemetry.configure: upward (_core is below "
        "telemetry)",
        "otelkit._core.spans:2 imports otelkit.client._call.Call: upward (_core is below client)",
        "otelkit._core.spans:4 imports otelkit.export._processor._delivered: upward (_core is "
        "below export)",
        "otelkit._core.spans:4 imports otelkit.export._processor._delivered: a name private to "
        "export",
    ]
