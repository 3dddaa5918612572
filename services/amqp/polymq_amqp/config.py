"""The AMQP frontend's settings: ``POLYMQ_*`` environment variables, overridden by CLI flags.

Settings shared with the other frontends keep their plain names (``POLYMQ_HOST``,
``POLYMQ_CORE_HOST``, ``POLYMQ_AUTH``, ``POLYMQ_TLS_CERT``, ...); those of AMQP alone start
with ``AMQP_`` (``POLYMQ_AMQP_FRAME_MAX``), so that ``polymq run`` can hold every service's
settings in one environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from polymq_server.config import ConfigError, check_addresses

__all__ = ["AmqpSettings"]

KIB = 1024
MIB = 1024 * 1024


@dataclass(frozen=True)
class AmqpSettings:
    host: str = "127.0.0.1"
    amqp_port: int = 5672  # AMQP 0-9-1 over TCP (0 picks a free port)
    amqp_plain: bool = True  # false: no plain listener, AMQP over TLS only (needs tls_cert)
    amqp_tls_port: int = 5671  # AMQP over TLS, when tls_cert and tls_key are set (0 = any)
    amqp_admin_port: int = 15692  # /healthz, /readyz and /metrics over HTTP (0 = any)
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
    tls_cert: str | None = None  # PEM certificate (chain): enables the TLS listener
    tls_key: str | None = None  # its PEM private key
    amqp_vhosts: str = "/"  # comma-separated vhosts clients may open; '*' = any
    amqp_frame_max: int = 131072  # bytes of one frame we offer (clients may ask for less)
    amqp_channel_max: int = 2047  # channels per connection we offer
    amqp_heartbeat: int = 60  # seconds we offer (the client's tune-ok decides; 0 = none)
    amqp_handshake_timeout: float = 10.0  # seconds from the socket to connection.open-ok
    amqp_close_timeout: float = 3.0  # seconds to wait for close-ok after connection.close
    amqp_max_prefetch: int = 10_000  # a consumer's window when qos says 0 (unlimited)
    amqp_noack_window: int = 1000  # messages a no-ack consumer may have on the way
    amqp_max_consumers: int = 1000  # consumers per channel
    amqp_max_inflight: int = 4096  # publishes awaiting the core per connection, then pause
    amqp_write_buffer: int = 1 * MIB  # bytes waiting for the socket, then reading pauses
    amqp_get_visibility: float = 1800.0  # seconds a basic.get message stays unacked, at most
    amqp_exclusive_ttl: float = 86400.0  # idle TTL of exclusive queues at the core (if we die)
    amqp_cache_ttl: float = 2.0  # seconds exchange, queue and binding records are cached
    amqp_max_tx_messages: int = 10_000  # publishes and acks one transaction may hold
    amqp_max_tx_bytes: int = 64 * MIB  # body bytes one transaction may hold
    # a test switch: PUT / DELETE /alarm/forced on the admin port set and clear a forced
    # resource alarm (publishers blocked, connection.blocked sent); off by default: for
    # tests and drills, never where the admin port is reachable by others
    amqp_alarm_switch: bool = False
    # connections at once (0: the room the open-files limit leaves) and per user (0: none);
    # one past a limit is closed with 530 NOT_ALLOWED when it logs in
    max_connections: int = 0
    max_connections_per_user: int = 0

    def check(self) -> None:
        check_addresses(self, "amqp_port", "amqp_tls_port", "amqp_admin_port")
        if self.auth not in ("", "anonymous") and not (
            self.auth.startswith("file:") and len(self.auth) > 5
        ):
            raise ConfigError("POLYMQ_AUTH must be 'anonymous' or 'file:/path/users.json'")
        if self.core_password is not None and not self.core_user:
            raise ConfigError("POLYMQ_CORE_PASSWORD is set but POLYMQ_CORE_USER is not")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError(
                "TLS needs both POLYMQ_TLS_CERT and POLYMQ_TLS_KEY (--tls-cert/--tls-key)"
            )
        for name in ("tls_cert", "tls_key"):
            path = getattr(self, name)
            if path and not os.path.isfile(path):
                raise ConfigError(f"POLYMQ_{name.upper()}={path!r}: no such file")
        if not self.amqp_plain and not self.tls:
            raise ConfigError(
                "POLYMQ_AMQP_PLAIN=false (--amqp-port off) turns plain AMQP off, which leaves "
                "AMQP over TLS only: give a certificate too (--tls-cert/--tls-key)"
            )
        if not self.vhosts:
            raise ConfigError("POLYMQ_AMQP_VHOSTS must name at least one vhost (or '*')")
        _range("amqp_frame_max", self.amqp_frame_max, 4096, 64 * MIB)
        _range("amqp_channel_max", self.amqp_channel_max, 1, 65535)
        _range("amqp_heartbeat", self.amqp_heartbeat, 0, 65535)
        _range("amqp_max_prefetch", self.amqp_max_prefetch, 1, 1_000_000)
        _range("amqp_noack_window", self.amqp_noack_window, 1, 1_000_000)
        _range("amqp_max_consumers", self.amqp_max_consumers, 1, 1_000_000)
        _range("amqp_max_inflight", self.amqp_max_inflight, 1, 10_000_000)
        _range("amqp_write_buffer", self.amqp_write_buffer, 1 * KIB, 64 * 1024 * MIB)
        _range("amqp_max_tx_messages", self.amqp_max_tx_messages, 1, 10_000_000)
        _range("max_connections", self.max_connections, 0, 10_000_000)
        _range("max_connections_per_user", self.max_connections_per_user, 0, 10_000_000)
        _range("amqp_max_tx_bytes", self.amqp_max_tx_bytes, 1, 64 * 1024 * MIB)
        for name, low, high in (
            ("amqp_handshake_timeout", 0.1, 3600.0),
            ("amqp_close_timeout", 0.01, 600.0),
            ("amqp_get_visibility", 1.0, 43200.0),
            ("amqp_exclusive_ttl", 1.0, 86400.0 * 365),
            ("amqp_cache_ttl", 0.0, 3600.0),
        ):
            if not low <= getattr(self, name) <= high:
                raise ConfigError(f"POLYMQ_{name.upper()} must be {low}..{high} seconds")

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)

    @property
    def vhosts(self) -> frozenset[str]:
        return frozenset(v.strip() for v in self.amqp_vhosts.split(",") if v.strip())

    def vhost_allowed(self, vhost: str) -> bool:
        allowed = self.vhosts
        return "*" in allowed or vhost in allowed


def _range(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ConfigError(f"POLYMQ_{name.upper()} must be {low}..{high}")
