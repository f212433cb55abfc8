"""Avro schemas for :class:`~weir.api.avro_serializer.AvroSerializer` (issue 41):
normalising a parsed schema into the document the checkpoint keeps, defaults in their
Python form, why a value does not fit (naming the field), and Avro's schema resolution
decided up front — :func:`check` says whether values written with one schema are read
with another as they are, after migrating, or not at all (:class:`Incompatible` naming
the field and the rule), where fastavro itself only fails when it reads a value."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from weir.api.records import Incompatible

__all__ = ["NAMED_KINDS", "Named", "check", "check_record", "deref", "describe", "kind_of",
           "normalised", "problem", "reason", "with_python_defaults"]

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes",
                         "string"})
#: the kinds of named types (matched by name or alias on resolution)
NAMED_KINDS = frozenset({"record", "error", "enum", "fixed"})
_NUMBERS = ("int", "long", "float", "double")
#: Avro's promotions: what a writer's type may be read as (int -> long: same bytes)
_PROMOTIONS = {"int": ("long", "float", "double"), "long": ("float", "double"),
               "float": ("double",), "string": ("bytes",), "bytes": ("string",)}
_INT_RANGE = {"int": 1 << 31, "long": 1 << 63}
#: what a typed record's (record/1) field type may become in Avro
_FROM_RECORD = {"int": ("int", "long", "float", "double"), "float": ("float", "double"),
                "bool": ("boolean",), "str": ("string", "enum"), "bytes": ("bytes", "fixed"),
                "list": ("array",), "map": ("map",), "record": ("record", "error")}
#: named types by full name, as fastavro's ``parse_schema`` collects them
Named = dict[str, Any]


def normalised(node: Any) -> Any:
    """A parsed schema as a plain JSON document (fastavro's own keys dropped,
    ``{"type": "int"}`` as ``"int"``; defaults as written)."""
    if isinstance(node, list):
        return [normalised(b) for b in node]
    if not isinstance(node, dict):
        return node
    out = {k: v if k == "default" else normalised(v) for k, v in node.items()
           if not k.startswith("__fastavro") and k != "__named_schemas"}
    if set(out) == {"type"} and out["type"] in _PRIMITIVES:
        return out["type"]
    return out


def kind_of(node: Any) -> str:
    """A schema node's kind: a primitive's or named type's name, "union", "array"..."""
    if isinstance(node, list):
        return "union"
    return node if isinstance(node, str) else str(node["type"])


def deref(node: Any, named: Named) -> Any:
    """The type a name refers to (among ``named``), or ``node`` itself."""
    return named.get(node, node) if isinstance(node, str) else node


def with_python_defaults(parsed: Any, named: Named) -> Any:
    """A parsed schema (and its ``named`` types) whose fields' defaults are in their
    Python form, changed in place (idempotent): fastavro reads and writes them as they
    are written in JSON (bytes as str)."""

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for branch in node:
                walk(branch)
        elif isinstance(node, dict):
            for field in node.get("fields", ()):
                walk(field["type"])
                if "default" in field:
                    field["default"] = _python_value(field["type"], field["default"], named)
            for inner in ("items", "values"):
                walk(node.get(inner))
    for node in (parsed, *named.values()):
        walk(node)
    return parsed


def _python_value(node: Any, value: Any, named: Named) -> Any:
    """A default, as Avro's JSON writes it, in its Python form."""
    node = deref(node, named)
    if isinstance(node, list):  # (a union's default is of its first branch, or null)
        branches = [b for b in node if b != "null"]
        return None if value is None or not branches else _python_value(
            node[0] if node[0] != "null" else branches[0], value, named)
    kind = kind_of(node)
    if kind in ("bytes", "fixed") and isinstance(value, str):
        return value.encode("latin-1")
    if kind in ("float", "double") and type(value) is int:
        return float(value)
    if kind == "array" and isinstance(value, list):
        return [_python_value(node["items"], x, named) for x in value]
    if kind == "map" and isinstance(value, dict):
        return {k: _python_value(node["values"], x, named) for k, x in value.items()}
    if kind in ("record", "error") and isinstance(value, dict):
        return {f["name"]: _python_value(f["type"], value.get(f["name"], f.get("default")),
                                         named) for f in node["fields"]}
    return value


