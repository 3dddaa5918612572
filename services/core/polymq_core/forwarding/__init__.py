"""Forwarding: what goes to another node. A session's requests for a shard led elsewhere
(``relay.py``, over a ``peerlink.py``, found by the broker's routes), requests held while their
shard has no leader (``holding.py``), and a leaving node's hand-over of what only its memory holds
(``handover.py``). It may import ``handlers`` and everything below them; the session, the broker,
``cluster`` and ``admin`` use it."""
