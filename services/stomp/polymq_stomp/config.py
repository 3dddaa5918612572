"""The STOMP frontend's settings: ``POLYMQ_*`` environment variables, overridden by CLI flags.

Settings shared with the other frontends keep their plain names (``POLYMQ_HOST``,
``POLYMQ_CORE_HOST``, ``POLYMQ_AUTH``, ...); those of STOMP alone start with ``STOMP_`` so
that ``polymq run`` can hold every service's settings in one environment without clashes
(``POLYMQ_STOMP_MAX_FRAME`` is not the core's ``POLYMQ_MAX_FRAME``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from polymq_server.config import ConfigError, check_frontend

KIB = 1024
MIB = 1024 * 1024


@dataclass(frozen=True)
class StompSettings:
    host: str = "127.0.0.1"
    stomp_port: int = 61613  # STOMP over TCP (0 picks a free port)
    stomp_ws_port: int = 15674  # STOMP over WebSocket at /ws, the page at / (0 picks one)
    core_host: str = "127.0.0.1"
    core_port: int = 7400
    auth: str = "anonymous"  # 'anonymous' or 'file:/path/users.json'
    core_user: str | None = None  # credentials of this frontend at the core
    core_password: str | None = None
    core_token: str | None = None  # a bearer token at the core (`polymq run` makes one)
    # TLS to the core (its wire port with --core-tls-cert): verified against the system's
    # CAs, or against this PEM CA bundle (which turns it on by itself)
    core_tls: bool = False
    core_tls_ca: str | None = None
    tls_cert: str | None = None  # PEM certificate (chain) for both listeners
    tls_key: str | None = None  # its PEM private key
    # bytes of one frame (headers and body), once logged in: room for the core's largest
    # body (POLYMQ_MAX_BODY, 16 MiB) and its headers, which RabbitMQ's STOMP takes too
    stomp_max_frame: int = 32 * MIB
    stomp_max_frame_before_login: int = 64 * KIB  # before CONNECTED went out (at most the above)
    stomp_vhosts: str = "/"  # comma-separated vhosts the host header may select; '*' = any
    stomp_host_names: str = ""  # more host header values meaning the default vhost '/'
    stomp_max_headers: int = 64  # headers in one frame
    stomp_max_header_length: int = 8 * KIB  # bytes of one header line
    stomp_max_subscriptions: int = 1000  # per connection
    stomp_prefetch: int = 1000  # default window of unacknowledged messages per subscription
    stomp_max_prefetch: int = 10_000  # the largest window a SUBSCRIBE may ask for (0 = this)
    stomp_buffer_messages: int = 10_000  # topic messages waiting for a slow socket, then policy
    stomp_buffer_bytes: int = 16 * MIB
    stomp_heartbeat_min: int = 100  # ms: the shortest heart-beat interval we send or expect
    stomp_heartbeat_grace: float = 2.0  # a client silent for interval x this is disconnected
    stomp_max_tx_frames: int = 10_000  # SEND/ACK/NACK frames one transaction may hold
    stomp_max_tx_bytes: int = 64 * MIB  # body bytes one transaction may hold
    stomp_max_inflight: int = 4096  # SENDs awaiting the core per connection, then reading pauses
    stomp_write_buffer: int = 1 * MIB  # bytes waiting for the socket, then reading pauses
    stomp_temp_queue_ttl: float = 300.0  # idle TTL of temp queues (a safety net if we crash)
    stomp_stompjs: str = ""  # path of stomp.umd.min.js ('' = the npm install in the source tree)
    # shared with the other listeners (POLYMQ_HANDSHAKE_TIMEOUT, POLYMQ_MAX_CONNECTIONS...):
    # seconds from the socket to CONNECTED; connections at once (0: the room the open-files
    # limit leaves) and per user (0: no limit)
    handshake_timeout: float = 10.0
    max_connections: int = 0
    max_connections_per_user: int = 0

    def check(self) -> None:
        check_frontend(self, "stomp_port", "stomp_ws_port")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError(
                "TLS needs both POLYMQ_TLS_CERT and POLYMQ_TLS_KEY (--tls-cert/--tls-key)"
            )
        for name in ("tls_cert", "tls_key"):
            path = getattr(self, name)
            if path and not os.path.isfile(path):
                raise ConfigError(f"POLYMQ_{name.upper()}={path!r}: no such file")
        _range("stomp_max_frame", self.stomp_max_frame, 1 * KIB, 1024 * MIB)
        _range(
            "stomp_max_frame_before_login", self.stomp_max_frame_before_login, 1 * KIB, 1024 * MIB
        )
        if not self.vhosts:
            raise ConfigError("POLYMQ_STOMP_VHOSTS must name at least one vhost (or '*')")
        _range("stomp_max_headers", self.stomp_max_headers, 8, 100_000)
        _range("max_connections", self.max_connections, 0, 10_000_000)
        _range("max_connections_per_user", self.max_connections_per_user, 0, 10_000_000)
        if not 0.1 <= self.handshake_timeout <= 3600:
            raise ConfigError("POLYMQ_HANDSHAKE_TIMEOUT must be 0.1..3600 seconds")
        _range("stomp_max_header_length", self.stomp_max_header_length, 256, 16 * MIB)
        _range("stomp_max_subscriptions", self.stomp_max_subscriptions, 1, 1_000_000)
        _range("stomp_max_prefetch", self.stomp_max_prefetch, 1, 1_000_000)
        _range("stomp_prefetch", self.stomp_prefetch, 1, self.stomp_max_prefetch)
        _range("stomp_buffer_messages", self.stomp_buffer_messages, 1, 10_000_000)
        _range("stomp_buffer_bytes", self.stomp_buffer_bytes, 1 * KIB, 64 * 1024 * MIB)
        _range("stomp_heartbeat_min", self.stomp_heartbeat_min, 1, 3_600_000)
        if not 1.0 <= self.stomp_heartbeat_grace <= 100.0:
            raise ConfigError("POLYMQ_STOMP_HEARTBEAT_GRACE must be 1..100 (a factor)")
        _range("stomp_max_tx_frames", self.stomp_max_tx_frames, 1, 10_000_000)
        _range("stomp_max_tx_bytes", self.stomp_max_tx_bytes, 1, 64 * 1024 * MIB)
        _range("stomp_max_inflight", self.stomp_max_inflight, 1, 10_000_000)
        _range("stomp_write_buffer", self.stomp_write_buffer, 1 * KIB, 64 * 1024 * MIB)
        if not 0 < self.stomp_temp_queue_ttl <= 86400 * 365:
            raise ConfigError("POLYMQ_STOMP_TEMP_QUEUE_TTL must be a positive number of seconds")

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)

    @property
    def vhosts(self) -> frozenset[str]:
        return _words(self.stomp_vhosts)

    @property
    def host_names(self) -> frozenset[str]:
        return _words(self.stomp_host_names.lower())


def _words(raw: str) -> frozenset[str]:
    return frozenset(w.strip() for w in raw.split(",") if w.strip())


def _range(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ConfigError(f"POLYMQ_{name.upper()} must be {low}..{high}")
