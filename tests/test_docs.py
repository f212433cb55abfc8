"""The user guide and the API reference (docs/, mkdocs.yml): the site builds in strict
mode, every ```python block of docs/**/*.md runs, and the pages that must cover a list
(the errors, the CLI's commands, the checkpoint format version) cover it.

Code blocks follow the README's convention (tests/test_demo_and_cli.py): a ```python
block runs, a ```py block (or ```python with more on its opening line) is shown but not
run. Where the README marks a block that needs Spark ```python spark, a page writes
```{ .python .spark } (SuperFences renders no other word after the language): such a
block runs too, with the test process's SparkSession (the session-scoped ``spark``
fixture of tests/conftest.py; ``weir.spark.session()`` in the block gets it back). The
blocks of one page run in order in one namespace, in a temporary working directory of
their own; each block is one test, marked ``spark`` if it or an earlier block of its
page needs Spark.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MKDOCS = Path(sys.executable).parent / "mkdocs"
BLOCK = re.compile(r"^```(python|\{ \.python \.spark \})\n(.*?)^```[ \t]*$", re.S | re.M)
# The modules the API reference documents (docs/reference/*.md), by page.
REFERENCE = {"weir": "weir", "weir.spark": "spark", "weir.stream": "stream",
             "weir.connectors": "connectors", "weir.testing": "testing",
             "weir.errors": "errors"}


@dataclass(frozen=True)
class Block:
    """A code block that runs: where it starts on its page, its code, and whether it
    needs Spark (```{ .python .spark })."""

    line: int
    code: str
    spark: bool


def python_blocks(page: Path) -> list[Block]:
    """Every ```python and ```{ .python .spark } block of ``page``, in order."""
    text = page.read_text()
    return [Block(text.count("\n", 0, m.start()) + 2, m.group(2), m.group(1) != "python")
            for m in BLOCK.finditer(text)]


def _params(page: Path) -> list[Any]:
    """One test per block; those that need Spark (the block or an earlier one of the
    page, which the test may have to run first) are marked ``spark``."""
    out: list[Any] = []
    spark = False
    for index, block in enumerate(python_blocks(page)):
        spark = spark or block.spark
        out.append(pytest.param(page, index, id=f"{page.relative_to(DOCS)}:{block.line}",
                                marks=[pytest.mark.spark] if spark else []))
    return out


PAGES = sorted(p for p in DOCS.rglob("*.md") if "_ext" not in p.parts)
BLOCKS = [param for page in PAGES for param in _params(page)]


@dataclass
class PageRun:
    """The blocks of one page run so far, in this test process: a test of block n runs
    blocks 0..n-1 first if they have not run here (pytest-xdist may hand a page's
    blocks to different processes)."""

    workdir: Path
    namespace: dict[str, Any] = field(default_factory=lambda: {"__name__": "__docs__"})
    done: int = 0
    failed: int | None = None


_RUNS: dict[Path, PageRun] = {}


@pytest.mark.parametrize(("page", "index"), BLOCKS)
def test_doc_code_block_runs(
    page: Path, index: int, tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
) -> None:
    run = _RUNS.get(page)
    if run is None:
        slug = re.sub(r"\W+", "-", str(page.relative_to(DOCS)))
        run = _RUNS[page] = PageRun(tmp_path_factory.mktemp(f"docs-{slug}"))
    blocks = python_blocks(page)
    if any(b.spark for b in blocks[run.done:index + 1]):
        # the one SparkSession of this process, started before the block asks for one
        request.getfixturevalue("spark")
    monkeypatch.chdir(run.workdir)
    while run.done <= index:
        if run.failed is not None:
            line = blocks[run.failed].line
            pytest.fail(f"an earlier block of {page.name} (line {line}) failed")
        block = blocks[run.done]
        try:
            # padded so that a traceback's line numbers are the page's
            exec(compile("\n" * (block.line - 1) + block.code, str(page), "exec",
                         dont_inherit=True),  # (not this module's __future__ flags)
                 run.namespace)
        except BaseException:
            run.failed = run.done
            raise
        run.done += 1


def test_no_page_writes_a_fence_header_the_site_cannot_render() -> None:
    """SuperFences takes a word after the language (```python spark) for an option it
    does not know and renders the block as a paragraph, its code as markdown: a page
    marks a Spark block ```{ .python .spark } instead."""
    wrong = [f"{page.relative_to(DOCS)}:{text.count(chr(10), 0, m.start()) + 1}"
             for page in PAGES for text in [page.read_text()]
             for m in re.finditer(r"^```(?:python|py) +[a-z]+\s*$", text, re.M)]
    assert not wrong, f"write ```{{ .python .spark }} (or ```py), not ```python spark: {wrong}"


