"""polymq_server.web.access: the requests held open (long polls, SSE streams) that a users
reload ends when it took their login or permission away."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from polymq.errors import Forbidden, Unauthorized
from polymq_server.auth.provider import FileProvider, Permission, hash_token
from polymq_server.web.access import Access, until_revoked

TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789"}


def write(path: Path, grants: dict[str, str]) -> Path:
    """Users with a token each and read on the pattern ``grants`` gives them."""
    users = {
        name: {"grants": [{"pattern": pattern, "permissions": ["read"]}]}
        for name, pattern in grants.items()
    }
    tokens = {hash_token(TOKENS[name]): {"user": name} for name in grants}
    path.write_text(json.dumps({"users": users, "tokens": tokens}))
    return path


async def test_a_reload_ends_the_held_requests_it_took_the_login_or_grant_of(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "users.json", {"alice": "queue/*", "bob": "queue/*"})
    provider = FileProvider(path)
    access = Access(provider)
    alice = await access.principal(f"Bearer {TOKENS['alice']}")
    bob = await access.principal(f"Bearer {TOKENS['bob']}")
    forever = asyncio.Event()
    with (
        access.held(alice, Permission.READ, "queue/a") as kept,
        access.held(alice, Permission.READ, "queue/b") as withdrawn,
        access.held(bob, Permission.READ, "queue/b") as removed,
    ):
        polls = [
            asyncio.ensure_future(until_revoked(forever.wait(), held))
            for held in (kept, withdrawn, removed)
        ]
        write(path, {"alice": "queue/a"})
        provider.reload()
        access.recheck()
        _, pending = await asyncio.wait(polls, timeout=1)
        assert pending == {polls[0]}
        with pytest.raises(Forbidden, match="withdrawn by a users reload"):
            polls[1].result()
        with pytest.raises(Unauthorized, match="user 'bob' was removed"):
            polls[2].result()
        forever.set()
        assert await polls[0] is True  # what it waited for came
    assert not access._held  # (each is let go with its request)


async def test_what_came_first_is_answered() -> None:
    async def answer() -> str:
        return "messages"

    revocation: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    assert await until_revoked(answer(), revocation) == "messages"
