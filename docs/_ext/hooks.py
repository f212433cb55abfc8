"""mkdocs hooks (mkdocs.yml loads this file): the API reference documents each module's
public names, read from its ``__all__``.

In a page, ``members: __all__`` under a ``::: module`` block becomes the list of the
names in that module's ``__all__``, in order — read from the source with ``ast``
(nothing is imported), so a name added to ``__all__`` is documented at the next
build and a name removed disappears.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[2] / "src"
_BLOCK = re.compile(r"^:::\s+([\w.]+)\s*$")
_MEMBERS = re.compile(r"^(\s*)members:\s*__all__\s*$")


def module_file(module: str, src: Path = SRC) -> Path:
    """The source file of ``module`` under ``src``."""
    base = src.joinpath(*module.split("."))
    package = base / "__init__.py"
    return package if package.exists() else base.with_suffix(".py")


def public_names(module: str, src: Path = SRC) -> list[str]:
    """The names in ``module``'s ``__all__`` (literal lists and ``+=`` of them)."""
    tree = ast.parse(module_file(module, src).read_text())
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            names = list(ast.literal_eval(node.value))
        elif (isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name)
              and node.target.id == "__all__"):
            names += list(ast.literal_eval(node.value))
    if not names:
        raise ValueError(f"{module} has no literal __all__ to document")
    return names


def expand(markdown: str, src: Path = SRC) -> str:
    """``markdown`` with every ``members: __all__`` replaced by the module's names."""
    out: list[str] = []
    module = None
    for line in markdown.splitlines():
        block = _BLOCK.match(line)
        if block:
            module = block.group(1)
        members = _MEMBERS.match(line)
        if members and module is not None:
            indent = members.group(1)
            out.append(f"{indent}members:")
            out.extend(f"{indent}  - {name}" for name in public_names(module, src))
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return expand(markdown)
