"""Settings from the environment (``POLYMQ_...``), with clear errors, in the manner of
starlette's ``config.py``. Each service declares one frozen dataclass and reads it with
:func:`from_env`; the CLI layers its flags on top with ``dataclasses.replace``.

Every frontend's settings have the fields of :class:`FrontendSettings`; its ``check()``
starts with the checks they share (:func:`check_frontend`, or :func:`check_addresses` and
:func:`check_access` around its own), :func:`check_tls` when it serves TLS, and bounds its
numbers with :func:`check_range`. :func:`server_ssl_context` turns ``POLYMQ_TLS_CERT`` and
``POLYMQ_TLS_KEY`` into the listener's ``ssl.SSLContext``, or a :class:`ConfigError` that
says which file is wrong and how.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from polymq.addresses import parse_addresses

__all__ = [
    "ConfigError",
    "FrontendSettings",
    "check_access",
    "check_addresses",
    "check_core",
    "check_frontend",
    "check_range",
    "check_readable",
    "check_tls",
    "core_flag",
    "core_ssl_context",
    "from_env",
    "load_certificate",
    "server_ssl_context",
]

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


def from_env(
    cls: type[T],
    prefix: str = "POLYMQ_",
    env: Mapping[str, str] | None = None,
    *,
    check: bool = True,
) -> T:
    """Build ``cls`` (a dataclass) from ``PREFIX_FIELD`` variables; defaults fill the rest.
    Its ``check()`` runs unless ``check`` is false (the CLI checks once its flags are in:
    a flag may be what makes the environment's settings whole)."""
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
    checker = getattr(obj, "check", None)
    if check and checker is not None:
        checker()
    return obj


class FrontendSettings(Protocol):
    """What the settings of every frontend have: where it listens, the core it reaches
    (``POLYMQ_CORE_HOST``: a host, or several ``HOST:PORT`` comma-separated, each without a
    port on ``POLYMQ_CORE_PORT``), ``POLYMQ_AUTH``, its own credentials at the core, TLS
    to the core (``POLYMQ_CORE_TLS``, ``POLYMQ_CORE_TLS_CA``: :func:`core_ssl_context`),
    and the PEM certificate (chain) and private key of its listeners
    (``POLYMQ_TLS_CERT``/``POLYMQ_TLS_KEY``; both None: plain)."""

    @property
    def host(self) -> str: ...
    @property
    def core_host(self) -> str: ...
    @property
    def core_port(self) -> int: ...
    @property
    def auth(self) -> str: ...
    @property
    def core_user(self) -> str | None: ...
    @property
    def core_password(self) -> str | None: ...
    @property
    def core_token(self) -> str | None: ...
    @property
    def tls_cert(self) -> str | None: ...
    @property
    def tls_key(self) -> str | None: ...
    @property
    def core_tls(self) -> bool: ...
    @property
    def core_tls_ca(self) -> str | None: ...

    def check(self) -> None: ...


def check_addresses(settings: FrontendSettings, *ports: str) -> None:
    """The listening ``ports`` (names of settings; 0 picks a free port) and the core's
    address."""
    for name in (*ports, "core_port"):
        if not 0 <= getattr(settings, name) <= 65535:
            raise ConfigError(f"POLYMQ_{name.upper()} must be 0..65535 (0 picks a free port)")
    check_core(settings.core_host, settings.core_port)


def check_core(host: str, port: int) -> None:
    """The core's address(es): ``POLYMQ_CORE_HOST`` (one host, or ``HOST:PORT``s
    comma-separated) and ``POLYMQ_CORE_PORT`` (the port of those without one)."""
    if not 1 <= port <= 65535:
        raise ConfigError("POLYMQ_CORE_PORT must name the core's port (1..65535), not 0")
    if not host:
        raise ConfigError("POLYMQ_CORE_HOST must not be empty")
    try:
        parse_addresses(host, default_port=port)
    except ValueError as exc:
        raise ConfigError(
            f"POLYMQ_CORE_HOST={host!r}: {exc} (give HOST, or HOST:PORT,HOST:PORT,...)"
        ) from None


def core_flag(value: str, flag: str = "--core") -> tuple[str, int]:
    """The core's address(es) given as ``--core`` (or ``POLYMQ_CORE``): ``HOST:PORT``, or
    several, comma-separated (each one's port defaults to 7400), as the settings
    ``core_host`` and ``core_port`` hold them: one address as its host and port, several
    as ``core_host`` listing each ``HOST:PORT`` (a frontend's core link tries them in
    turn; a name that resolves to several addresses, as a headless Service's does, stands
    for all of them)."""
    # (":PORT" is the port on this machine, as it always was)
    items = [f"127.0.0.1{i.strip()}" if i.strip().startswith(":") else i for i in value.split(",")]
    try:
        addresses = parse_addresses(items)
    except ValueError as exc:
        raise ConfigError(f"{flag} {value!r}: {exc} (expected HOST:PORT[,HOST:PORT...])") from None
    if len(addresses) == 1:
        [one] = addresses
        return one.host, one.port
    return ",".join(map(str, addresses)), addresses[0].port


def check_access(settings: FrontendSettings) -> None:
    """``POLYMQ_AUTH``, and the frontend's own credentials at the core."""
    if settings.auth not in ("", "anonymous") and not (
        settings.auth.startswith("file:") and len(settings.auth) > 5
    ):
        raise ConfigError("POLYMQ_AUTH must be 'anonymous' or 'file:/path/users.json'")
    if settings.core_password is not None and not settings.core_user:
        raise ConfigError("POLYMQ_CORE_PASSWORD is set but POLYMQ_CORE_USER is not")


def check_frontend(settings: FrontendSettings, *ports: str) -> None:
    """:func:`check_addresses`, then :func:`check_access`."""
    check_addresses(settings, *ports)
    check_access(settings)


def check_range(name: str, value: float, low: float, high: float, unit: str = "") -> None:
    """``POLYMQ_<NAME>`` (the setting ``name``) must be within ``low..high`` (in ``unit``)."""
    if not low <= value <= high:
        suffix = f" {unit}" if unit else ""
        raise ConfigError(f"POLYMQ_{name.upper()} must be {low:g}..{high:g}{suffix}")


def check_tls(settings: FrontendSettings) -> None:
    """``POLYMQ_TLS_CERT`` and ``POLYMQ_TLS_KEY``: both or neither, each a file this process
    can read (what is in them is :func:`server_ssl_context`'s to judge)."""
    if bool(settings.tls_cert) != bool(settings.tls_key):
        raise ConfigError(
            "TLS needs both POLYMQ_TLS_CERT and POLYMQ_TLS_KEY (--tls-cert/--tls-key)"
        )
    for name in ("tls_cert", "tls_key"):
        path = getattr(settings, name)
        if path:
            check_readable(f"POLYMQ_{name.upper()}", path)


def check_readable(var: str, path: str) -> None:
    """The file ``path`` (the setting ``var``, e.g. ``POLYMQ_TLS_CERT``) exists, is not a
    directory and this process can read it; a :class:`ConfigError` saying which otherwise."""
    where = f"{var}={path!r}"
    try:
        with open(path, "rb") as f:
            f.read(1)
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{where}: a directory, not a PEM file") from None
    except PermissionError:
        raise ConfigError(f"{where}: not readable by this process (uid {os.getuid()})") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror or exc}") from None