def describe(node: Any, named: Named) -> str:
    node = deref(node, named)
    kind = kind_of(node)
    if kind == "union":
        return "union[" + ", ".join(describe(b, named) for b in node) + "]"
    if kind == "array":
        return f"array<{describe(node['items'], named)}>"
    if kind == "map":
        return f"map<{describe(node['values'], named)}>"
    if kind in NAMED_KINDS:
        return f"{kind} {node['name'].rsplit('.', 1)[-1]}"
    return kind


def reason(exc: Incompatible) -> str:
    """The refusal's reason: the field (or the value) and the rule."""
    return f"{f'field {exc.path!r}' if exc.path else 'the value'}: {exc.rule}"


# ------------------------------------------------------------------ value checks


_SHAPES: dict[str, tuple[type, ...]] = {
    "null": (type(None),), "boolean": (bool,), "int": (int,), "long": (int,),
    "float": (int, float), "double": (int, float), "string": (str,), "enum": (str,),
    "bytes": (bytes, bytearray), "fixed": (bytes, bytearray), "array": (list, tuple),
    "map": (Mapping,), "record": (Mapping,), "error": (Mapping,)}


def problem(node: Any, v: Any, path: str, named: Named) -> tuple[type[Exception], str] | None:
    """Why ``v`` does not fit ``node`` (the exception class and the message naming the
    field), or None if it does or the reason is not found here."""
    node = deref(node, named)
    kind, where = kind_of(node), f"field '{path}'" if path else "the value"
    got = f"got {type(v).__name__} {v!r:.60}"
    if kind == "union":
        if any(problem(b, v, path, named) is None for b in node):
            return None
        fitting = [b for b in node if _shape_fits(deref(b, named), v)]
        if len(fitting) == 1:
            return problem(fitting[0], v, path, named)
        return TypeError, f"{where}: expected {describe(node, named)}, {got}"
    if isinstance(node, dict) and "logicalType" in node:
        return None
    if not _shape_fits(node, v):
        return TypeError, f"{where}: expected {describe(node, named)}, {got}"
    if kind in _INT_RANGE and not -_INT_RANGE[kind] <= v < _INT_RANGE[kind]:
        return ValueError, f"{where}: {v} is out of range for an Avro {kind}"
    if kind == "enum" and v not in node["symbols"]:
        return ValueError, f"{where}: {v!r} is not a symbol of {describe(node, named)}"
    if kind == "fixed" and len(v) != node["size"]:
        return ValueError, f"{where}: expected {node['size']} bytes, got {len(v)}"
    if kind == "array":
        return next(filter(None, (problem(node["items"], x, f"{path}[{i}]", named)
                                  for i, x in enumerate(v))), None)
    if kind == "map":
        bad = [k for k in v if not isinstance(k, str)]
        if bad:
            return TypeError, f"{where}: an Avro map's keys are str, got {bad[0]!r:.60}"
        return next(filter(None, (problem(node["values"], x, f"{path}[{json.dumps(k)}]", named)
                                  for k, x in v.items())), None)
    if kind in ("record", "error"):
        names = {f["name"] for f in node["fields"]}
        extra = [k for k in v if k not in names]
        if extra:
            return TypeError, f"{where}: {extra[0]!r} is not a field of {describe(node, named)}"
        for f in node["fields"]:
            inner = f"{path}.{f['name']}" if path else f["name"]
            if f["name"] in v:
                found = problem(f["type"], v[f["name"]], inner, named)
                if found is not None:
                    return found
            elif "default" not in f:
                return TypeError, f"field '{inner}': missing, and it has no default"
    return None


