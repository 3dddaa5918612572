"""Fixtures of every integration test: see tests/hashcost.py."""

from __future__ import annotations

from ..hashcost import cheap_password_hashes

__all__ = ["cheap_password_hashes"]
