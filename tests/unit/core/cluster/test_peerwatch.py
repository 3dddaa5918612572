"""The peer watch (:mod:`polymq_core.cluster.peerwatch`): the sessions of peer links from a node
membership takes for unreachable are aborted (what they hold goes back to its queues);
those of reachable or leaving nodes, and every client's, are left alone."""

from __future__ import annotations

from polymq_core.cluster.membership import LEAVING, READY, UNKNOWN, UNREACHABLE
from polymq_core.cluster.peerwatch import PeerWatch, origin_of


class Sess:
    def __init__(self, client: str) -> None:
        self.client = client
        self.closed: tuple[str | None, str, bool] | None = None

    def close(self, code: str | None, message: str, *, abort: bool = False) -> None:
        self.closed = (code, message, abort)


def test_origin_of_a_peer_link_is_the_node_after_the_prefix() -> None:
    assert origin_of("peer/n2") == "n2"
    assert origin_of("peer/") is None
    assert origin_of("peer") is None
    assert origin_of("native") is None
    assert origin_of("stomp") is None


def test_only_peer_links_of_unreachable_nodes_are_aborted() -> None:
    states = {"hung": UNREACHABLE, "fine": READY, "going": LEAVING, "new": UNKNOWN}
    sessions = [
        Sess("peer/hung"),
        Sess("peer/hung"),
        Sess("peer/fine"),
        Sess("peer/going"),
        Sess("peer/new"),
        Sess("native"),
        Sess("http"),
    ]
    watch = PeerWatch(lambda: sessions, lambda node: states.get(node, UNKNOWN), 1.0)
    assert watch.sweep() == ["hung", "hung"]
    for s in sessions[:2]:
        assert s.closed is not None
        code, message, abort = s.closed
        assert (code, abort) == ("unavailable", True) and "node hung is unreachable" in message
    assert all(s.closed is None for s in sessions[2:])
    states["hung"] = READY  # (it came back: nothing more to close)
    assert watch.sweep() == []
