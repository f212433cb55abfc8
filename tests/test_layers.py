"""The layers of ARCHITECTURE.md are enforced: a module never imports a higher layer.

Order (each may import only the ones before it): ``weir.errors`` → ``weir.api`` →
``weir.state`` → ``weir.checkpoint`` → ``weir.runtime`` → ``weir.connectors`` →
``weir.spark`` / ``weir.testing`` / ``weir.processor`` / ``weir.cli`` / ``weir.examples`` /
``weir``.
Imports made only for type checking count too: they are dependencies of the design.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "weir"
LAYERS = ["errors", "api", "state", "checkpoint", "runtime", "connectors"]
TOP = len(LAYERS)  # weir.spark, weir.testing, weir.cli, weir.examples, weir/__init__


def _layer(module: str) -> int:
    parts = module.split(".")
    if parts[0] != "weir" or len(parts) == 1:
        return TOP
    return LAYERS.index(parts[1]) if parts[1] in LAYERS else TOP


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name.split(".")[0] == "weir"]


MODULES = sorted(SRC.rglob("*.py"))


def test_every_package_has_a_layer() -> None:
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and not p.name.startswith("_")}
    assert packages <= set(LAYERS) | {"testing", "examples", "processor", "cli"}, packages


@pytest.mark.parametrize("path", MODULES, ids=lambda p: _module_name(p))
def test_no_module_imports_a_higher_layer(path: Path) -> None:
    own = _layer(_module_name(path))
    upward = [f"line {line}: {name}" for line, name in _imports(path) if _layer(name) > own]
    assert not upward, f"{_module_name(path)} (layer {own}) imports a higher layer: {upward}"


INDEPENDENT = ("weir.runtime.spark", "weir.runtime.continuous")


@pytest.mark.parametrize("path", [p for p in MODULES if _module_name(p).startswith(INDEPENDENT)],
                         ids=lambda p: _module_name(p))
def test_the_two_runtimes_never_import_each_other(path: Path) -> None:
    """What both runtimes need lives below them (weir.checkpoint, weir.runtime's shared
    modules), never in the other runtime: one protocol, two policies."""
    own = next(r for r in INDEPENDENT if _module_name(path).startswith(r))
    other = next(r for r in INDEPENDENT if r != own)
    crossing = [f"line {line}: {name}" for line, name in _imports(path)
                if name == other or name.startswith(other + ".")]
    assert not crossing, f"{_module_name(path)} imports the other runtime: {crossing}"


CLIENTS = ("weir.processor", "weir.cli")
PUBLIC_OR_SHARED = ("weir.runtime.endpoints",)


@pytest.mark.parametrize("path", [p for p in MODULES if _module_name(p).startswith(CLIENTS)],
                         ids=lambda p: _module_name(p))
def test_the_state_processor_and_the_cli_use_no_runtime_internals(path: Path) -> None:
    """The offline state processor reads checkpoints through ``weir.checkpoint`` (the
    micro-batch runtime's layout included: ``weir.checkpoint.epochs``); the command line
    reaches a running job through a public client (``weir.stream``, ``weir.spark``).
    Neither imports a runtime's modules."""
    inside = [f"line {line}: {name}" for line, name in _imports(path)
              if name.startswith("weir.runtime") and name not in PUBLIC_OR_SHARED]
    assert not inside, f"{_module_name(path)} imports runtime internals: {inside}"
