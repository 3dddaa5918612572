"""The HTTP frontend's settings: ``POLYMQ_*`` environment variables, overridden by CLI flags."""

from __future__ import annotations

from dataclasses import dataclass

from polymq_server.config import ConfigError, check_access, check_addresses, check_range, check_tls

MIB = 1024 * 1024


@dataclass(frozen=True)
class HttpSettings:
    host: str = "127.0.0.1"
    http_port: int = 7480
    core_host: str = "127.0.0.1"
    core_port: int = 7400
    auth: str = "anonymous"  # 'anonymous' or 'file:/path/users.json'
    max_body: int = 16 * MIB  # bytes of one request body (aiohttp's client_max_size)
    max_batch: int = 1000  # messages in one publish, receipts in one ack / nack
    max_pull: int = 1000  # messages in one pull; at most the core's max_pull
    max_wait: float = 30.0  # seconds a pull may wait for messages; at most the core's
    core_user: str | None = None  # credentials of this frontend at the core
    core_password: str | None = None
    core_token: str | None = None  # a bearer token at the core (`polymq run` makes one)
    # TLS to the core (its wire port with --core-tls-cert): verified against the system's
    # CAs, or against this PEM CA bundle (which turns it on by itself)
    core_tls: bool = False
    core_tls_ca: str | None = None
    tls_cert: str | None = None  # PEM certificate (chain): the listener speaks HTTPS only
    tls_key: str | None = None  # its PEM private key
    handshake_timeout: float = 10.0  # seconds for a request's headers, then between body bytes
    # connections the listener takes at once (0: the room the open-files limit leaves)
    max_connections: int = 0

    def check(self) -> None:
        check_addresses(self, "http_port")
        check_tls(self)
        check_range("handshake_timeout", self.handshake_timeout, 0.1, 3600, "seconds")
        check_range("max_connections", self.max_connections, 0, 10_000_000)
        if not 1024 <= self.max_body <= 1024 * MIB:
            raise ConfigError("POLYMQ_MAX_BODY must be 1024..1073741824 bytes")
        if not 1 <= self.max_batch <= 100_000:
            raise ConfigError("POLYMQ_MAX_BATCH must be 1..100000")
        if not 1 <= self.max_pull <= 100_000:
            raise ConfigError("POLYMQ_MAX_PULL must be 1..100000 (and at most the core's)")
        if not 0 <= self.max_wait <= 3600:
            raise ConfigError("POLYMQ_MAX_WAIT must be 0..3600 seconds (and at most the core's)")
        check_access(self)