def _shape_fits(node: Any, v: Any) -> bool:
    kind = kind_of(node)
    if kind not in _SHAPES or (type(v) is bool and kind != "boolean"):
        return kind not in _SHAPES  # (a reference not found, a logical type: not here)
    return isinstance(v, _SHAPES[kind])


# ------------------------------------------------------------- schema resolution


def check(w: Any, r: Any, wn: Named, rn: Named, path: str,
           seen: set[tuple[str, str]]) -> bool:
    """Whether values written with ``w`` can be read with ``r`` (Avro's resolution
    rules): True if their bytes are read as they are, False if they need migrating;
    :class:`Incompatible` naming the field and the rule if they cannot be read."""
    w, r = deref(w, wn), deref(r, rn)
    wk, rk = kind_of(w), kind_of(r)
    if wk == "union":
        branches = r if rk == "union" else [r]
        same = rk == "union" and len(w) <= len(r)
        for i, branch in enumerate(w):
            j = _first_match(branch, branches, wn, rn)
            if j is None:
                _check_single(branch, branches, wn, rn, path, seen)
                made = " (a nullable field made required)" if branch == "null" else ""
                raise Incompatible(path, f"{describe(branch, wn)}, a branch of the stored "
                                         f"union, cannot be read as {describe(r, rn)}{made}")
            same = check(branch, branches[j], wn, rn, path, seen) and same and i == j
        return same
    if rk == "union":
        j = _first_match(w, r, wn, rn)
        if j is None:
            _check_single(w, r, wn, rn, path, seen)
            raise Incompatible(path, f"{describe(w, wn)} cannot be read as "
                                     f"{describe(r, rn)} (no branch reads it)")
        check(w, r[j], wn, rn, path, seen)
        return False
    logical = [(n.get("logicalType"), n.get("precision"), n.get("scale"))
               if isinstance(n, dict) else (None, None, None) for n in (w, r)]
    if logical[0] != logical[1]:
        raise Incompatible(path, f"its logical type changed from {logical[0][0]} to "
                                 f"{logical[1][0]}")
    if wk in _PRIMITIVES and rk in _PRIMITIVES:
        if wk == rk:
            return True
        if rk in _PROMOTIONS.get(wk, ()):
            return (wk, rk) == ("int", "long")  # (the same zig-zag varint)
        if wk in _NUMBERS and rk in _NUMBERS:
            raise Incompatible(path, f"{wk} cannot be read as {rk} (a narrowed type)")
        raise Incompatible(path, f"its type changed from {wk} to {rk} (no Avro promotion "
                                 f"reads one as the other)")
    if wk != rk and {wk, rk} != {"record", "error"}:
        raise Incompatible(path, f"its type changed from {describe(w, wn)} to "
                                 f"{describe(r, rn)}")
    if wk == "array":
        return check(w["items"], r["items"], wn, rn, f"{path}[]", seen)
    if wk == "map":
        return check(w["values"], r["values"], wn, rn, f"{path}{{}}", seen)
    if not _names_match(w, r):
        raise Incompatible(path, f"{describe(w, wn)} cannot be read as {describe(r, rn)} "
                                 f"(named types match by name or by the reader's aliases)")
    if (w["name"], r["name"]) in seen:
        return True
    seen.add((w["name"], r["name"]))
    if wk == "fixed":
        if w["size"] != r["size"]:
            raise Incompatible(path, f"{describe(r, rn)}: its size changed from "
                                     f"{w['size']} to {r['size']}")
        return True
    if wk == "enum":
        removed = [s for s in w["symbols"] if s not in r["symbols"]]
        if removed and "default" not in r:
            raise Incompatible(path, f"symbol {removed[0]!r} of {describe(r, rn)} was "
                                     f"removed and the enum has no default")
        return bool(r["symbols"][:len(w["symbols"])] == w["symbols"])
    return _check_fields(w, r, wn, rn, path, seen)


