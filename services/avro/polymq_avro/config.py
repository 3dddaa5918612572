"""The Avro frontend's settings: ``POLYMQ_*`` environment variables, overridden by CLI flags.

Settings shared with the other frontends keep their plain names (``POLYMQ_HOST``,
``POLYMQ_CORE_HOST``, ``POLYMQ_AUTH``, ...); those of this frontend alone start with
``AVRO_`` so that ``polymq run`` holds every service's settings in one environment without
clashes (``POLYMQ_AVRO_MAX_BODY`` is not the HTTP frontend's ``POLYMQ_MAX_BODY``).
"""

from __future__ import annotations

from dataclasses import dataclass

from polymq_server.config import ConfigError, check_frontend, check_range, check_tls

from .compat import Compatibility

MIB = 1024 * 1024


@dataclass(frozen=True)
class AvroSettings:
    host: str = "127.0.0.1"
    avro_port: int = 7470  # Avro over HTTP and the schema registry (0 = any)
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
    tls_cert: str | None = None  # PEM certificate (chain): the listener speaks HTTPS only
    tls_key: str | None = None  # its PEM private key
    handshake_timeout: float = 10.0  # seconds for a request's headers, then between body bytes
    # connections the listener takes at once (0: the room the open-files limit leaves)
    max_connections: int = 0
    # One POST is one atomic publish at the core, so these bound it: the request body, the
    # records in it, and their bytes once decompressed (also held under the core's frame).
    avro_max_body: int = 64 * MIB
    avro_max_records: int = 100_000
    avro_max_decoded: int = 64 * MIB
    avro_max_pull: int = 1000  # records in one read; at most the core's max_pull
    avro_max_wait: float = 30.0  # seconds a read may wait for records
    # seconds the core remembers an Idempotency-Key (a retry within it publishes nothing)
    avro_idempotency_window: float = 900.0
    avro_compatibility: str = "BACKWARD"  # the registry's rule for subjects without their own
    avro_schema_cache: int = 1024  # parsed schemas held in memory

    def check(self) -> None:
        check_frontend(self, "avro_port")
        check_tls(self)
        check_range("handshake_timeout", self.handshake_timeout, 0.1, 3600, "seconds")
        check_range("max_connections", self.max_connections, 0, 10_000_000)
        check_range("avro_max_body", self.avro_max_body, 1024, 1024 * MIB, "bytes")
        check_range("avro_max_records", self.avro_max_records, 1, 1_000_000)
        check_range("avro_max_decoded", self.avro_max_decoded, 1024, 1024 * MIB, "bytes")
        check_range("avro_max_pull", self.avro_max_pull, 1, 100_000)
        check_range("avro_max_wait", self.avro_max_wait, 0, 3600, "seconds")
        check_range(
            "avro_idempotency_window", self.avro_idempotency_window, 1, 7 * 86400, "seconds"
        )
        check_range("avro_schema_cache", self.avro_schema_cache, 1, 1_000_000)
        try:
            Compatibility(self.avro_compatibility.upper())
        except ValueError:
            names = ", ".join(c.value for c in Compatibility)
            raise ConfigError(f"POLYMQ_AVRO_COMPATIBILITY must be one of {names}") from None

    @property
    def compatibility(self) -> Compatibility:
        return Compatibility(self.avro_compatibility.upper())
