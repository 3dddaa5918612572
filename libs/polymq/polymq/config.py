"""Settings from the environment (``POLYMQ_...``), with clear errors, in the manner of
starlette's ``config.py``. Each service declares one frozen dataclass and reads it with
:func:`from_env`; the CLI layers its flags on top with ``dataclasses.replace``.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["ConfigError", "from_env"]

T = TypeVar("T")


class ConfigError(ValueError):
    """A setting is malformed; the message names the variable and what it expects."""


def _convert(name: str, raw: str, typ: Any) -> Any:
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if raw == "":
            return None
        return _convert(name, raw, args[0])
    if origin is tuple:
        parts = [p.strip() for p in raw.split(",") if p.strip()]
        targs = typing.get_args(typ)
        if len(targs) == 2 and targs[1] is Ellipsis:  # tuple[int, ...]: convert each item
            return tuple(_convert(name, p, targs[0]) for p in parts)
        if len(targs) != len(parts):
            raise ConfigError(f"{name}={raw!r}: expected {len(targs)} comma-separated values")
        return tuple(_convert(name, p, t) for p, t in zip(parts, targs, strict=True))
    try:
        if typ is bool:
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError("expected true or false")
        if typ is int:
            return int(raw)
        if typ is float:
            return float(raw)
        if typ is Path:
            return Path(raw)
        if typ is str:
            return raw
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r}: {exc}") from None
    raise ConfigError(f"{name}: unsupported setting type {typ!r}")


def from_env(cls: type[T], prefix: str = "POLYMQ_", env: Mapping[str, str] | None = None) -> T:
    """Build ``cls`` (a dataclass) from ``PREFIX_FIELD`` variables; defaults fill the rest."""
    env = os.environ if env is None else env
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        var = prefix + f.name.upper()
        if var in env:
            kwargs[f.name] = _convert(var, env[var], hints[f.name])
        elif (
            f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ):
            raise ConfigError(f"{var} is missing, and {cls.__name__}.{f.name} has no default")
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if check is not None:
        check()
    return obj
