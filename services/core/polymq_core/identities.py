"""The names the core's own links give in ``Hello.client``: a peer link's and the admin API's.

A session that says one of them is polymq's own (its requests are never forwarded again; the
admin API's says whom it acts for); the handlers, the forwarding and the broker read these
names from here, the one module below all of them (a leaving node's hand-over links are peer
links too: :func:`polymq_core.forwarding.handover.is_handover`).
"""

from __future__ import annotations

__all__ = ["ADMIN_CLIENT", "PEER_CLIENT"]

PEER_CLIENT = "peer"  # the Hello.client of a peer link: its requests are never forwarded again
ADMIN_CLIENT = "polymq-admin"  # the Hello.client of the admin API's own link to its core
