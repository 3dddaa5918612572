"""Whose permission a queue's dead letters ride on (``polymq_core.handlers.deadletters``): WRITE at
declare, the declarer recorded (a user's own login, or whom a trusted link names), and the
declarer's grant as the users file says now at each dead letter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polymq.errors import Forbidden
from polymq_core.handlers.deadletters import may_dead_letter, stamp
from polymq_server.auth.provider import (
    ALL_PERMISSIONS,
    INTERNAL_PRINCIPAL,
    AnonymousProvider,
    FileProvider,
    Grant,
    Permission,
    Principal,
)

GRANTS = (Grant("queue/a.*", ALL_PERMISSIONS),)
ALICE = Principal("alice", False, GRANTS)


def provider(tmp_path: Path, alice_writes_shared: bool) -> FileProvider:
    grants = [{"pattern": "queue/a.*", "permissions": ["read", "write", "configure"]}]
    if alice_writes_shared:
        grants.append({"pattern": "queue/shared", "permissions": ["write"]})
    users = {
        "users": {"alice": {"grants": grants}},
        "anonymous": {"grants": [{"pattern": "queue/pub.*", "permissions": ["write"]}]},
    }
    path = tmp_path / "users.json"
    path.write_text(json.dumps(users))
    return FileProvider(path)


def test_a_users_declare_needs_write_and_records_the_login(tmp_path: Path) -> None:
    auth = provider(tmp_path, alice_writes_shared=False)
    with pytest.raises(Forbidden):
        stamp(auth, ALICE, {"dead_letter": "queue/b.inbox"})
    options = {"dead_letter": "queue/a.dead", "dead_letter_by": "bob"}
    stamp(auth, ALICE, options)
    assert options["dead_letter_by"] == "alice"  # not whom it named
    anonymous = Principal("anonymous", True, (Grant("queue/pub.*", ALL_PERMISSIONS),))
    options = {"dead_letter": "queue/pub.dead"}
    stamp(auth, anonymous, options)
    assert options["dead_letter_by"] == ""
    untouched = {"durable": True}
    stamp(auth, ALICE, untouched)
    stamp(auth, None, {"dead_letter": "queue/b.inbox"})  # (anonymous mode: no principal)
    assert untouched == {"durable": True}


def test_a_trusted_link_names_whom_it_declares_for(tmp_path: Path) -> None:
    auth = provider(tmp_path, alice_writes_shared=False)
    internal = Principal(INTERNAL_PRINCIPAL, False, (Grant("*", ALL_PERMISSIONS),))
    options = {"dead_letter": "queue/b.inbox", "dead_letter_by": "alice"}
    stamp(auth, internal, options)
    assert options["dead_letter_by"] == "alice"
    admin = Principal("ops", False, (), frozenset({"administrator"}))
    stamp(auth, admin, options)
    assert options["dead_letter_by"] == "alice"
    with pytest.raises(Forbidden):  # naming nobody: its own grants
        stamp(auth, admin, {"dead_letter": "queue/b.inbox"})
    frontend = Principal("frontend", False, (Grant("*", ALL_PERMISSIONS),))  # the chart's
    options = {"dead_letter": "queue/b.inbox", "dead_letter_by": "carol"}
    stamp(auth, frontend, options)
    assert options["dead_letter_by"] == "carol"
    almost = Principal("almost", False, (Grant("*", frozenset({Permission.WRITE})),))
    stamp(auth, almost, options)  # only write on everything: a user like any other
    assert options["dead_letter_by"] == "almost"


def test_each_dead_letter_rechecks_the_declarers_grant(tmp_path: Path) -> None:
    auth = provider(tmp_path, alice_writes_shared=True)
    assert may_dead_letter(auth, "alice", "queue/shared", "queue/a.q")
    assert may_dead_letter(auth, "", "queue/pub.dead", "queue/pub.q")
    assert may_dead_letter(auth, None, "queue/anything", "queue/a.q")  # declared before
    auth = provider(tmp_path, alice_writes_shared=False)
    assert not may_dead_letter(auth, "alice", "queue/shared", "queue/a.q")
    assert not may_dead_letter(auth, "gone", "queue/a.dead", "queue/a.q")
    assert not may_dead_letter(auth, "", "queue/shared", "queue/pub.q")
    assert AnonymousProvider().may("anyone", Permission.WRITE, "queue/x")
