"""polymq_server.reload: what a reload request may say, and applying one to this process (the
root logger's level, the users file re-read, the limits), newest only."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from polymq.errors import Unauthorized
from polymq_server.auth.provider import (
    AnonymousProvider,
    FileProvider,
    WithServiceToken,
    hash_password,
)
from polymq_server.reload import Reloader, ReloadError, new_change


@pytest.fixture
def root_level() -> Iterator[None]:
    level = logging.getLogger().level
    yield
    logging.getLogger().setLevel(level)


def users_file(path: Path, password: str) -> Path:
    grants = [{"pattern": "*", "permissions": ["read"]}]
    users = {"alice": {"password_hash": hash_password(password), "grants": grants}}
    path.write_text(json.dumps({"users": users}))
    return path


def test_a_request_becomes_a_versioned_change() -> None:
    change = new_change({"log_level": "debug", "users": True})
    assert change["log_level"] == "DEBUG" and change["users"] is True
    assert isinstance(change["version"], int) and change["version"] > 1_700_000_000 * 10**6
    assert change["version"] < 2**53  # exact in JSON readers that use doubles (a browser)
    assert set(new_change({})) == {"version"}
    assert new_change({"users": False}).get("users") is None


@pytest.mark.parametrize(
    "request_",
    [[], "DEBUG", {"log_level": "LOUD"}, {"log_level": 10}, {"users": "yes"}, {"other": 1}],
)
def test_what_is_not_a_reload_is_refused(request_: object) -> None:
    with pytest.raises(ReloadError):
        new_change(request_)


async def test_the_users_file_is_read_again_and_the_log_level_set(
    tmp_path: Path, root_level: None
) -> None:
    path = users_file(tmp_path / "users.json", "old")
    provider = FileProvider(path)
    reloader = Reloader(WithServiceToken(provider, "t" * 32))  # as a cluster node wraps it
    users_file(path, "new")
    assert (await provider.authenticate_password("alice", "old")).name == "alice"
    assert reloader.apply({"version": 5, "log_level": "ERROR", "users": True})
    assert logging.getLogger().level == logging.ERROR
    assert (await provider.authenticate_password("alice", "new")).name == "alice"
    with pytest.raises(Unauthorized):
        await provider.authenticate_password("alice", "old")
    # an older or repeated reload changes nothing
    assert not reloader.apply({"version": 5, "log_level": "DEBUG"})
    assert not reloader.apply({"version": 4, "log_level": "DEBUG"})
    assert logging.getLogger().level == logging.ERROR and reloader.version == 5
    # a users file that no longer reads keeps the users there were
    path.write_text("{not json")
    with pytest.raises(ReloadError, match="kept its old contents"):
        reloader.apply({"version": 6, "users": True})
    assert (await provider.authenticate_password("alice", "new")).name == "alice"


def test_the_users_hooks_run_after_a_users_reload_that_read_the_file(tmp_path: Path) -> None:
    path = users_file(tmp_path / "users.json", "pw")
    reloader = Reloader(FileProvider(path))
    told: list[str] = []
    reloader.users_hooks += [lambda: told.append("a"), lambda: told.append("b")]
    reloader.apply({"version": 1, "log_level": "INFO"})
    assert told == []  # (no users reload)
    reloader.apply({"version": 2, "users": True})
    assert told == ["a", "b"]
    path.write_text("{not json")  # the old users stay: the sessions have nothing to check
    with pytest.raises(ReloadError):
        reloader.apply({"version": 3, "users": True})
    assert told == ["a", "b"]


def test_users_cannot_be_reloaded_without_a_users_file() -> None:
    with pytest.raises(ReloadError, match="no users file"):
        Reloader(AnonymousProvider()).apply({"version": 1, "users": True})
    with pytest.raises(ReloadError, match="integer version"):
        Reloader(AnonymousProvider()).apply({"version": "1"})


def test_limits_are_checked_in_the_request() -> None:
    change = new_change({"limits": {"max_body": 1024, "max_wait": 2.5}})
    assert change["limits"] == {"max_body": 1024, "max_wait": 2.5}
    for bad in (
        {},
        [],
        {"max_frame": 10},  # not reloadable: the codecs of open connections hold it
        {"max_body": 0},
        {"max_body": "1024"},
        {"max_pull": True},
        {"max_pull": 1.5},
        {"max_wait": -1},
    ):
        with pytest.raises(ReloadError, match="limits"):
            new_change({"limits": bad})


def test_limits_go_to_the_hook_and_a_refusal_keeps_the_rest(root_level: None) -> None:
    seen: list[dict[str, object]] = []
    applied: list[int] = []

    def limits(new: dict[str, object]) -> None:
        if new.get("max_body") == 666:
            raise ReloadError("max_body cannot exceed max_frame")
        seen.append(new)

    reloader = Reloader(
        AnonymousProvider(), limits=limits, applied=lambda c: applied.append(c["version"])
    )
    assert reloader.apply({"version": 1, "limits": {"max_pull": 7}})
    assert seen == [{"max_pull": 7}] and applied == [1]
    with pytest.raises(ReloadError, match="limits kept: max_body cannot exceed"):
        reloader.apply({"version": 2, "limits": {"max_body": 666}, "log_level": "CRITICAL"})
    # the log level was applied, and the change still announced (frontends have their own part)
    assert logging.getLogger().level == logging.CRITICAL and applied == [1, 2]
    # a message whose limits are not limits is refused by the one who applies it, too
    with pytest.raises(ReloadError, match="limits"):
        reloader.apply({"version": 3, "limits": {"max_body": "big"}})
    assert seen == [{"max_pull": 7}]


def test_a_frontend_without_a_users_file_has_nothing_to_reload() -> None:
    frontend = Reloader(AnonymousProvider(), users_required=False, name="stomp")
    assert frontend.apply({"version": 1, "users": True, "limits": {"max_body": 5}})
    assert frontend.version == 1  # (limits are the core's: a frontend has no hook for them)


def test_a_version_from_no_real_request_is_refused(root_level: None) -> None:
    """A version far past this process's clock (9e18: no request made it) is refused, so
    that the real reloads after it are still applied."""
    frontend = Reloader(AnonymousProvider(), users_required=False, name="http")
    with pytest.raises(ReloadError, match="not a time of this era"):
        frontend.apply({"version": 9 * 10**18, "log_level": "CRITICAL"})
    assert frontend.version == 0 and logging.getLogger().level != logging.CRITICAL
    assert frontend.apply(new_change({"log_level": "INFO"}))
