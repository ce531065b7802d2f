"""The user documentation (README.md, CHANGELOG.md, docs/*.md) stays short, linked and runnable.

- README.md has at most 200 lines and opens with a fenced block holding `make demo` and
  `make test`;
- every relative link resolves to a file or folder of the repository, and an anchor to a
  heading of the page it names;
- every python, bash or sh code block runs here, or says on the line just before its fence why
  it cannot. Two HTML comments steer this, and nothing else does:

      <!-- not run: REASON -->    not run; REASON is required (needs a GPU node, a service at a
                                  named host, is `make demo` itself, runs until stopped, ...)
      <!-- run with: triton -->   run against the session's real Triton (the `triton` fixture
                                  of tests/conftest.py, serving tests/models): `gpu-node:8001`
                                  becomes its gRPC address and `gpu-node:8000` its HTTP one

  A block with neither comment is run, so a block that cannot run here and does not say so
  fails the test. A page's blocks run in order, in one temporary directory, as a reader
  following the page would: python blocks with this interpreter, bash and sh blocks with
  `bash -e -o pipefail`, each with a timeout. PYTHONPATH holds the repository and examples/;
  PATH starts with this interpreter's directory (for `python`, `otelkit`,
  `opentelemetry-instrument`); the directory links the repository's tests/, examples/,
  benchmarks/ and collector/, so commands written for the repository root find them, while
  what they write stays in the temporary directory (they must not write into those links). No
  OTEL_* or OTELKIT_* variable of the test process leaks in, but OTELKIT_RAISE_INTERNAL_ERRORS
  (otelkit's own failures raise). Fences of other languages (yaml, text, promql, none) are not
  run and need no comment.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from otelkit._config import OPTIONS
from tests.paths import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted(p for p in [README, ROOT / "CHANGELOG.md", *DOCS.glob("*.md")] if p.is_file())
README_MAX_LINES = 200
README_FIRST_SCREENS_LINES = 80  # where `make demo` and `make test` must have come

RUNNABLE = frozenset({"python", "py", "bash", "sh", "shell"})
LINKED_DIRS = ("tests", "examples", "benchmarks", "collector")  # a page's blocks read, never write
TIMEOUT_S = 240  # one block; the longest starts a Triton of its own
# What `<!-- run with: NAME -->` replaces, from the named fixture.
SUBSTITUTIONS = {
    "triton": lambda server: {"gpu-node:8001": server.grpc_url, "gpu-node:8000": server.http_url},
}

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>not run|run with)\s*:?(?P<value>.*?)-->\s*$")
_HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*#*\s*$")
_INLINE_LINK = re.compile(r"!?\[[^\]]*\]\((?P<target><[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\)")
_REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(?P<target>\S+)", re.MULTILINE)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


@dataclass(frozen=True)
class Block:
    """A fenced code block of a Markdown page and the comment just before its fence."""

    page: Path
    line: int  # of the opening fence, from 1
    language: str
    code: str
    marker: str | None  # "not run" or "run with"
    value: str  # the reason, or the fixture's name

    @property
    def where(self) -> str:
        return f"{_name(self.page)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.language in RUNNABLE and self.marker != "not run"


def code_blocks(page: Path, text: str | None = None) -> list[Block]:
    """The fenced code blocks of ``page`` (or of ``text``, read as that page)."""
    lines = (page.read_text(encoding="utf-8") if text is None else text).splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence = opening["fence"]
        end = index + 1
        while end < len(lines) and not _closes(lines[end], fence):
            end += 1
        marker = _MARKER.match(lines[index - 1]) if index else None
        blocks.append(
            Block(
                page,
                index + 1,
                opening["info"].lower(),
                textwrap.dedent("\n".join(lines[index + 1 : end])) + "\n",
                marker["kind"] if marker else None,
                marker["value"].strip() if marker else "",
            )
        )
        index = end + 1
    return blocks


def _closes(line: str, fence: str) -> bool:
    stripped = line.strip()
    return len(stripped) >= len(fence) and set(stripped) == {fence[0]}


def marker_problems(block: Block) -> list[str]:
    """What is wrong with how ``block`` says whether and how it runs."""
    if block.language not in RUNNABLE:
        return (
            [
                f"{block.where}: a {block.marker!r} comment on a {block.language or 'plain'} "
                "block, which is never run"
            ]
            if block.marker
            else []
        )
    if block.marker == "not run" and not block.value:
        return [f"{block.where}: `<!-- not run: REASON -->` needs its reason"]
    if block.marker == "run with":
        if block.value not in SUBSTITUTIONS:
            return [f"{block.where}: run with {block.value!r}: not one of {sorted(SUBSTITUTIONS)}"]
        if "gpu-node:" not in block.code:
            return [f"{block.where}: run with {block.value}, but the block names no gpu-node:PORT"]
    return []


def run_blocks(
    blocks: list[Block], directory: Path, fixtures: Mapping[str, object] | None = None
) -> list[str]:
    """Run the runnable ``blocks`` in order in ``directory``; one message per failed block."""
    for name in LINKED_DIRS:
        link = directory / name
        if not link.exists():
            link.symlink_to(ROOT / name, target_is_directory=True)
    failures = []
    for block in blocks:
        if not block.runs:
            continue
        code = block.code
        if block.marker == "run with":
            addresses = SUBSTITUTIONS[block.value]((fixtures or {})[block.value])
            for address, replacement in addresses.items():
                code = code.replace(address, replacement)
        if block.language in ("python", "py"):
            command, stdin = [sys.executable, "-"], code
        else:
            command, stdin = ["bash", "-e", "-o", "pipefail", "-c", code], None
        try:
            done = subprocess.run(
                command,
                input=stdin,
                cwd=directory,
                env=block_environment(),
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as expired:
            failures.append(f"{block.where}: still running after {TIMEOUT_S} s: {expired.output}")
            continue
        if done.returncode != 0:
            failures.append(
                f"{block.where} ({block.language}) exited with {done.returncode}:\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
    return failures


def _name(page: Path) -> str:
    """``page`` as the repository names it (docs/README.md is not README.md)."""
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


def block_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELKIT_"))}
    env["OTELKIT_RAISE_INTERNAL_ERRORS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "examples")])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def link_problems(page: Path, text: str | None = None) -> list[str]:
    """Relative links of ``page`` that name no file, or an anchor that names no heading."""
    source = page.read_text(encoding="utf-8") if text is None else text
    prose = _without_code(source)
    targets = [m["target"].strip("<>") for m in _INLINE_LINK.finditer(prose)]
    targets += [m["target"] for m in _REFERENCE_LINK.finditer(prose)]
    problems = []
    for target in targets:
        if _SCHEME.match(target):
            continue  # http(s), mailto: not checked here (no network)
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            problems.append(f"{_name(page)}: link to {target}: no such file")
        elif anchor and linked.suffix == ".md":
            headings = anchors(linked, source if linked == page else None)
            if anchor not in headings:
                problems.append(
                    f"{_name(page)}: link to {target}: no heading #{anchor} in {linked.name}"
                )
    return problems


def anchors(page: Path, text: str | None = None) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown page."""
    found: set[str] = set()
    source = page.read_text(encoding="utf-8") if text is None else text
    for line in _without_code(source).splitlines():
        heading = _HEADING.match(line)
        if heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading["title"].lower()).replace(" ", "-")
        unique, count = slug, 1
        while unique in found:
            unique, count = f"{slug}-{count}", count + 1
        found.add(unique)
    return found


