"""Record encode and decode compiled once per schema and class (issue 41): the fast
path of :class:`~weir.api.record_serializer.RecordSerializer`, giving the same bytes
and the same errors as :func:`weir.api.records.value_codec`, which stays the general
path and the source of every error message."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import msgpack

from weir.api.records import (
    _PRIMITIVES,
    _annotation_class,
    _fields,
    _is_namedtuple,
    _is_pydantic,
    _item_class,
    _name,
    is_record_type,
    value_codec,
)

__all__ = ["Check", "compiled_codec"]

# ------------------------------------------------------------- compiled encode / decode
#
# ``value_codec`` composes one closure per field (and per list element), each called
# with a path string, and builds records through their constructor: general, and the
# source of every error message, but several times slower than msgpack packing a dict
# of the same fields. ``compiled_codec`` writes Python source specialised for one schema
# and class, compiled once: the fields read into locals, one ``type(x) is T`` test per
# primitive field (the msgpack form of a primitive is the value itself: no conversion),
# nested records, lists and maps of them through their own compiled functions, and the
# bytes packed by a packer made once (a field holding lists or maps of lists or maps
# through ``value_codec``'s closure). Anything the fast test does not accept (a wrong
# type, an int for a float field, a subclass, a missing field) goes to
# ``value_codec``'s encode of the whole record, which converts it or raises the same
# TypeError, naming the field, as before: the same bytes, the same errors.
#
# Decoding builds a record without running its constructor where that is the same
# thing: a dataclass whose ``__init__`` is the one ``dataclasses`` generated, with no
# ``__post_init__``, no ``init=False`` field and no ``__new__`` of its own, gets
# ``cls.__new__(cls)`` and its fields set as the generated ``__init__`` sets them
# (``object.__setattr__`` for a frozen one, plain attribute stores otherwise, slots or
# not); a NamedTuple without a ``__new__`` or ``__init__`` of its own is made by
# ``tuple.__new__``. Every other class is called (keyword arguments; positional for a
# NamedTuple), pydantic models through ``model_construct`` (no validation, as before):
# a ``__post_init__`` or a hand-written ``__init__`` may derive fields the schema does
# not store, so it runs. Either way the decoded record equals the one encoded.


class _Slow(Exception):
    """Raised by compiled code for a value its fast test does not accept."""


#: the kinds whose msgpack form is the value itself, and their one Python type
_SAME_KINDS: dict[str, type] = {kind: t for t, kind in _PRIMITIVES.items()}


def _build_kind(cls: Any) -> str:
    """How compiled decoding makes a ``cls`` (see above): ``"attrs"`` (``__new__`` and
    attribute stores), ``"frozen"`` (``__new__`` and ``object.__setattr__``),
    ``"tuple"`` (``tuple.__new__``), ``"construct"`` (pydantic ``model_construct``),
    ``"call"`` (the constructor, keywords), ``"call_args"`` (positional) or ``"dict"``
    (no class)."""
    if cls is None or not is_record_type(cls):
        return "dict"
    if _is_pydantic(cls):
        return "construct"
    if _is_namedtuple(cls):
        base = next(c for c in cls.__mro__ if "_fields" in c.__dict__)
        plain = cls.__new__ is base.__new__ and cls.__init__ is tuple.__init__
        return "tuple" if plain else "call_args"
    params: Any = getattr(cls, "__dataclass_params__", None)
    init = getattr(cls.__init__, "__code__", None)
    generated = (params is not None and params.init and init is not None
                 and init.co_filename == "<string>")  # (dataclasses exec()s its methods)
    if (not generated or hasattr(cls, "__post_init__") or cls.__new__ is not object.__new__
            or not all(f.init for f in dataclasses.fields(cls))):
        return "call"
    return "frozen" if params.frozen else "attrs"


class _Compiler:
    """Writes the source of one schema's compiled functions (``compiled_codec``)."""

    def __init__(self) -> None:
        self.ns: dict[str, Any] = {"_Slow": _Slow, "_set": object.__setattr__,
                                   "_new": object.__new__, "_tuple_new": tuple.__new__}
        self.lines: list[str] = []
        self.count = 0

    def name(self, value: Any, prefix: str) -> str:
        """A new global of the generated module holding ``value``."""
        self.count += 1
        name = f"_{prefix}{self.count}"
        self.ns[name] = value
        return name

    # encoding ---------------------------------------------------------------------

    def field_encode(self, doc: dict[str, Any], cls: Any, x: str) -> tuple[str, str]:
        """(fast test, msgpack form) of local ``x`` of type ``doc``: the test is an
        expression ("" for none); the form may raise (``_Slow`` or another error)."""
        kind, nullable = doc["t"], bool(doc.get("null"))
        if kind == "any":
            return "", x
        if kind in _SAME_KINDS:
            test = f"type({x}) is {kind}"
            return (f"({x} is None or {test})" if nullable else test), x
        if kind == "record":
            form = f"{self.record_form(doc, _annotation_class(cls))}({x})"
            return "", (f"(None if {x} is None else {form})" if nullable else form)
        container = "list" if kind == "list" else "dict"
        item, item_cls = doc["of"], _item_class(cls)
        items = f"{x}.values()" if kind == "map" else x
        if item["t"] == "any" or item["t"] in _SAME_KINDS:
            test = f"type({x}) is {container}"
            if item["t"] != "any":
                allowed = {_SAME_KINDS[item["t"]]} | (
                    {type(None)} if item.get("null") else set())
                test += f" and (not {x} or set(map(type, {items})) <= {self.name(allowed, 'T')})"
            form = x
        elif item["t"] == "record":
            fn = self.record_form(item, _annotation_class(item_cls))
            one = f"None if e is None else {fn}(e)" if item.get("null") else f"{fn}(e)"
            test = f"type({x}) is {container}"
            form = (f"[{one} for e in {x}]" if kind == "list"
                    else f"{{k: {one} for k, e in {x}.items()}}")
        else:  # (lists and maps of lists and maps: the general closure)
            fn = self.name(value_codec(doc, cls)[0], "enc")
            return "", f"{fn}({x}, '')"
        if nullable:
            return f"({x} is None or {test})", f"(None if {x} is None else {form})"
        return test, form

    def read_fields(self, doc: dict[str, Any], cls: Any, indent: str) -> list[str]:
        """Lines reading the fields of record ``v`` into locals ``f0``, ``f1``, ..."""
        names = [f["name"] for f in doc["fields"]]
        kind = _build_kind(cls)
        if kind in ("tuple", "call_args"):
            targets = "".join(f"f{i}, " for i in range(len(names)))
            return [f"{indent}[{targets}] = v"]
        if kind == "dict":
            return [f"{indent}f{i} = v[{n!r}]" for i, n in enumerate(names)]
        return [f"{indent}f{i} = v.{n}" if n.isidentifier() else
                f"{indent}f{i} = getattr(v, {n!r})" for i, n in enumerate(names)]

    def record_body(self, doc: dict[str, Any], cls: Any, indent: str) -> tuple[
            list[str], str, list[str]]:
        """(lines reading the fields, their fast test, their msgpack forms)."""
        hints = _hints(cls)
        tests, forms = [], []
        for i, field in enumerate(doc["fields"]):
            annotation = _annotation_class(hints.get(field["name"]))
            test, form = self.field_encode(field["type"], annotation, f"f{i}")
            if test:
                tests.append(test)
            forms.append(form)
        return self.read_fields(doc, cls, indent), " and ".join(tests) or "True", forms

    def type_test(self, cls: Any) -> str:
        return "type(v) is dict" if _build_kind(cls) == "dict" else (
            f"type(v) is {self.name(cls, 'C')}")

    def record_form(self, doc: dict[str, Any], cls: Any) -> str:
        """A function ``form(v)``: the msgpack form of a nested record (``_Slow`` if
        the fast test fails)."""
        fn = self.name(None, "form")
        read, test, forms = self.record_body(doc, cls, "    ")
        self.lines += [f"def {fn}(v):", f"    if not ({self.type_test(cls)}):",
                       "        raise _Slow", *read, f"    if not ({test}):",
                       "        raise _Slow", f"    return [{', '.join(forms)}]", ""]
        return fn

    def encoder(self, doc: dict[str, Any], cls: Any, slow: Callable[[Any], Any],
                pack: str | None) -> str:
        """``encode(v)``: record ``v``'s msgpack form packed by the global ``pack`` (the
        fast way if its test passes, else ``slow(v)``); without ``pack``, ``check(v)``:
        None if the fast test passes (nested records, lists and maps of them tested
        too), else ``slow(v)``."""
        fn, slow_name = self.name(None, "encode"), self.name(slow, "slow")
        read, test, forms = self.record_body(doc, cls, "            ")
        if pack is not None:
            done = [f"                return {pack}([{', '.join(forms)}])"]
        else:  # (only the forms that test something: nested records)
            done = [f"                {form}" for i, form in enumerate(forms)
                    if form != f"f{i}"] + ["                return"]
        self.lines += [f"def {fn}(v):", "    try:", f"        if {self.type_test(cls)}:",
                       *read, f"            if {test}:", *done,
                       "    except Exception:", "        pass", f"    return {slow_name}(v)",
                       ""]
        return fn

    # decoding ---------------------------------------------------------------------

    def field_decode(self, doc: dict[str, Any], cls: Any, x: str) -> str:
        """The Python value of local ``x``, the msgpack form of type ``doc``."""
        kind, nullable = doc["t"], bool(doc.get("null"))
        if kind == "record":
            value = f"{self.record_decoder(doc, _annotation_class(cls))}({x})"
        elif kind in ("list", "map") and doc["of"]["t"] == "record":
            item = doc["of"]
            fn = self.record_decoder(item, _annotation_class(_item_class(cls)))
            one = f"None if e is None else {fn}(e)" if item.get("null") else f"{fn}(e)"
            value = (f"[{one} for e in {x}]" if kind == "list"
                     else f"{{k: {one} for k, e in {x}.items()}}")
        elif kind in ("list", "map") and doc["of"]["t"] in ("list", "map"):
            value = f"{self.name(value_codec(doc, cls)[1], 'dec')}({x})"
            return value  # (the general closure handles None itself)
        else:
            return x
        return f"(None if {x} is None else {value})" if nullable else value

    def build(self, doc: dict[str, Any], cls: Any, indent: str) -> list[str]:
        """Lines returning the record of the Python values in locals f0, f1, ..."""
        hints = _hints(cls)
        names = [f["name"] for f in doc["fields"]]
        values = [self.field_decode(f["type"], _annotation_class(hints.get(f["name"])),
                                    f"f{i}") for i, f in enumerate(doc["fields"])]
        kind = _build_kind(cls)
        if kind == "dict":
            items = ", ".join(f"{n!r}: {x}" for n, x in zip(names, values, strict=True))
            return [f"{indent}return {{{items}}}"]
        c = self.name(cls, "C")
        args = "".join(f"{x}, " for x in values)
        kwargs = ", ".join(f"{n}={x}" for n, x in zip(names, values, strict=True))
        if kind == "tuple":
            return [f"{indent}return _tuple_new({c}, ({args}))"]
        if kind == "call_args":
            return [f"{indent}return {c}({args})"]
        if kind == "construct":
            return [f"{indent}return {c}.model_construct({kwargs})"]
        if kind == "call":
            return [f"{indent}return {c}({kwargs})"]
        stores = [f"{indent}o.{n} = {x}" if kind == "attrs" else
                  f"{indent}_set(o, {n!r}, {x})" for n, x in zip(names, values, strict=True)]
        return [f"{indent}o = _new({c})", *stores, f"{indent}return o"]

    def record_decoder(self, doc: dict[str, Any], cls: Any, unpack: str = "") -> str:
        """A function ``decode(v)`` of a record's msgpack form (``unpack``: of bytes,
        through the global of that name)."""
        fn = self.name(None, "decode")
        targets = "".join(f"f{i}, " for i in range(len(doc["fields"])))
        source = f"{unpack}(v, raw=False, strict_map_key=False)" if unpack else "v"
        self.lines += [f"def {fn}(v):", f"    [{targets}] = {source}",
                       *self.build(doc, cls, "    "), ""]
        return fn

    def compile(self) -> dict[str, Any]:
        source = "\n".join(self.lines)
        exec(compile(source, "<weir record codec>", "exec"), self.ns)  # names repr()-quoted
        self.ns["__source__"] = source
        return self.ns


