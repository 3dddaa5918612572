"""The long-polling frontend's settings: ``POLYMQ_*`` environment variables, overridden by
CLI flags.

Settings shared with the other frontends keep their plain names (``POLYMQ_HOST``,
``POLYMQ_CORE_HOST``, ``POLYMQ_AUTH``, ...); those of this frontend alone start with
``LONGPOLL_`` so that ``polymq run`` holds every service's settings in one environment
without clashes (``POLYMQ_LONGPOLL_MAX_WAIT`` is not the HTTP frontend's ``POLYMQ_MAX_WAIT``).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from polymq_server.config import ConfigError, check_frontend, check_range, check_tls

MIB = 1024 * 1024


@dataclass(frozen=True)
class LongpollSettings:
    host: str = "127.0.0.1"
    longpoll_port: int = 7490  # long polling, SSE, the JS client and the demo page (0 = any)
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
    # Origins that may call from a browser page served elsewhere: '*', 'none', or a comma-
    # separated list of 'scheme://host[:port]'. Unset: '*' in anonymous mode, else 'none'.
    longpoll_cors_origins: str = ""
    longpoll_max_wait: float = 30.0  # seconds one long poll may wait (a larger `wait` is a 400)
    longpoll_max_poll: int = 1000  # messages in one poll answer
    longpoll_prefetch: int = 100  # default messages per poll, and SSE's window of unacked leases
    longpoll_ttl: float = 300.0  # default seconds a subscription outlives its last poll
    longpoll_max_ttl: float = 86400.0  # the longest ttl a client may ask for (the core's limit)
    longpoll_buffer: int = 10_000  # default topic messages the core holds for a subscription
    longpoll_max_buffer: int = 100_000  # the largest buffer a client may ask for
    longpoll_keepalive: float = 15.0  # seconds between SSE keep-alive comments
    longpoll_sse_grace: float = 0.1  # seconds an SSE answer waits before it is confirmed (sse.py)
    longpoll_max_body: int = 16 * MIB  # bytes of one request body
    longpoll_max_batch: int = 1000  # messages in one publish, receipts in one ack / nack
    handshake_timeout: float = 10.0  # seconds for a request's headers, then between body bytes
    # connections the listener takes at once (0: the room the open-files limit leaves)
    max_connections: int = 0
    # the key of the subscription ids' MACs (subscriptions.ids_key), the same on every
    # replica; unset: derived from cluster_secret, else from the login at the core
    longpoll_secret: str = ""
    # POLYMQ_CLUSTER_SECRET, where the process has it (`polymq run` nodes of a replicated
    # core): only to derive the ids' key from, so that every node's frontend reads any id
    cluster_secret: str = ""

    def check(self) -> None:
        check_frontend(self, "longpoll_port")
        check_tls(self)
        check_range("handshake_timeout", self.handshake_timeout, 0.1, 3600, "seconds")
        check_range("max_connections", self.max_connections, 0, 10_000_000)
        self.cors_origins()  # raises on a malformed list
        check_range("longpoll_max_wait", self.longpoll_max_wait, 0, 3600, "seconds")
        check_range("longpoll_max_poll", self.longpoll_max_poll, 1, 100_000)
        check_range("longpoll_prefetch", self.longpoll_prefetch, 1, self.longpoll_max_poll)
        check_range("longpoll_max_ttl", self.longpoll_max_ttl, 1, 86400, "seconds")
        check_range("longpoll_ttl", self.longpoll_ttl, 1, self.longpoll_max_ttl, "seconds")
        check_range("longpoll_max_buffer", self.longpoll_max_buffer, 1, 1_000_000)
        check_range("longpoll_buffer", self.longpoll_buffer, 1, self.longpoll_max_buffer)
        check_range("longpoll_keepalive", self.longpoll_keepalive, 0.1, 60, "seconds")
        check_range("longpoll_sse_grace", self.longpoll_sse_grace, 0, 10, "seconds")
        check_range("longpoll_max_body", self.longpoll_max_body, 1024, 1024 * MIB, "bytes")
        check_range("longpoll_max_batch", self.longpoll_max_batch, 1, 100_000)
        if self.longpoll_secret and len(self.longpoll_secret) < 32:
            raise ConfigError(
                "POLYMQ_LONGPOLL_SECRET needs at least 32 characters (e.g. `openssl rand "
                "-hex 16`), the same on every replica"
            )

    @property
    def anonymous(self) -> bool:
        return self.auth in ("", "anonymous")

    @property
    def ids_material(self) -> str | None:
        """What the subscription ids' key is derived from: ``POLYMQ_LONGPOLL_SECRET``, else
        ``POLYMQ_CLUSTER_SECRET`` (every node of a replicated core has it), else this
        frontend's login at the core (what the replicas of a deployment share; in a
        single ``polymq run``, its one-off token: ids do not outlive the process), else
        None (an anonymous core)."""
        if self.longpoll_secret or self.cluster_secret:
            return self.longpoll_secret or self.cluster_secret
        if self.core_token:
            return self.core_token
        if self.core_password:
            return f"{self.core_user}\0{self.core_password}"
        return None

    def cors_origins(self) -> frozenset[str] | None:
        """The origins allowed cross-origin: None for any ('*'), an empty set for none."""
        raw = self.longpoll_cors_origins.strip()
        if not raw:
            return None if self.anonymous else frozenset()
        if raw == "*":
            return None
        if raw.lower() == "none":
            return frozenset()
        out = set()
        for item in raw.split(","):
            origin = item.strip().rstrip("/")
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.path:
                raise ConfigError(
                    f"POLYMQ_LONGPOLL_CORS_ORIGINS: {item.strip()[:80]!r} is not an origin "
                    "like https://app.example.com or http://127.0.0.1:8080 (or use '*' / 'none')"
                )
            out.add(origin.lower())
        return frozenset(out)
