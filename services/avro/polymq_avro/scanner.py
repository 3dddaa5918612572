"""Where each record of a block ends, found without fastavro's per-record cost (sans-IO).

Splitting a container into records with fastavro's ``schemaless_reader`` costs about two
microseconds a record, most of it the call itself and the reads it makes on a file object.
:func:`scanner` compiles a schema (fastavro's parsed form, without logical types) into a
Python function that walks a block's bytes and returns where each record ends, checking on
the way what fastavro checks when it decodes: that every length, count and index is in range
and every string is UTF-8.

The scanner is a fast path, never the judge. It is *stricter* than fastavro (a varint longer
than its type allows, a boolean byte other than 0 or 1, a negative union or enum index, a
count larger than the block...) and anything it does not take raises; the caller then splits
that block with fastavro as before. So the records taken, their bounds and the errors given
for bad ones are fastavro's, while a valid block costs a fraction of it.

The generated source names nothing from the schema: names are looked up while compiling, and
only generated identifiers and integers go into the code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Scan", "scanner"]

Scan = Callable[[bytes, int], list[int]]
"""``scan(block, count)``: the end offset of each of ``count`` records; raises if the block
is not one the scanner vouches for (the caller then asks fastavro)."""

_MAX_LINES = 20_000  # a schema whose scanner would be longer is left to fastavro


class Unscannable(Exception):
    """The schema has a part the scanner does not know: use fastavro."""


class _Reject(Exception):
    """Bytes the scanner does not vouch for (fastavro decides)."""


def _varint(d: bytes, p: int) -> tuple[int, int]:
    """The zig-zag long whose first byte is at ``d[p]``, and where it ends."""
    v = shift = 0
    for _ in range(10):
        b = d[p]
        p += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            if v >> 64:
                raise _Reject
            return (v >> 1) ^ -(v & 1), p
        shift += 7
    raise _Reject


_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


class _Compiler:
    def __init__(self, named: dict[str, Any]) -> None:
        self.named = named
        self.funcs: dict[str, str] = {}  # record name -> its function's identifier
        self.bodies: list[list[str]] = []
        self.counter = 0
        self.size = 0

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def out(self, lines: list[str], indent: int, text: str) -> None:
        self.size += 1
        if self.size > _MAX_LINES:
            raise Unscannable("the schema is too large to scan")
        lines.append("    " * indent + text)

    # ---- pieces ------------------------------------------------------------------------
    def skip_varint(self, lines: list[str], i: int, max_bytes: int, last_max: int) -> None:
        """Skip an int (5 bytes at most, the last <= 15) or a long (10, the last <= 1)."""
        self.out(lines, i, "b = d[p]")
        self.out(lines, i, "p += 1")
        self.out(lines, i, "if b > 127:")
        self.out(lines, i + 1, "s = p - 1")
        self.out(lines, i + 1, "while d[p] > 127:")
        self.out(lines, i + 2, "p += 1")
        self.out(lines, i + 1, "p += 1")
        self.out(
            lines,
            i + 1,
            f"if p - s >= {max_bytes} and (p - s > {max_bytes} or d[p - 1] > {last_max}):",
        )
        self.out(lines, i + 2, "raise _Reject")

    def read_long(self, lines: list[str], i: int, var: str) -> None:
        self.out(lines, i, "b = d[p]")
        self.out(lines, i, "if b > 127:")
        self.out(lines, i + 1, f"{var}, p = _varint(d, p)")
        self.out(lines, i, "else:")
        self.out(lines, i + 1, "p += 1")
        self.out(lines, i + 1, f"{var} = (b >> 1) ^ -(b & 1)")

    def skip_bytes(self, lines: list[str], i: int, utf8: bool) -> None:
        self.read_long(lines, i, "v")
        self.out(lines, i, "e = p + v")
        self.out(lines, i, "if v < 0 or e > n:")
        self.out(lines, i + 1, "raise _Reject")
        if utf8:
            self.out(lines, i, "d[p:e].decode()")
        self.out(lines, i, "p = e")

    # ---- types -------------------------------------------------------------------------
    def emit(self, schema: Any, lines: list[str], i: int) -> None:
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                self.primitive(schema, lines, i)
                return
            named = self.named.get(schema)
            if named is None:
                raise Unscannable(f"unknown type {schema[:80]!r}")
            self.emit(named, lines, i)
            return
        if isinstance(schema, list):
            self.union(schema, lines, i)
            return
        if not isinstance(schema, dict):
            raise Unscannable("a type is a name, an object or a list")
        kind = schema.get("type")
        if isinstance(kind, str) and kind in _PRIMITIVES:
            self.primitive(kind, lines, i)
        elif kind in ("record", "error"):
            self.out(lines, i, f"p = {self.record(schema)}(d, p, n)")
        elif kind == "enum":
            symbols = schema.get("symbols")
            if not isinstance(symbols, list):
                raise Unscannable("an enum without symbols")
            self.read_long(lines, i, "v")
            self.out(lines, i, f"if not 0 <= v < {len(symbols)}:")
            self.out(lines, i + 1, "raise _Reject")
        elif kind == "fixed":
            size = schema.get("size")
            if type(size) is not int or size < 0:
                raise Unscannable("a fixed without a size")
            self.out(lines, i, f"p += {size}")
        elif kind in ("array", "map"):
            self.container(schema, kind, lines, i)
        else:
            self.emit(kind, lines, i)  # {"type": <a type>}, e.g. a named type or a union

    def primitive(self, kind: str, lines: list[str], i: int) -> None:
        if kind == "null":
            return
        if kind == "boolean":
            self.out(lines, i, "if d[p] > 1:")
            self.out(lines, i + 1, "raise _Reject")
            self.out(lines, i, "p += 1")
        elif kind == "int":
            self.skip_varint(lines, i, 5, 15)
        elif kind == "long":
            self.skip_varint(lines, i, 10, 1)
        elif kind == "float":
            self.out(lines, i, "p += 4")
        elif kind == "double":
            self.out(lines, i, "p += 8")
        else:
            self.skip_bytes(lines, i, utf8=kind == "string")

    def union(self, branches: list[Any], lines: list[str], i: int) -> None:
        self.read_long(lines, i, "v")
        for k, branch in enumerate(branches):
            self.out(lines, i, f"{'if' if k == 0 else 'elif'} v == {k}:")
            self.out(lines, i + 1, "pass")
            self.emit(branch, lines, i + 1)
        self.out(lines, i, "else:" if branches else "if True:")
        self.out(lines, i + 1, "raise _Reject")

    def container(self, schema: dict[str, Any], kind: str, lines: list[str], i: int) -> None:
        item = schema.get("items" if kind == "array" else "values")
        if item is None:
            raise Unscannable(f"an {kind} without its item type")
        c = self.fresh("c")
        self.read_long(lines, i, c)
        self.out(lines, i, f"while {c}:")
        self.out(lines, i + 1, f"if {c} < 0:")
        self.out(lines, i + 2, f"{c} = -{c}")
        self.skip_varint(lines, i + 2, 10, 1)  # the block's size in bytes
        self.out(lines, i + 1, f"if {c} > n:")  # more items than bytes: fastavro decides
        self.out(lines, i + 2, "raise _Reject")
        self.out(lines, i + 1, f"for _ in range({c}):")
        self.out(lines, i + 2, "pass")
        if kind == "map":
            self.skip_bytes(lines, i + 2, utf8=True)
        self.emit(item, lines, i + 2)
        self.read_long(lines, i + 1, c)

    def record(self, schema: dict[str, Any]) -> str:
        """The identifier of the function that skips this record (compiled once a name)."""
        name = schema.get("name")
        if isinstance(name, str) and name in self.funcs:
            return self.funcs[name]
        fields = schema.get("fields")
        if not isinstance(fields, list):
            raise Unscannable("a record without fields")
        func = self.fresh("_r")
        if isinstance(name, str):
            self.funcs[name] = func  # before the fields: a record may contain itself
        lines: list[str] = []
        self.bodies.append(lines)
        self.out(lines, 0, f"def {func}(d, p, n):")
        for f in fields:
            if not isinstance(f, dict) or "type" not in f:
                raise Unscannable("a field without a type")
            self.emit(f["type"], lines, 1)
        self.out(lines, 1, "return p")
        return func


def _compile(plain: Any) -> Scan:
    named = plain.get("__named_schemas", {}) if isinstance(plain, dict) else {}
    comp = _Compiler(named if isinstance(named, dict) else {})
    lines: list[str] = []
    comp.out(lines, 0, "def scan(d, count):")
    comp.out(lines, 1, "n = len(d)")
    comp.out(lines, 1, "p = 0")
    comp.out(lines, 1, "ends = []")
    comp.out(lines, 1, "end = ends.append")
    comp.out(lines, 1, "for _ in range(count):")
    if isinstance(plain, dict) and plain.get("type") in ("record", "error"):
        fields = plain.get("fields")  # the top record's fields inline (no call)
        if not isinstance(fields, list):
            raise Unscannable("a record without fields")
        name = plain.get("name")
        if isinstance(name, str):
            comp.record(plain)  # for records that contain the top one
        for f in fields:
            if not isinstance(f, dict) or "type" not in f:
                raise Unscannable("a field without a type")
            comp.emit(f["type"], lines, 2)
    else:
        comp.emit(plain, lines, 2)
    comp.out(lines, 2, "end(p)")
    comp.out(lines, 1, "if p > n:")
    comp.out(lines, 2, "raise _Reject")
    comp.out(lines, 1, "return ends")
    source = "\n".join(line for body in [*comp.bodies, lines] for line in body) + "\n"
    namespace: dict[str, Any] = {"_Reject": _Reject, "_varint": _varint}
    exec(compile(source, "<polymq_avro.scanner>", "exec"), namespace)  # only generated names
    scan: Scan = namespace["scan"]
    return scan


_BY_FORM: dict[str, Scan | None] = {}  # by canonical form; the oldest is dropped first


def scanner(canonical: str, plain: Any) -> Scan | None:
    """The scanner of the schema whose Parsing Canonical Form is ``canonical`` (which fixes
    the binary encoding) and whose fastavro form without logical types is ``plain``; None
    for a schema it cannot compile (fastavro splits those)."""
    try:
        return _BY_FORM[canonical]
    except KeyError:
        pass
    try:
        scan: Scan | None = _compile(plain)
    except (Unscannable, RecursionError):
        scan = None
    if len(_BY_FORM) >= 256:
        _BY_FORM.pop(next(iter(_BY_FORM)))
    _BY_FORM[canonical] = scan
    return scan
