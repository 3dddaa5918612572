"""How deep decoded data (JSON, AMQP field tables) nests, measured without recursion, for the
decoders that must refuse data nested too deeply before anything recursive walks it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["nests_deeper"]


def nests_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` nests mappings and lists (or tuples) more than ``limit`` deep."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, Mapping):
            children: Any = v.values()
        elif isinstance(v, list | tuple):
            children = v
        else:
            continue
        if depth >= limit:
            return True
        stack.extend((c, depth + 1) for c in children)
    return False
