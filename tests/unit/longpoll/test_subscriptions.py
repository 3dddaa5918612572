"""Subscription ids: signed, bound to their owner and destination; anything changed in one
is not an id of ours (404)."""

from __future__ import annotations

import pytest

from polymq.types import Destination
from polymq_longpoll.subscriptions import AckMode, SubscriptionRef, ids_key
from polymq_server.problems import Problem

KEY = ids_key("s" * 32, None)


def ref(owner: str = "alice") -> SubscriptionRef:
    return SubscriptionRef(
        "core-id", Destination.parse("queue/q"), AckMode.CLIENT, 10, 30.0, 300.0, owner
    )


def test_an_id_round_trips_with_its_owner() -> None:
    assert SubscriptionRef.decode(ref().encode(KEY), KEY) == ref()
    assert SubscriptionRef.decode(ref("").encode(KEY), KEY).owner == ""


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # the MAC
        lambda t: t[:5] + ("A" if t[5] != "A" else "B") + t[6:],  # the reference
        lambda t: t.partition(".")[0],  # unsigned, as ids were before
        lambda t: t + "x" * 5000,
    ],
)
def test_a_changed_id_is_not_ours(change: object) -> None:
    text = ref().encode(KEY)
    with pytest.raises(Problem) as refused:
        SubscriptionRef.decode(change(text), KEY)  # type: ignore[operator]
    assert refused.value.status == 404


def test_another_key_does_not_read_it() -> None:
    text = ref().encode(KEY)
    with pytest.raises(Problem):
        SubscriptionRef.decode(text, ids_key(None, "core-password"))
    # the key: the secret first, else the core login, else polymq's label alone
    assert ids_key("s" * 32, "login") == KEY
    assert ids_key(None, "login") != ids_key(None, None) != KEY
