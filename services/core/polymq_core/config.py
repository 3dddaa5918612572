"""The core's settings: ``POLYMQ_*`` environment variables, overridden by CLI flags."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polymq.config import ConfigError


@dataclass(frozen=True)
class CoreSettings:
    host: str = "127.0.0.1"
    core_port: int = 7400
    admin_port: int = 7401
    data_dir: Path = Path("./polymq-data")
    shards: int = 4
    node_name: str = socket.gethostname()
    auth: str = "anonymous"  # 'anonymous' or 'file:/path/users.json'
    max_frame: int = 64 * 1024 * 1024
    max_body: int = 16 * 1024 * 1024
    max_subscriptions_per_connection: int = 100_000
    max_pull: int = 1000
    max_wait: float = 60.0
    batch_window: float = 900.0  # seconds a publish's batch id is remembered (idempotency)

    def check(self) -> None:
        if not 1 <= self.shards <= 1024:
            raise ConfigError("POLYMQ_SHARDS must be 1..1024")
        for name in ("core_port", "admin_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ConfigError(f"POLYMQ_{name.upper()} must be 0..65535 (0 picks a free port)")
        if not 0 < self.batch_window <= 7 * 86400:
            raise ConfigError("POLYMQ_BATCH_WINDOW must be 0 < seconds <= 604800 (a week)")
        if self.max_body > self.max_frame:
            raise ConfigError("POLYMQ_MAX_BODY cannot exceed POLYMQ_MAX_FRAME")

    def limits(self) -> dict[str, Any]:
        return {
            "max_frame": self.max_frame,
            "max_body": self.max_body,
            "max_pull": self.max_pull,
            "max_wait": self.max_wait,
        }
