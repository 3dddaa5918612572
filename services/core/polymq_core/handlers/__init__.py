"""The request handlers: what the broker's routes call for each request of a session, and how
each finds the shard that serves a request (``routes.py``: the record of a request type).
Publishing, consuming (subscriptions, pulls, cursors), the catalog of destinations, key/value,
dead-letter permissions, what every handler is given (``context.py``: the shards, the topic
router, the destination check, ...), what a handler knows of its caller (``caller.py``) and
answers (``answers.py``), and a connection's subscriptions by id (``sids.py``). It may import
``destinations``, ``topics``, ``store`` and the top-level ``config``, ``metrics`` and
``identities``; never ``forwarding``, the session, the broker or anything above."""
