"""The RabbitMQ bridge's settings (``POLYMQ_*`` environment, CLI flags on top) and its links
file.

Settings (:class:`BridgeSettings`): ``POLYMQ_BRIDGE_CONFIG`` (the links file, or
``--config``), ``POLYMQ_BRIDGE_RABBITMQ_URL`` (``amqp://guest:guest@127.0.0.1:5672/``), the
core as for every frontend (``POLYMQ_CORE_HOST``/``PORT``/``USER``/``PASSWORD``/``TOKEN``),
``POLYMQ_HOST`` and ``POLYMQ_BRIDGE_PORT`` for ``/metrics``, ``/healthz`` and ``/readyz``.

The links file is JSON: ``{"links": [LINK, ...]}``, each link one of::

    {"name": "orders-out",                     # unique: [A-Za-z0-9_.:-], in metrics and logs
     "direction": "polymq-to-rabbitmq",
     "source": "queue/orders",                 # or "stream/<name>"
     "offset": "first",                        # streams: where a new link starts (first, last,
                                               # next or a sequence); later it resumes after the
                                               # last confirmed entry, kept in the core's kv
     "exchange": "polymq.out",                 # "" (the default) is RabbitMQ's default exchange
     "exchange_type": "topic",                 # optional: declare it (durable) with this type;
                                               # absent: it must exist
     "routing_key": "orders.new",              # default: the source's name
     "on_unroutable": "retry",                 # a message RabbitMQ cannot route (no queue
                                               # bound): "retry" keeps it in polymq and the
                                               # link retries with backoff until it can;
                                               # "reject" nacks it without requeue (the polymq
                                               # queue's dead letter, if any); "drop" publishes
                                               # without mandatory (RabbitMQ drops it, its
                                               # default)
     "prefetch": 100}                          # unconfirmed messages in flight (1..10000)

    {"name": "jobs-in",
     "direction": "rabbitmq-to-polymq",
     "queue": "jobs",                          # the RabbitMQ queue to consume
     "declare": true,                          # declare it durable if missing (default false:
                                               # it must exist)
     "bindings": [{"exchange": "amq.topic", "routing_key": "jobs.#"}],   # with declare only
     "destination": "queue/jobs",              # a polymq queue, topic or stream
     "persistent": "carry",                    # carry the delivery mode, or "always" persistent
     "prefetch": 100}
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from polymq.errors import BadRequest
from polymq.types import Destination, Kind, parse_offset
from polymq_server.config import ConfigError, check_core

__all__ = [
    "MAX_PREFETCH",
    "BridgeConfig",
    "BridgeSettings",
    "Direction",
    "InboundLink",
    "LinkConfig",
    "OutboundLink",
    "load_links",
    "parse_links",
]

MAX_PREFETCH = 10_000
DEFAULT_PREFETCH = 100
_NAME_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,100}\Z")
_EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")


@dataclass(frozen=True)
class BridgeSettings:
    host: str = "127.0.0.1"  # where /metrics, /healthz and /readyz listen
    bridge_port: int = 7460  # their port (0 picks a free one)
    bridge_config: str = ""  # the links file (JSON); --config on the command line
    bridge_rabbitmq_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    core_host: str = "127.0.0.1"
    core_port: int = 7400
    core_user: str | None = None  # credentials of the bridge at the core
    core_password: str | None = None
    core_token: str | None = None
    bridge_backoff_min: float = 0.1  # seconds before the first reconnect (either side)
    bridge_backoff_max: float = 5.0  # the cap of the doubling (each delay jittered down by half)
    bridge_heartbeat: int = 10  # AMQP heart-beat seconds (a hung RabbitMQ is found in ~2x)
    bridge_publish_timeout: float = 30.0  # seconds a publish may wait for its confirm/receipt
    bridge_stop_grace: float = 5.0  # seconds stop() waits for in-flight confirms
    bridge_stats_interval: float = 2.0  # seconds between lag (source depth) samples

    def check(self) -> None:
        if not 0 <= self.bridge_port <= 65535:
            raise ConfigError("POLYMQ_BRIDGE_PORT must be 0..65535 (0 picks a free port)")
        check_core(self.core_host, self.core_port)
        if self.core_password is not None and not self.core_user:
            raise ConfigError("POLYMQ_CORE_PASSWORD is set but POLYMQ_CORE_USER is not")
        url = urlsplit(self.bridge_rabbitmq_url)
        if url.scheme not in ("amqp", "amqps") or not url.hostname:
            raise ConfigError(
                f"POLYMQ_BRIDGE_RABBITMQ_URL={_redact(self.bridge_rabbitmq_url)!r} must look "
                "like amqp://user:password@host:5672/vhost"
            )
        try:
            url.port  # noqa: B018 - raises on a malformed port
        except ValueError:
            raise ConfigError(
                f"POLYMQ_BRIDGE_RABBITMQ_URL={_redact(self.bridge_rabbitmq_url)!r}: bad port"
            ) from None
        if not 0 < self.bridge_backoff_min <= self.bridge_backoff_max <= 3600:
            raise ConfigError(
                "POLYMQ_BRIDGE_BACKOFF_MIN and _MAX must satisfy 0 < min <= max <= 3600 seconds"
            )
        if not 0 <= self.bridge_heartbeat <= 3600:
            raise ConfigError("POLYMQ_BRIDGE_HEARTBEAT must be 0..3600 seconds (0: none)")
        for name in ("bridge_publish_timeout", "bridge_stop_grace", "bridge_stats_interval"):
            if not 0 < getattr(self, name) <= 3600:
                raise ConfigError(f"POLYMQ_{name.upper()} must be a number of seconds in 0..3600")

    def links(self) -> BridgeConfig:
        """The links file, read and validated (:class:`ConfigError` if there is none)."""
        if not self.bridge_config:
            raise ConfigError(
                "no links file: set POLYMQ_BRIDGE_CONFIG or pass --config FILE (a JSON file "
                'like {"links": [...]}, see polymq_bridge.config)'
            )
        return load_links(self.bridge_config)

    @property
    def rabbitmq_address(self) -> str:
        """host:port/vhost of the RabbitMQ URL, without credentials (for logs)."""
        return _redact(self.bridge_rabbitmq_url)


def _redact(url: str) -> str:
    u = urlsplit(url)
    host = u.hostname or "?"
    try:
        port = u.port or (5671 if u.scheme == "amqps" else 5672)
    except ValueError:
        port = "?"  # type: ignore[assignment]
    return f"{u.scheme or 'amqp'}://{host}:{port}{u.path or '/'}"


# ---- the links file ----------------------------------------------------------------------
class Direction(enum.Enum):
    TO_RABBITMQ = "polymq-to-rabbitmq"
    TO_POLYMQ = "rabbitmq-to-polymq"

    @property
    def label(self) -> str:
        """The metrics label: ``to_rabbitmq`` or ``to_polymq``."""
        return "to_rabbitmq" if self is Direction.TO_RABBITMQ else "to_polymq"


@dataclass(frozen=True)
class OutboundLink:
    """polymq ``queue/x`` or ``stream/x`` -> a RabbitMQ exchange with a routing key."""

    name: str
    source: str
    exchange: str
    routing_key: str
    exchange_type: str | None = None
    on_unroutable: str = "retry"  # "retry", "reject" or "drop"
    offset: str | int | float = "first"
    prefetch: int = DEFAULT_PREFETCH

    direction = Direction.TO_RABBITMQ

    @property
    def mandatory(self) -> bool:
        """Whether publishes ask RabbitMQ to return what it cannot route."""
        return self.on_unroutable != "drop"

    @property
    def is_stream(self) -> bool:
        return self.source.startswith("stream/")

    @property
    def offset_key(self) -> str:
        """Where the core's key/value store keeps a stream link's progress."""
        return f"polymq-bridge/{self.name}/offset"


@dataclass(frozen=True)
class Binding:
    exchange: str
    routing_key: str


@dataclass(frozen=True)
class InboundLink:
    """A RabbitMQ queue -> a polymq queue, topic or stream."""

    name: str
    queue: str
    destination: str
    declare: bool = False
    bindings: tuple[Binding, ...] = ()
    always_persistent: bool = False
    prefetch: int = DEFAULT_PREFETCH

    direction = Direction.TO_POLYMQ


LinkConfig = OutboundLink | InboundLink


@dataclass(frozen=True)
class BridgeConfig:
    links: tuple[LinkConfig, ...] = field(default_factory=tuple)


class _Where:
    """Builds error messages that say which file, which link and which key."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.link = ""

    def error(self, msg: str) -> ConfigError:
        return ConfigError(f"bridge links file {self.path}: {self.link}{msg}")


_TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false", list: "a list"}


def _get(d: dict[str, Any], key: str, typ: type, where: _Where, default: Any) -> Any:
    if key not in d:
        return default
    v = d[key]
    if not isinstance(v, typ) or (isinstance(v, bool) and typ is not bool):
        raise where.error(f'"{key}" must be {_TYPE_NAMES[typ]}, not {json.dumps(v)[:60]}')
    return v


def _required_str(d: dict[str, Any], key: str, where: _Where) -> str:
    if key not in d:
        raise where.error(f'"{key}" is missing')
    v: str = _get(d, key, str, where, None)
    return v


def _prefetch(d: dict[str, Any], where: _Where) -> int:
    p: int = _get(d, "prefetch", int, where, DEFAULT_PREFETCH)
    if not 1 <= p <= MAX_PREFETCH:
        raise where.error(f'"prefetch" must be 1..{MAX_PREFETCH}, not {p}')
    return p


def _amqp_name(v: str, key: str, where: _Where, *, empty_ok: bool) -> str:
    if not v and not empty_ok:
        raise where.error(f'"{key}" must not be empty')
    if len(v.encode()) > 255:
        raise where.error(f'"{key}" is longer than 255 bytes (an AMQP short string)')
    return v


def _unknown(d: dict[str, Any], allowed: frozenset[str], where: _Where) -> None:
    extra = sorted(set(d) - allowed)
    if extra:
        raise where.error(
            f"unknown key(s) {', '.join(map(json.dumps, extra))} "
            f"(allowed: {', '.join(sorted(allowed))})"
        )