def _check_single(w: Any, branches: list[Any], wn: Named, rn: Named, path: str,
                  seen: set[tuple[str, str]]) -> None:
    """The precise refusal of ``w`` by a union of one type and maybe null (``w`` null:
    none here)."""
    others = [b for b in branches if b != "null"]
    if w != "null" and len(others) == 1:
        check(w, others[0], wn, rn, path, seen)


def _check_fields(w: Any, r: Any, wn: Named, rn: Named, path: str,
                  seen: set[tuple[str, str]]) -> bool:
    old = {f["name"]: f for f in w["fields"]}
    same = len(w["fields"]) == len(r["fields"])
    for i, field in enumerate(r["fields"]):
        inner = f"{path}.{field['name']}" if path else field["name"]
        match = next((old[n] for n in (field["name"], *field.get("aliases", ()))
                      if n in old), None)
        if match is None:
            if "default" not in field:
                raise Incompatible(inner, "new and without a default (stored values have "
                                          "none)")
            same = False
            continue
        inner_same = check(match["type"], field["type"], wn, rn, inner, seen)
        same = same and inner_same and w["fields"][i] is match
    return same


def _names_match(w: dict[str, Any], r: dict[str, Any]) -> bool:
    """fastavro's rule (Avro's): the same unqualified name, or the writer's name (full
    or not) among the reader's aliases."""
    short = w["name"].rsplit(".", 1)[-1]
    aliases = r.get("aliases", ())
    return bool(short == r["name"].rsplit(".", 1)[-1] or w["name"] in aliases
                or short in aliases)


def _first_match(w: Any, branches: list[Any], wn: Named, rn: Named) -> int | None:
    """The reader branch fastavro reads ``w`` with: the first of a matching type."""
    for j, branch in enumerate(branches):
        if _matches(deref(w, wn), deref(branch, rn), wn, rn):
            return j
    return None


def _matches(w: Any, r: Any, wn: Named, rn: Named) -> bool:
    wk, rk = kind_of(w), kind_of(r)
    if wk in _PRIMITIVES or rk in _PRIMITIVES:
        return wk == rk or rk in _PROMOTIONS.get(wk, ())
    if wk == rk == "array":
        return _matches(deref(w["items"], wn), deref(r["items"], rn), wn, rn)
    if wk == rk == "map":
        return _matches(deref(w["values"], wn), deref(r["values"], rn), wn, rn)
    if wk in NAMED_KINDS and (wk == rk or {wk, rk} == {"record", "error"}):
        return _names_match(w, r) and (wk != "fixed" or w["size"] == r["size"])
    return False


def check_record(old: dict[str, Any], r: Any, rn: Named, path: str) -> None:
    """Whether a typed record's (``record/1``) values of type ``old`` can be Avro
    values of ``r`` (the values are checked again as they are written)."""
    r = deref(r, rn)
    branches = [deref(b, rn) for b in (r if isinstance(r, list) else [r])]
    if old.get("null") and "null" not in branches:
        raise Incompatible(path, f"a nullable {old['t']} cannot be read as "
                                 f"{describe(r, rn)} (stored values may be None)")
    if old["t"] == "any":
        return
    fitting = [b for b in branches if kind_of(b) in _FROM_RECORD[old["t"]]]
    if not fitting:
        raise Incompatible(path, f"a record's {old['t']} cannot be read as "
                                 f"{describe(r, rn)}")
    target = fitting[0]
    if old["t"] in ("list", "map"):
        check_record(old["of"], target["items" if old["t"] == "list" else "values"], rn,
                      f"{path}[]" if old["t"] == "list" else f"{path}{{}}")
    elif old["t"] == "record":
        fields = {f["name"]: f for f in old["fields"]}
        for field in target["fields"]:
            inner = f"{path}.{field['name']}" if path else field["name"]
            if field["name"] in fields:
                check_record(fields[field["name"]]["type"], field["type"], rn, inner)
            elif "default" not in field:
                raise Incompatible(inner, "new and without a default (stored values have "
                                          "none)")