def _without_code(text: str) -> str:
    """``text`` with fenced blocks and inline code blanked (links there are not links)."""
    lines, inside = [], None
    for line in text.splitlines():
        fence = _FENCE.match(line)
        if inside is None and fence:
            inside = fence["fence"]
            lines.append("")
        elif inside is not None:
            if _closes(line, inside):
                inside = None
            lines.append("")
        else:
            lines.append(re.sub(r"`[^`]*`", "``", line))
    return "\n".join(lines)


def _all_blocks() -> Iterator[Block]:
    for page in PAGES:
        yield from code_blocks(page)


# -- the documentation ------------------------------------------------------------------------


def test_the_pages_exist() -> None:
    expected = {
        "README.md",
        "configuration.md",
        "client.md",
        "server.md",
        "gpu.md",
        "deployment.md",
        "analysis.md",
        "propagation.md",
        "known-issues.md",
        "performance.md",
    }
    assert expected <= {p.name for p in DOCS.glob("*.md")}
    assert (ROOT / "CHANGELOG.md").is_file()


def test_readme_is_one_page_that_leads_a_newcomer() -> None:
    """Install, a first trace, a study and a report, then `make demo` and `make test`, in that
    order and on the first screens (tests/docs/test_first_trace.py runs the first trace)."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES, (
        f"README.md has {len(text.splitlines())} lines"
    )
    steps = [
        r"^pip install -e '\.\[",
        r"^otelkit receive .*&",
        r"^otelkit breakdown ",
        r"^otelkit study run ",
        r"^otelkit report ",
        r"^make demo\b",
        r"^make test\b",
    ]
    blocks = [b for b in code_blocks(README) if b.language == "bash"]
    found = [
        next((i for i, b in enumerate(blocks) if re.search(s, b.code, re.M)), None) for s in steps
    ]
    assert None not in found and found == sorted(found), list(zip(steps, found, strict=True))
    assert blocks[found[-1]].line <= README_FIRST_SCREENS_LINES, blocks[found[-1]].line
    assert "make check" in text
    assert "foundation release" not in text.lower()


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_relative_links_resolve(page: Path) -> None:
    assert link_problems(page) == []


def test_the_index_links_every_page() -> None:
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    pages = [p.name for p in DOCS.glob("*.md") if p.name != "README.md"]
    assert [name for name in pages if f"]({name}" not in index] == []


def test_every_option_is_in_the_configuration_page() -> None:
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    missing = [o.name for o in OPTIONS if f"`{o.name}`" not in page]
    missing += [v for o in OPTIONS for v in o.env_vars[1:] if v not in page]
    assert missing == []


def test_every_code_block_runs_or_says_why_not() -> None:
    blocks = list(_all_blocks())
    assert [p for b in blocks for p in marker_problems(b)] == []
    assert sum(b.runs for b in blocks) >= 15  # the finder still finds them


def _pages_to_run() -> list[object]:
    params = []
    for page in PAGES:
        blocks = [b for b in code_blocks(page) if b.runs]
        if blocks:
            triton = any(b.marker == "run with" for b in blocks)
            params.append(
                pytest.param(page, id=_name(page), marks=[pytest.mark.triton] if triton else [])
            )
    return params


@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", _pages_to_run())
def test_code_blocks_run(page: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    blocks = code_blocks(page)
    needed = {b.value for b in blocks if b.runs and b.marker == "run with"}
    fixtures = {name: request.getfixturevalue(name) for name in sorted(needed)}
    failures = run_blocks(blocks, tmp_path, fixtures)
    assert not failures, "\n\n".join(failures)


# -- the checks themselves, on a synthetic page ----------------------------------------------

SYNTHETIC = """# A page

