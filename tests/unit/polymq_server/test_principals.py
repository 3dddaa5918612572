"""Tests for polymq_server.auth.principals: the names polymq keeps for itself (``system.*``,
direct reply-to channels) whatever a grant says, and a message's reply-to authorized as a
write (polymq_server.names.reserved, reply_target)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polymq.errors import Forbidden
from polymq.types import Message
from polymq_server.auth.provider import (
    ALL_PERMISSIONS,
    INTERNAL_PRINCIPAL,
    AnonymousProvider,
    AuthProvider,
    FileProvider,
    Grant,
    Permission,
    Principal,
    WithServiceToken,
    hash_token,
)
from polymq_server.names import reply_target, reserved

EVERYTHING = [{"pattern": "*", "permissions": ["read", "write", "configure"]}]
TOPICS = [{"pattern": "topic/*", "permissions": ["read", "write", "configure"]}]
SERVICE_TOKEN = "s" * 40

RESERVED = [
    "topic/system.config",
    "topic/system.connections.close",
    "topic/system",
    "topic/system.#",
    "topic/system.*",
    "topic/system*",
    "topic/system.con*",
    "queue/system.jobs",
    "stream/system.log",
    "channel/system.rpc",
    "topic/amqp-reply.tok3n",
    "topic/amqp-reply.#",
]
ORDINARY = ["topic/#", "topic/*.#", "topic/sys*", "topic/systems.a", "queue/my.system", "kv/x"]


@pytest.mark.parametrize("destination", RESERVED)
def test_reserved_names(destination: str) -> None:
    assert reserved(destination) is not None


@pytest.mark.parametrize("destination", ORDINARY)
def test_ordinary_names(destination: str) -> None:
    assert reserved(destination) is None


@pytest.fixture
def provider(tmp_path: Path) -> AuthProvider:
    users = {
        "everything": {"grants": EVERYTHING},
        "topics": {"grants": TOPICS},
        "admin": {"grants": EVERYTHING, "tags": ["administrator"]},
        "watcher": {"grants": EVERYTHING, "tags": ["monitoring"]},
    }
    tokens = {hash_token(f"{name}-token-0123456789"): {"user": name} for name in users}
    path = tmp_path / "users.json"
    path.write_text(json.dumps({"users": users, "tokens": tokens}))
    return WithServiceToken(FileProvider(str(path)), SERVICE_TOKEN)


async def login(provider: AuthProvider, name: str) -> Principal:
    return await provider.authenticate_token(f"{name}-token-0123456789")


@pytest.mark.parametrize("name", ["everything", "topics", "watcher"])
@pytest.mark.parametrize("destination", RESERVED)
async def test_no_grant_reaches_a_reserved_name(
    provider: AuthProvider, name: str, destination: str
) -> None:
    user = await login(provider, name)
    for permission in ALL_PERMISSIONS:
        if permission is Permission.WRITE and destination == "topic/amqp-reply.tok3n":
            continue  # (a reply: the next test)
        granted = user.allows(permission, destination)  # (else refused as ever)
        with pytest.raises(Forbidden, match="reserved for polymq's own use" if granted else None):
            provider.authorize(user, permission, destination)


async def test_a_reply_to_one_direct_reply_to_channel_is_written_by_grant(
    provider: AuthProvider,
) -> None:
    topics = await login(provider, "topics")
    provider.authorize(topics, Permission.WRITE, "topic/amqp-reply.tok3n")
    with pytest.raises(Forbidden, match="reserved"):
        provider.authorize(topics, Permission.READ, "topic/amqp-reply.tok3n")


@pytest.mark.parametrize("destination", RESERVED)
async def test_polymq_and_administrators_use_reserved_names(
    provider: AuthProvider, destination: str
) -> None:
    internal = await provider.authenticate_token(SERVICE_TOKEN)
    admin = await login(provider, "admin")
    assert internal.name == INTERNAL_PRINCIPAL
    for who in (internal, admin):
        for permission in ALL_PERMISSIONS:
            provider.authorize(who, permission, destination)


async def test_ordinary_patterns_stay_open(provider: AuthProvider) -> None:
    topics = await login(provider, "topics")
    for destination in ORDINARY[:4]:
        provider.authorize(topics, Permission.READ, destination)


async def test_anonymous_mode_reads_system_but_sends_no_control_message() -> None:
    """A frontend run apart logs in anonymous: it still hears reloads and connection
    requests and answers them; nobody anonymous publishes a control message."""
    provider = WithServiceToken(AnonymousProvider(), SERVICE_TOKEN)
    for who in (await provider.anonymous(), await provider.authenticate_password("u", "")):
        provider.authorize(who, Permission.READ, "topic/system.config")
        provider.authorize(who, Permission.READ, "topic/system.#")
        provider.authorize(who, Permission.WRITE, "topic/system.connections.reply.ab12")
        for topic in ("system.config", "system.connections.close", "system.connections.list"):
            with pytest.raises(Forbidden, match="reserved"):
                provider.authorize(who, Permission.WRITE, f"topic/{topic}")
        with pytest.raises(Forbidden, match="reserved"):
            provider.authorize(who, Permission.READ, "topic/amqp-reply.#")
    internal = await provider.authenticate_token(SERVICE_TOKEN)
    provider.authorize(internal, Permission.WRITE, "topic/system.config")


async def test_a_reply_to_is_authorized_as_a_write(provider: AuthProvider) -> None:
    topics = await login(provider, "topics")
    provider.authorize_replies(topics, [Message(b"", reply_to="topic/answers")])
    provider.authorize_replies(topics, [Message(b"", reply_to="not a destination")])
    for reply in ("queue/theirs", "topic/system.connections.list"):
        with pytest.raises(Forbidden):
            provider.authorize_replies(topics, [Message(b""), Message(b"", reply_to=reply)])
    admin = await login(provider, "admin")
    provider.authorize_replies(admin, [Message(b"", reply_to="queue/theirs")])
    assert reply_target("queue/x") == "queue/x" and reply_target("/temp-queue/x") is None
    assert reply_target(None) is None


def test_a_principal_without_tags_is_not_trusted_by_its_name() -> None:
    """A users file's user named like polymq's own links gets nothing of theirs."""
    impostor = Principal(INTERNAL_PRINCIPAL, False, (Grant("*", ALL_PERMISSIONS),))
    with pytest.raises(Forbidden, match="reserved"):
        AnonymousProvider().authorize(impostor, Permission.WRITE, "topic/system.config")


@pytest.mark.parametrize(
    ("grants", "pattern", "allowed"),
    [
        (["topic/news.*"], "topic/news.*", True),
        (["topic/news.*"], "topic/news.*.eu", True),
        (["topic/news.*"], "topic/news.*.#", True),
        (["topic/news.*"], "topic/news.#", False),  # '#' matches no word: topic/news itself
        (["topic/news.*", "topic/news"], "topic/news.#", True),
        (["topic/*"], "topic/#", True),
        (["topic/a.*.b"], "topic/a.#.b", False),  # topic/a.b
        (["topic/a.*b"], "topic/a.#.b", True),  # topic/a.b and topic/a.x.y.b alike
        # only a grant's '*' stands for a pattern's wildcard: '?', sets and a literal
        # '#' name one character (found by fuzzing: 'topic/d.?' let 'topic/d.*' hear
        # topic/d.secret)
        (["topic/d.?"], "topic/d.*", False),
        (["topic/d.[*]"], "topic/d.*", False),
        (["topic/[!x]*"], "topic/*", False),
        (["topic/[!x]*"], "topic/a*", True),
        (["topic/#"], "topic/#", False),
        (["*"], "topic/" + ".".join(["#"] * 9), False),  # past the shapes judged
        (["*"], "topic/" + ".".join(["#"] * 8), True),
    ],
)
def test_a_topic_pattern_is_allowed_only_if_every_topic_it_matches_is(
    grants: list[str], pattern: str, allowed: bool
) -> None:
    read = frozenset({Permission.READ})
    principal = Principal("u", False, tuple(Grant(g, read) for g in grants))
    assert principal.allows(Permission.READ, pattern) is allowed
    assert not principal.allows(Permission.WRITE, pattern)