def test_docs_build_in_strict_mode(tmp_path: Path) -> None:
    """``mkdocs build --strict`` succeeds (no broken link, anchor or cross-reference;
    docs/_ext/rst_roles.py makes the docstrings' reST roles cross-references), and the
    reference has an entry for every name in each documented module's ``__all__``."""
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for module, page in REFERENCE.items():
        html = (site / "reference" / page / "index.html").read_text()
        missing = [n for n in _all_of(module) if f'id="{module}.{n}"' not in html]
        assert not missing, f"reference/{page}.md lacks {missing} of {module}.__all__"


def _ext(name: str) -> Any:
    """A module of docs/_ext (the mkdocs hook, the Griffe extension)."""
    spec = importlib.util.spec_from_file_location(f"weir_docs_{name}",
                                                  DOCS / "_ext" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _all_of(module: str) -> list[str]:
    """``module.__all__`` as the reference's hook reads it (docs/_ext/hooks.py: from
    the source, so weir.spark needs no JVM here)."""
    return list(_ext("hooks").public_names(module, ROOT / "src"))


def test_reference_pages_document_each_module_by_its_all() -> None:
    """One page per documented module, each listing the module's ``__all__``; the
    cross-reference extension links to the same modules."""
    pages = {p.stem for p in (DOCS / "reference").glob("*.md")}
    assert pages == set(REFERENCE.values())
    for module, page in REFERENCE.items():
        text = (DOCS / "reference" / f"{page}.md").read_text()
        assert f"::: {module}\n" in text and "members: __all__" in text, page
    assert set(_ext("rst_roles").DOCUMENTED) == set(REFERENCE)


def _error_names() -> set[str]:
    """Every WeirError subclass of weir (walking the hierarchy from ``WeirError``, with
    weir and its public modules imported), and every error ``weir.errors`` exports."""
    import weir
    import weir.connectors
    import weir.errors
    import weir.spark
    import weir.stream
    import weir.testing

    found: set[str] = set()
    todo: list[type] = [weir.errors.WeirError]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("weir") and cls.__name__ not in found:
            found.add(cls.__name__)
            todo.extend(cls.__subclasses__())
    assert weir.WeirError is weir.errors.WeirError
    return found | {n for n in weir.errors.__all__ if n.endswith("Error")}


def test_troubleshooting_covers_every_error_class() -> None:
    """Every WeirError subclass has a section in docs/troubleshooting.md (a heading
    naming it), and every section names an error that exists."""
    text = (DOCS / "troubleshooting.md").read_text()
    headings = re.findall(r"^#{2,4} .*?`?(\w+Error)`?\s*$", text, re.M)
    names = _error_names()
    assert {"WeirError", "KeyGroupError", "CorruptCheckpointError"} <= names
    missing = sorted(names - set(headings))
    assert not missing, f"docs/troubleshooting.md has no section for {missing}"
    stale = sorted(set(headings) - names)
    assert not stale, f"docs/troubleshooting.md has sections for unknown errors {stale}"


def _cli_commands() -> list[str]:
    import click
    import typer.main

    from weir.cli import app

    root = typer.main.get_command(app)
    out: list[str] = []

    def walk(command: Any, path: list[str], ctx: click.Context) -> None:
        if hasattr(command, "list_commands"):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                walk(sub, [*path, name], click.Context(sub, parent=ctx))
        else:
            out.append(" ".join(path))

    walk(root, ["weir"], click.Context(root))
    return out


def test_operations_page_shows_every_cli_command() -> None:
    """docs/operations.md has a section and a ```console example for every command
    and subcommand of ``weir``."""
    text = (DOCS / "operations.md").read_text()
    headings = set(re.findall(r"^#{2,4} `([^`]+)`\s*$", text, re.M))
    examples = "\n".join(re.findall(r"^```console\n(.*?)^```", text, re.S | re.M))
    commands = _cli_commands()
    assert commands
    missing = [c for c in commands if c not in headings]
    assert not missing, f"docs/operations.md has no section for {missing}"
    unshown = [c for c in commands if not re.search(rf"^\$ {re.escape(c)}\b", examples, re.M)]
    assert not unshown, f"docs/operations.md has no example of {unshown}"


def test_checkpoint_format_page_states_the_current_format_version() -> None:
    source = (ROOT / "src" / "weir" / "checkpoint" / "datafiles.py").read_text()
    version = next(
        ast.literal_eval(node.value) for node in ast.parse(source).body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "FORMAT_VERSION" for t in node.targets))
    text = (DOCS / "checkpoint-format.md").read_text()
    assert f"format version {version}" in text
    stated = {int(v) for v in re.findall(r"format version (\d+)", text)}
    assert max(stated) == version, f"checkpoint-format.md names format versions {stated}"