def _hints(cls: Any) -> dict[str, Any]:
    return {n: a for n, a, _ in _fields(cls)} if cls is not None and is_record_type(
        cls) else {}


Check = Callable[[Any], None]


def compiled_codec(doc: dict[str, Any], cls: Any = None) -> tuple[
        Callable[[Any], bytes], Callable[[bytes], Any], Check]:
    """(encode, decode, check) of records of record schema ``doc`` as bytes, compiled
    for it (see above): ``encode(value)`` is ``msgpack.packb(value_codec(doc,
    cls)[0](value, ""))`` — the same bytes, the same TypeError naming the field —
    ``decode(data)`` builds ``cls`` records (None: dicts) as ``value_codec``'s decode
    does, and ``check(value)`` raises what ``encode`` would for a field of the wrong
    type, without packing (neither the range of ints nor what ``any`` fields hold is
    checked: only packing does)."""
    if doc["t"] != "record":
        raise TypeError(f"compiled_codec needs a record schema, got {_name(doc)}")
    slow_encode = value_codec(doc, cls)[0]
    packb = msgpack.packb

    def slow_bytes(value: Any) -> bytes:
        return packb(slow_encode(value, ""), use_bin_type=True)  # type: ignore[no-any-return]

    def slow_check(value: Any) -> None:
        slow_encode(value, "")

    c = _Compiler()
    c.ns["_pack"] = msgpack.Packer(use_bin_type=True).pack
    c.ns["_unpackb"] = msgpack.unpackb
    encode = c.encoder(doc, cls, slow_bytes, "_pack")
    check = c.encoder(doc, cls, slow_check, None)
    decode = c.record_decoder(doc, cls, "_unpackb")
    ns = c.compile()
    return ns[encode], ns[decode], ns[check]
