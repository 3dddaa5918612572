"""What the request handlers share (polymq_core.handlers.context): the shard of a key, the
check of a destination a request names (kept per session once allowed), and the key of a
channel member's inbox."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from polymq.errors import BadRequest, Forbidden
from polymq.types import Kind
from polymq_core.config import CoreSettings
from polymq_core.handlers.context import KNOWN_DESTINATIONS, HandlerContext
from polymq_core.metrics import Sensors
from polymq_server.auth.provider import AnonymousProvider, Grant, Permission, Principal

READER = Principal("r", anonymous=False, grants=(Grant("queue/*", frozenset({Permission.READ})),))


def context(tmp_path: Path, shards: int = 8) -> HandlerContext:
    settings = CoreSettings(data_dir=tmp_path, shards=shards)
    # (the shards are the broker's; which one a key names is all that is asked here)
    held: list[Any] = [SimpleNamespace(index=i) for i in range(shards)]
    return HandlerContext(settings, Sensors(CollectorRegistry()), AnonymousProvider(), held, None)


def caller(principal: Principal | None = None) -> Any:
    return SimpleNamespace(principal=principal, destinations={})


def test_a_key_and_its_channel_inboxes_have_one_shard(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    names = [f"queue/q{i}" for i in range(64)]
    assert len({ctx.shard_for(n).index for n in names}) > 1  # (spread, not all on one)
    assert all(ctx.shard_for(n) is ctx.shard_for(n) for n in names)
    channel = ctx.shard_for("channel/c")
    assert ctx.shard_for("channel/c>client") is channel is ctx.shard_for("channel/c>server")


def test_a_destination_once_allowed_is_kept_for_the_session(tmp_path: Path) -> None:
    ctx, session = context(tmp_path), caller(READER)
    dest = ctx.destination(session, "queue/q", Permission.READ)
    assert (dest.kind, dest.name) == (Kind.QUEUE, "q")
    assert ctx.destination(session, "queue/q", Permission.READ) is dest
    with pytest.raises(Forbidden):  # (kept by permission: READ does not allow WRITE)
        ctx.destination(session, "queue/q", Permission.WRITE)
    with pytest.raises(Forbidden):  # a refusal is not kept: asked again, refused again
        ctx.destination(session, "topic/t", Permission.READ)
    with pytest.raises(Forbidden):
        ctx.destination(session, "topic/t", Permission.READ)
    assert list(session.destinations) == [("queue/q", Permission.READ, False)]


def test_a_session_keeps_a_bounded_number_of_destinations(tmp_path: Path) -> None:
    ctx, session = context(tmp_path), caller()
    for i in range(KNOWN_DESTINATIONS):
        ctx.destination(session, f"queue/q{i}", Permission.WRITE)
    assert len(session.destinations) == KNOWN_DESTINATIONS
    ctx.destination(session, "queue/one-more", Permission.WRITE)
    assert len(session.destinations) == 1  # (forgotten at once, then kept again)


def test_patterns_are_checked_and_only_where_asked(tmp_path: Path) -> None:
    ctx, session = context(tmp_path), caller()
    assert ctx.destination(session, "topic/a.*", Permission.READ, pattern=True).is_pattern
    with pytest.raises(BadRequest):
        ctx.destination(session, "topic/a.#.#x", Permission.READ, pattern=True)
    with pytest.raises(BadRequest):
        ctx.destination(session, 7, Permission.READ)  # (not a string: never kept)
    assert ("topic/a.*", Permission.READ, True) in session.destinations


def test_the_holder_of_a_channel_is_the_inbox_of_a_role(tmp_path: Path) -> None:
    ctx, session = context(tmp_path), caller()
    channel = ctx.destination(session, "channel/c", Permission.READ)
    assert ctx.holder_key(channel, "client") == "channel/c>client"
    assert ctx.holder_key(ctx.destination(session, "queue/q", Permission.READ), None) == "queue/q"
    with pytest.raises(BadRequest, match="role must be a string"):
        ctx.holder_key(channel, 1)