def _encrypted_key(var: str) -> Callable[[], bytes]:
    def refuse() -> bytes:
        # called by OpenSSL for a password, instead of prompting on the terminal
        raise ConfigError(
            f"{var}: the private key is encrypted; polymq needs it unencrypted "
            "(openssl pkey -in key.pem -out plain.pem), readable by this process only"
        )

    return refuse


def server_ssl_context(
    cert: str,
    key: str,
    *,
    cert_var: str = "POLYMQ_TLS_CERT",
    key_var: str = "POLYMQ_TLS_KEY",
) -> ssl.SSLContext:
    """A server-side TLS context (Python's defaults for serving clients: TLS 1.2 or later,
    no client certificates) with the PEM certificate (chain) ``cert`` and its private key
    ``key``; a :class:`ConfigError` naming the file (and its setting, ``cert_var`` or
    ``key_var``) when they do not load."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    load_certificate(ctx, cert, key, cert_var=cert_var, key_var=key_var)
    return ctx


def core_ssl_context(settings: FrontendSettings) -> ssl.SSLContext | None:
    """A frontend's TLS context for its link to the core: with ``core_tls_ca``, trusting
    that PEM CA bundle only; with ``core_tls`` alone, the system's CAs; the core's host
    name (``--core``) must be one its certificate names. None: plain. A
    :class:`ConfigError` names ``POLYMQ_CORE_TLS_CA`` when the bundle does not load."""
    ca = settings.core_tls_ca
    if not ca:
        return ssl.create_default_context() if settings.core_tls else None
    check_readable("POLYMQ_CORE_TLS_CA", ca)
    try:
        return ssl.create_default_context(cafile=ca)
    except (ssl.SSLError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ConfigError(
            f"POLYMQ_CORE_TLS_CA={ca!r}: not a PEM CA bundle OpenSSL can load ({reason})"
        ) from None


def load_certificate(
    ctx: ssl.SSLContext,
    cert: str,
    key: str,
    *,
    cert_var: str = "POLYMQ_TLS_CERT",
    key_var: str = "POLYMQ_TLS_KEY",
) -> None:
    """Load the PEM certificate (chain) ``cert`` and its unencrypted private key ``key``
    into ``ctx``; a :class:`ConfigError` naming the setting (``cert_var``, ``key_var``) and
    the file when they do not load."""
    for path, marker, var, what in (
        (cert, b"-----BEGIN CERTIFICATE-----", cert_var, "a PEM certificate"),
        (key, b"PRIVATE KEY-----", key_var, "a PEM private key"),
    ):
        try:
            with open(path, "rb") as f:
                found = marker in f.read()
        except OSError as exc:
            raise ConfigError(f"{var}={path!r}: cannot read it: {exc.strerror or exc}") from None
        if not found:
            raise ConfigError(f"{var}={path!r}: not {what} (no {marker.decode()!r} line)")
    try:
        ctx.load_cert_chain(cert, key, password=_encrypted_key(key_var))
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(
                f"{key_var}={key!r} is not the private key of {cert_var}={cert!r}"
            ) from None
        raise ConfigError(
            f"{cert_var}={cert!r} / {key_var}={key!r}: OpenSSL cannot load them "
            f"({exc.reason or exc})"
        ) from None
