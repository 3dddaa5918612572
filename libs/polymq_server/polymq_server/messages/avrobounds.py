"""The bounds Avro data keeps before fastavro's C reader sees it (sans-IO, pure Python).

fastavro's ``schemaless_reader`` is C (Cython): it recurses on the C stack once for every
record, array, map and union it enters, with no limit, and Python's recursion limit does not
see those frames. A recursive schema (``{"name": "L", ..., "type": ["null", "L"]}``) lets a
40 KB record nest 20,000 deep and the process dies of a segmentation fault; an array of
nulls (items that take no bytes) can claim 2**62 items in ten bytes, which fastavro tries to
build. Every decode of client data therefore keeps these bounds first; the choice made:

1. **Schemas**: recursive schemas are allowed (lists and trees are what Avro's names are
   for), but a schema's types nest at most :data:`MAX_DEPTH` deep (records, arrays, maps and
   unions, named types expanded, a recursive reference not followed), its JSON at most
   :data:`MAX_JSON_DEPTH`, and no record may contain itself without a union, an array or a
   map on the way (it would have no finite value, and fastavro would recurse for ever):
   :func:`shape` refuses those (``polymq_server.messages.avro.parse`` answers InvalidSchema, 422, at
   registration, at publish and when a stored schema is loaded).
2. **Data**: data of a schema whose values cannot nest deeper than the schema does, and whose
   arrays' items all take bytes, goes to fastavro as it is (it cannot pass the bounds). Data
   of any other schema (:attr:`Shape.walk`) is first walked by :func:`walk`, here, in pure
   Python with an explicit stack (no recursion at all), which refuses a value nested more
   than :data:`MAX_DEPTH` deep and more array and map items than the datum has bytes plus
   :data:`MAX_EMPTY_ITEMS` (and, as it must read them to find its way, lengths, counts and
   union indexes out of range, or data that ends early). Only what it passes reaches
   fastavro, which then decides everything else. Its callers: ``polymq_server.messages.avro``
   (``check_bounds``, before every ``read_datum``: the JSON views) and the Avro frontend
   (single-object records and container blocks, before its scanner and fastavro).

Errors are ``ValueError`` (and ``EOFError`` for data that ends early, as fastavro raises), so
the callers' existing translation of fastavro's errors applies::

    ValueError
     ├── SchemaTooDeep   the schema nests deeper than MAX_DEPTH (or its JSON MAX_JSON_DEPTH)
     ├── EndlessRecord   a record that always contains itself
     ├── TooDeep         a value nested deeper than MAX_DEPTH
     └── TooManyItems    more array and map items than bytes (plus MAX_EMPTY_ITEMS)
    EOFError             the data ends inside the datum
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .nesting import nests_deeper

__all__ = [
    "MAX_DEPTH",
    "MAX_EMPTY_ITEMS",
    "MAX_JSON_DEPTH",
    "EndlessRecord",
    "SchemaTooDeep",
    "Shape",
    "TooDeep",
    "TooManyItems",
    "check_json_depth",
    "shape",
    "walk",
]

MAX_DEPTH = 128
"""Records, arrays, maps and unions nested in one value (or one schema). fastavro spends about
one to two kilobytes of C stack on each: 128 of them stay far inside any thread's stack."""
MAX_JSON_DEPTH = 4 * MAX_DEPTH
"""Objects and lists nested in a schema's JSON (a record's field is three JSON levels)."""
MAX_EMPTY_ITEMS = 65_536
"""Array and map items one datum may hold beyond one per byte (items that take no bytes:
nulls, empty records)."""

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_NESTING = frozenset({"record", "error", "array", "map"})  # and unions (lists)
_KINDS = _PRIMITIVES | _NESTING | {"enum", "fixed"}


class SchemaTooDeep(ValueError):
    def __init__(self, what: str = "types") -> None:
        limit = MAX_DEPTH if what == "types" else MAX_JSON_DEPTH
        super().__init__(f"the schema nests its {what} more than {limit} deep")