See [the other page](other.md#a-heading), [nowhere](missing.md), [a bad anchor](#no-such),
[this heading](#a-page) and `[not a link](in-code.md)`.

```python
print("fine")
```

<!-- not run: needs a GPU node -->
```bash
nvidia-smi
```

<!-- not run -->
```sh
echo "a reason is missing"
```

```yaml
not: run
```

<!-- run with: triton -->
```bash
test gpu-node:8001 = 127.0.0.1:1  # replaced by the fixture's address
```

```python
raise SystemExit("a broken block")
```
"""


def test_the_checks_catch_broken_pages(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(SYNTHETIC)
    (tmp_path / "other.md").write_text("## A heading\n")
    blocks = code_blocks(page)
    assert [(b.language, b.marker, b.runs) for b in blocks] == [
        ("python", None, True),
        ("bash", "not run", False),
        ("sh", "not run", False),
        ("yaml", None, False),
        ("bash", "run with", True),
        ("python", None, True),
    ]
    assert [p for b in blocks for p in marker_problems(b)] == [
        "page.md:16: `<!-- not run: REASON -->` needs its reason"
    ]
    assert link_problems(page) == [
        "page.md: link to missing.md: no such file",
        "page.md: link to #no-such: no heading #no-such in page.md",
    ]

    class Server:
        grpc_url, http_url = "127.0.0.1:1", "127.0.0.1:2"

    failures = run_blocks(blocks, tmp_path, {"triton": Server()})
    assert [f.split(" ")[0] for f in failures] == ["page.md:29"]
    assert "a broken block" in failures[0]
    # An unmarked block that cannot run here fails too, rather than passing unseen.
    unmarked = code_blocks(page, "```bash\nnvidia-smi-is-not-here\n```\n")
    assert run_blocks(unmarked, tmp_path) != []
    assert marker_problems(code_blocks(page, "<!-- run with: gpu -->\n```bash\ntrue\n```\n")[0])
