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

from polymq.config import ConfigError

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

    def check(self) -> None:
        for name in ("longpoll_port", "core_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ConfigError(f"POLYMQ_{name.upper()} must be 0..65535 (0 picks a free port)")
        if self.core_port == 0:
            raise ConfigError("POLYMQ_CORE_PORT must name the core's port, not 0")
        if not self.core_host:
            raise ConfigError("POLYMQ_CORE_HOST must not be empty")
        if self.auth not in ("", "anonymous") and not (
            self.auth.startswith("file:") and len(self.auth) > 5
        ):
            raise ConfigError("POLYMQ_AUTH must be 'anonymous' or 'file:/path/users.json'")
        if self.core_password is not None and not self.core_user:
            raise ConfigError("POLYMQ_CORE_PASSWORD is set but POLYMQ_CORE_USER is not")
        self.cors_origins()  # raises on a malformed list
        _range("longpoll_max_wait", self.longpoll_max_wait, 0, 3600, "seconds")
        _range("longpoll_max_poll", self.longpoll_max_poll, 1, 100_000)
        _range("longpoll_prefetch", self.longpoll_prefetch, 1, self.longpoll_max_poll)
        _range("longpoll_max_ttl", self.longpoll_max_ttl, 1, 86400, "seconds")
        _range("longpoll_ttl", self.longpoll_ttl, 1, self.longpoll_max_ttl, "seconds")
        _range("longpoll_max_buffer", self.longpoll_max_buffer, 1, 1_000_000)
        _range("longpoll_buffer", self.longpoll_buffer, 1, self.longpoll_max_buffer)
        _range("longpoll_keepalive", self.longpoll_keepalive, 0.1, 60, "seconds")
        _range("longpoll_sse_grace", self.longpoll_sse_grace, 0, 10, "seconds")
        _range("longpoll_max_body", self.longpoll_max_body, 1024, 1024 * MIB, "bytes")
        _range("longpoll_max_batch", self.longpoll_max_batch, 1, 100_000)

    @property
    def anonymous(self) -> bool:
        return self.auth in ("", "anonymous")

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


def _range(name: str, value: float, low: float, high: float, unit: str = "") -> None:
    if not low <= value <= high:
        suffix = f" {unit}" if unit else ""
        raise ConfigError(f"POLYMQ_{name.upper()} must be {low:g}..{high:g}{suffix}")
