"""Announcements of ``polymq_core.cluster.membership`` without NATS: a node that leaves for good
says
``gone``, and the view keeps what it knew of it with that."""

from __future__ import annotations

from typing import Any

from polymq_core.cluster.membership import LEAVING, Membership, _peer_from


def test_a_leaving_announcement_says_whether_the_node_is_gone_for_good() -> None:
    assert _peer_from({"node_id": "a", "leaving": True}, 1.0).gone is False
    gone = _peer_from({"node_id": "a", "leaving": True, "gone": True}, 1.0)
    assert (gone.state, gone.gone) == (LEAVING, True)


def test_the_view_keeps_what_it_knew_of_a_node_gone_for_good() -> None:
    view = Membership(None, "b", dict)  # type: ignore[arg-type]
    seen: dict[str, Any] = {
        "node_id": "a",
        "addresses": {"core": "10.0.0.1:7400"},
        "applied": {"0": 41},
        "state": "ready",
    }
    view._record(seen)
    view._record({"node_id": "a", "leaving": True, "gone": True})
    peer = view.peers()["a"]
    assert (peer.state, peer.gone, peer.applied) == (LEAVING, True, {0: 41})
    assert view.state_of("a") == LEAVING