_COMMON = frozenset({"name", "direction", "prefetch"})
_OUT_KEYS = _COMMON | {
    "source", "offset", "exchange", "exchange_type", "routing_key", "on_unroutable",
}  # fmt: skip
_UNROUTABLE = ("retry", "reject", "drop")
_IN_KEYS = _COMMON | {"queue", "declare", "bindings", "destination", "persistent"}


def _outbound(d: dict[str, Any], name: str, where: _Where) -> OutboundLink:
    _unknown(d, _OUT_KEYS, where)
    source = _required_str(d, "source", where)
    try:
        dest = Destination.parse(source)
    except BadRequest as exc:
        raise where.error(f'"source": {exc.message}') from None
    if dest.kind not in (Kind.QUEUE, Kind.STREAM):
        raise where.error(
            f'"source" must be a polymq queue/<name> or stream/<name>, not {source!r} '
            "(a topic holds nothing for the bridge to take at least once)"
        )
    offset: Any = "first"
    if "offset" in d:
        if dest.kind is not Kind.STREAM:
            raise where.error('"offset" applies to a stream source only')
        try:
            offset = parse_offset(d["offset"])
        except BadRequest as exc:
            raise where.error(f'"offset": {exc.message}') from None
    exchange = _amqp_name(_get(d, "exchange", str, where, ""), "exchange", where, empty_ok=True)
    etype = _get(d, "exchange_type", str, where, None)
    if etype is not None:
        if etype not in _EXCHANGE_TYPES:
            raise where.error(f'"exchange_type" must be one of {", ".join(_EXCHANGE_TYPES)}')
        if not exchange:
            raise where.error('"exchange_type" needs a named "exchange" (the default exists)')
        if exchange.startswith("amq."):
            raise where.error('"exchange_type": RabbitMQ reserves "amq." exchanges; omit it')
    routing_key = _amqp_name(
        _get(d, "routing_key", str, where, dest.name), "routing_key", where, empty_ok=True
    )
    unroutable = _get(d, "on_unroutable", str, where, "retry")
    if unroutable not in _UNROUTABLE:
        raise where.error(f'"on_unroutable" must be one of {", ".join(map(repr, _UNROUTABLE))}')
    return OutboundLink(
        name=name,
        source=str(dest),
        exchange=exchange,
        routing_key=routing_key,
        exchange_type=etype,
        on_unroutable=unroutable,
        offset=offset,
        prefetch=_prefetch(d, where),
    )