class EndlessRecord(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(
            f"record {name[:80]!r} contains itself without a union, array or map on the way: "
            "it has no finite value"
        )


class TooDeep(ValueError):
    def __init__(self) -> None:
        super().__init__(
            f"the value nests records, arrays, maps and unions more than {MAX_DEPTH} deep"
        )


class TooManyItems(ValueError):
    def __init__(self) -> None:
        super().__init__(
            f"the value holds more array and map items than it has bytes (plus {MAX_EMPTY_ITEMS})"
        )


# ---- schemas -------------------------------------------------------------------------------
def check_json_depth(obj: Any) -> None:
    """SchemaTooDeep if ``obj`` (decoded JSON) nests objects and lists more than
    :data:`MAX_JSON_DEPTH` deep (checked without recursion)."""
    if nests_deeper(obj, MAX_JSON_DEPTH):
        raise SchemaTooDeep("JSON objects and lists")


@dataclass(frozen=True)
class Shape:
    """What a schema lets its data do: ``height``, the deepest nesting of its types (a
    recursive reference not followed); ``recursive``; ``empty_items``, whether some array's
    items can take no bytes; and ``named``, its named types by full name (what
    :func:`walk` resolves references with)."""

    height: int
    recursive: bool
    empty_items: bool
    named: Mapping[str, Any] = field(compare=False, repr=False)

    @property
    def walk(self) -> bool:
        """Whether data of this schema must be walked (:func:`walk`) before fastavro reads it."""
        return self.recursive or self.empty_items


def shape(plain: Any) -> Shape:
    """The shape of a schema in fastavro's parsed form (without logical types); SchemaTooDeep
    or EndlessRecord for one that is refused. Recurses once per nested type and JSON wrapper,
    so call it on a schema whose JSON passed :func:`check_json_depth`."""
    named = _named_types(plain)
    a = _Analysis(named)
    height, _ = a.visit(plain, 0)
    return Shape(height, a.recursive, a.empty_items, named)


def _named_types(plain: Any) -> dict[str, Any]:
    """Every named type defined in ``plain`` (fastavro keeps a table of them only at the top
    of a record; a union's or an array's records define theirs inline)."""
    out: dict[str, Any] = {}
    stack = [plain]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            table = node.get("__named_schemas")
            if isinstance(table, dict):
                out.update(table)
            name = node.get("name")
            if isinstance(name, str) and node.get("type") in ("record", "error", "enum", "fixed"):
                out.setdefault(name, node)
            stack.extend(v for k, v in node.items() if k in ("type", "items", "values"))
            fields = node.get("fields")
            if isinstance(fields, list):
                stack.extend(f.get("type") for f in fields if isinstance(f, dict))
    return out


class _Analysis:
    def __init__(self, named: Mapping[str, Any]) -> None:
        self.named = named
        self.done: dict[str, tuple[int, bool]] = {}  # name -> (height, takes no bytes)
        self.open: dict[str, int] = {}  # names being visited -> escapes on the way in
        self.escapes = 0  # unions, arrays and maps on the current path
        self.recursive = False
        self.empty_items = False

    def visit(self, node: Any, above: int) -> tuple[int, bool]:
        """``node``'s height and whether its values can take no bytes; ``above`` nesting
        types enclose it."""
        if isinstance(node, str):
            if node in _PRIMITIVES:
                return 0, node == "null"
            return self.reference(node, above)
        if isinstance(node, list):  # a union: its index takes a byte
            self.enter(above)
            self.escapes += 1
            height = max((self.visit(b, above + 1)[0] for b in node), default=0)
            self.escapes -= 1
            return height + 1, False
        if not isinstance(node, dict):
            return 0, False  # (fastavro has refused anything else)
        kind = node.get("type")
        if isinstance(kind, str) and kind in _PRIMITIVES:
            return 0, kind == "null"
        if kind in ("record", "error"):
            return self.record(node, above)
        if kind == "fixed":
            return 0, node.get("size") == 0
        if kind == "enum":
            return 0, False
        if kind in ("array", "map"):
            self.enter(above)
            self.escapes += 1
            height, empty = self.visit(
                node.get("items" if kind == "array" else "values"), above + 1
            )
            self.escapes -= 1
            if kind == "array" and empty:
                self.empty_items = True
            return height + 1, False
        return self.visit(kind, above)  # {"type": <a type>}

    def enter(self, above: int) -> None:
        if above >= MAX_DEPTH:
            raise SchemaTooDeep

    def reference(self, name: str, above: int) -> tuple[int, bool]:
        if name in self.open:
            if self.open[name] == self.escapes:
                raise EndlessRecord(name)
            self.recursive = True
            return 0, False
        if name in self.done:
            height, empty = self.done[name]
            if above + height > MAX_DEPTH:
                raise SchemaTooDeep
            return height, empty
        node = self.named.get(name)
        return (0, False) if node is None else self.visit(node, above)

    def record(self, node: dict[str, Any], above: int) -> tuple[int, bool]:
        name = node.get("name")
        if isinstance(name, str):
            if name in self.done or name in self.open:
                return self.reference(name, above)
            self.open[name] = self.escapes
        self.enter(above)
        height, empty = 0, True
        for f in node.get("fields") or ():
            h, e = self.visit(f.get("type") if isinstance(f, dict) else None, above + 1)
            height, empty = max(height, h), empty and e
        if isinstance(name, str):
            del self.open[name]
            self.done[name] = (height + 1, empty)
        return height + 1, empty


# ---- data ----------------------------------------------------------------------------------
def walk(data: bytes, pos: int, plain: Any, named: Mapping[str, Any]) -> int:
    """Where the datum of ``plain`` (fastavro's parsed form without logical types, whose
    named types are ``named``: its :attr:`Shape.named`) that starts at ``data[pos]`` ends,
    found without recursion; TooDeep, TooManyItems, EOFError or ValueError instead of
    reading past a bound (see the module's docstring)."""
    n = len(data)
    items_left = n - pos + MAX_EMPTY_ITEMS
    # (node, depth, items left in the current block or -1 for "a value", is it a map)
    stack: list[tuple[Any, int, int, bool]] = [(plain, 0, -1, False)]
    while stack:
        node, depth, left, is_map = stack.pop()
        if left >= 0:  # the items of an array or map: the next one, or the next block
            if left == 0:
                count, pos = _long(data, pos)
                if count == 0:
                    continue
                if count < 0:
                    count = -count
                    _, pos = _long(data, pos)  # the block's size in bytes
                items_left -= count
                if items_left < 0:
                    raise TooManyItems
                left = count
            stack.append((node, depth, left - 1, is_map))
            if is_map:
                pos = _skip_bytes(data, pos, n)
            stack.append((node, depth, -1, False))
            continue
        while True:  # down to a type's kind, through names and {"type": ...} wrappers
            if isinstance(node, str):
                if node in _PRIMITIVES:
                    kind = node
                    break
                node = named[node]
            elif isinstance(node, list):
                kind = "union"
                break
            else:
                kind = node["type"]
                if isinstance(kind, str) and kind in _KINDS:
                    break
                node = kind
        if kind in _PRIMITIVES:
            pos = _primitive(data, pos, n, kind)
            continue
        if kind == "enum":
            _, pos = _long(data, pos)
            continue
        if kind == "fixed":
            pos += node["size"]
            if pos > n:
                raise EOFError("the data ends inside a fixed")
            continue
        if depth >= MAX_DEPTH:
            raise TooDeep
        if kind == "union":
            index, pos = _long(data, pos)
            if not 0 <= index < len(node):
                raise ValueError(f"union index {index} out of range")
            stack.append((node[index], depth + 1, -1, False))
        elif kind in ("record", "error"):
            stack.extend((f["type"], depth + 1, -1, False) for f in reversed(node["fields"]))
        else:  # array or map
            item = node["items"] if kind == "array" else node["values"]
            stack.append((item, depth + 1, 0, kind == "map"))
    return pos


def _long(data: bytes, pos: int) -> tuple[int, int]:
    v = shift = 0
    for _ in range(10):
        if pos >= len(data):
            raise EOFError("the data ends inside a number")
        b = data[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return (v >> 1) ^ -(v & 1), pos
        shift += 7
    raise ValueError("a number longer than 10 bytes")


def _skip_bytes(data: bytes, pos: int, n: int) -> int:
    size, pos = _long(data, pos)
    if size < 0:
        raise ValueError(f"negative length {size}")
    if pos + size > n:
        raise EOFError("the data ends inside bytes or a string")
    return pos + size


def _primitive(data: bytes, pos: int, n: int, kind: str) -> int:
    if kind == "null":
        return pos
    if kind in ("int", "long"):
        return _long(data, pos)[1]
    if kind in ("bytes", "string"):
        return _skip_bytes(data, pos, n)
    pos += 1 if kind == "boolean" else 4 if kind == "float" else 8
    if pos > n:
        raise EOFError(f"the data ends inside a {kind}")
    return pos
