"""A Griffe extension for the API reference (mkdocs.yml loads it): weir's docstrings
are reST, so their Sphinx roles become mkdocstrings cross-references.

A role is resolved as Python would resolve its name in the docstring's scope (the
object, its class, its module; a dotted name from its first part), then:

* a documented object (a public name of a module the reference documents, or a member
  of one) becomes a cross-reference to its page: ``:class:`~weir.errors.KeyGroupError```
  is ``[`KeyGroupError`][weir.errors.KeyGroupError]``;
* an object of weir that the reference does not document (an internal module or
  class), a builtin or another library's object becomes ``code`` — as Sphinx renders
  a role it has no target for;
* a name that resolves nowhere (a typo, a renamed object) stays a cross-reference,
  which ``mkdocs build --strict`` reports as unresolved: the build fails.

A paragraph ending in ``::`` (reST's literal block) ends in ``:``, and a
``.. code-block::`` line or a bare ``::`` goes; the indented block after them is a
Markdown code block already. Doctest paragraphs (``>>>``) become fenced code.
"""

from __future__ import annotations

import builtins
import importlib.util
import re
import sys
from collections.abc import Iterator
from typing import Any

from griffe import Alias, Extension, Module, Object

ROLE = re.compile(r":(?:py:)?(class|meth|func|attr|data|mod|obj|exc|const):`([^`]+)`")
TITLED = re.compile(r"^(.*?)\s*<([^>]+)>$")
LITERAL_INTRO = re.compile(r"(?<=\S)::$", re.M)
CODE_DIRECTIVE = re.compile(r"^[ \t]*\.\. code(?:-block)?::.*\n", re.M)
BARE_LITERAL_INTRO = re.compile(r"^[ \t]*::[ \t]*$", re.M)
PARAGRAPHS = re.compile(r"(\n[ \t]*\n)")
# What the reference documents, in the order a link prefers (a name exported by
# several modules links to the first; its defining module, if documented, first).
DOCUMENTED = ["weir", "weir.testing", "weir.stream", "weir.spark", "weir.connectors",
              "weir.errors"]


def _fence_doctests(text: str) -> str:
    """Paragraphs of doctest (``>>>``) as fenced ``pycon`` code: in Markdown, ``>``
    would start a block quote."""
    parts = PARAGRAPHS.split(text)
    for i, part in enumerate(parts):
        stripped = part.lstrip("\n")
        if stripped.lstrip().startswith(">>>"):
            indent = stripped[: len(stripped) - len(stripped.lstrip())]
            parts[i] = f"{indent}```pycon\n{stripped}\n{indent}```"
    return "".join(parts)


def _target(obj: Object | Alias) -> Object | None:
    try:
        return obj.final_target if isinstance(obj, Alias) else obj
    except Exception:  # an alias to another library
        return None


def _children(obj: Object) -> Iterator[tuple[str, Object | Alias]]:
    members = obj.all_members if obj.is_class else obj.members
    for name, member in members.items():
        if not name.startswith("_"):
            yield name, member


class RstRoles(Extension):
    """Rewrites the docstring of every object of the package as it is loaded."""

    def __init__(self, documented: list[str] | None = None) -> None:
        super().__init__()
        self.documented = documented or DOCUMENTED
        self.public: dict[str, str] = {}  # canonical path -> the path its page uses
        self.inherited: set[str] = set()  # those mapped to a class inheriting them

    def on_package(self, *, pkg: Module, **kwargs: Any) -> None:
        if pkg.name != "weir":
            return
        self.public.clear()
        self.inherited.clear()
        for path in self.documented:
            module = pkg.modules_collection.get_member(path)
            self._document(module, path)
            for name in [str(n) for n in module.exports or ()]:
                if name in module.all_members:
                    self._document(module.all_members[name], f"{path}.{name}")
        for obj in self._walk(pkg, set()):
            if obj.docstring is not None:
                text = ROLE.sub(lambda m, o=obj: self._link(m, o), obj.docstring.value)
                text = LITERAL_INTRO.sub(":", CODE_DIRECTIVE.sub("", text))
                text = _fence_doctests(BARE_LITERAL_INTRO.sub("", text))
                obj.docstring.value = text

    def _document(self, obj: Object | Alias, path: str, *, inherited: bool = False) -> None:
        """``obj`` is on the page as ``path``, and so are its members if a class (a
        member links to the class that defines it rather than one inheriting it)."""
        target = _target(obj)
        if target is None:
            return
        if target.path == path or target.path not in self.public or (
                not inherited and target.path in self.inherited):
            self.public[target.path] = path
            self.inherited.discard(target.path)
            if inherited:
                self.inherited.add(target.path)
        if target.is_class:
            for name, member in _children(target):
                self._document(member, f"{path}.{name}", inherited=name not in target.members)

    def _walk(self, obj: Object, seen: set[str]) -> Iterator[Object]:
        if obj.path in seen:
            return
        seen.add(obj.path)
        yield obj
        for member in obj.members.values():
            if not member.is_alias:
                yield from self._walk(member, seen)  # type: ignore[arg-type]

    def _resolve(self, name: str, scope: Object) -> Object | None:
        """The object ``name`` means in ``scope``, or None."""
        collection = scope.modules_collection
        first, _, rest = name.partition(".")
        found: Object | Alias | None = None
        node: Object | None = scope
        while node is not None and found is None:
            members = node.all_members if node.is_class else node.members
            if first in members:
                found = members[first]
            elif node.name == first and not node.is_module:
                found = node
            node = node.parent
        if found is None:
            try:
                found = collection.get_member(first)
            except Exception:
                return None
        obj = _target(found)
        for part in rest.split(".") if rest else ():
            if obj is None:
                return None
            members = obj.all_members if obj.is_class else obj.members
            obj = _target(members[part]) if part in members else None
        return obj

    def _link(self, match: re.Match[str], scope: Object) -> str:
        text = match.group(2).strip()
        titled = TITLED.match(text)
        if titled:
            title, name = titled.group(1), titled.group(2)
        elif text.startswith("~"):
            name = text[1:]
            title = name.lstrip(".").rsplit(".", 1)[-1]
        else:
            name = title = text
        name = name.lstrip("!.").removesuffix("()")
        obj = self._resolve(name, scope)
        if obj is not None:
            public = self.public.get(obj.path)
            return f"[`{title}`][{public}]" if public else f"`{title}`"
        first = name.partition(".")[0]
        if first != "weir" and (hasattr(builtins, first) or first in sys.stdlib_module_names
                                or importlib.util.find_spec(first) is not None):
            return f"`{title}`"  # a builtin or another library: no inventory offline
        return f"[`{title}`][{name}]"  # resolves nowhere: strict mode reports it