def _inbound(d: dict[str, Any], name: str, where: _Where) -> InboundLink:
    _unknown(d, _IN_KEYS, where)
    queue = _amqp_name(_required_str(d, "queue", where), "queue", where, empty_ok=False)
    destination = _required_str(d, "destination", where)
    try:
        dest = Destination.parse(destination)
    except BadRequest as exc:
        raise where.error(f'"destination": {exc.message}') from None
    if dest.kind not in (Kind.QUEUE, Kind.TOPIC, Kind.STREAM):
        raise where.error('"destination" must be a polymq queue/, topic/ or stream/')
    declare = _get(d, "declare", bool, where, False)
    raw_bindings = _get(d, "bindings", list, where, [])
    if raw_bindings and not declare:
        raise where.error('"bindings" need "declare": true (the bridge binds what it declares)')
    bindings = []
    for i, b in enumerate(raw_bindings):
        if not isinstance(b, dict) or set(b) - {"exchange", "routing_key"} or "exchange" not in b:
            raise where.error(
                f'"bindings"[{i}] must be {{"exchange": "...", "routing_key": "..."}}'
            )
        ex = b["exchange"]
        rk = b.get("routing_key", "")
        if not isinstance(ex, str) or not ex or not isinstance(rk, str):
            raise where.error(f'"bindings"[{i}]: exchange and routing_key must be strings')
        bindings.append(Binding(ex, rk))
    persistent = _get(d, "persistent", str, where, "carry")
    if persistent not in ("carry", "always"):
        raise where.error('"persistent" must be "carry" (the delivery mode) or "always"')
    return InboundLink(
        name=name,
        queue=queue,
        destination=str(dest),
        declare=declare,
        bindings=tuple(bindings),
        always_persistent=persistent == "always",
        prefetch=_prefetch(d, where),
    )


def parse_links(doc: Any, path: str = "<config>") -> BridgeConfig:
    """Validate a parsed links document; :class:`ConfigError` names what is wrong where."""
    where = _Where(path)
    if not isinstance(doc, dict):
        raise where.error('the top level must be an object like {"links": [...]}')
    _unknown(doc, frozenset({"links"}), where)
    links = doc.get("links")
    if not isinstance(links, list) or not links:
        raise where.error('"links" must be a non-empty list of links')
    out: list[LinkConfig] = []
    names: set[str] = set()
    for i, d in enumerate(links):
        where.link = f"links[{i}]: "
        if not isinstance(d, dict):
            raise where.error("a link must be an object")
        name = _required_str(d, "name", where)
        if not _NAME_RE.match(name):
            raise where.error(
                f'"name" {name[:60]!r} must be 1..100 of letters, digits, "_", ".", ":", "-"'
            )
        where.link = f"links[{i}] ({name}): "
        if name in names:
            raise where.error("another link has the same name")
        names.add(name)
        direction = _required_str(d, "direction", where)
        if direction == Direction.TO_RABBITMQ.value:
            out.append(_outbound(d, name, where))
        elif direction == Direction.TO_POLYMQ.value:
            out.append(_inbound(d, name, where))
        else:
            raise where.error(
                f'"direction" must be "{Direction.TO_RABBITMQ.value}" or '
                f'"{Direction.TO_POLYMQ.value}", not {direction[:60]!r}'
            )
    return BridgeConfig(tuple(out))


def load_links(path: str | Path) -> BridgeConfig:
    """Read and validate the links file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"bridge links file {p}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"bridge links file {p}: cannot read it: {exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"bridge links file {p}: not valid JSON: {exc.msg} at line {exc.lineno} "
            f"column {exc.colno}"
        ) from None
    return parse_links(doc, str(p))
