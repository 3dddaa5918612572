"""Replication: a shard's store in cluster mode. The shard's stream in JetStream, the
replicated log's client (``jetstream.py``), and the store that proposes each write to it and applies
what the log holds (``replicatedstore.py``, a ``Store`` like SQLite's). Beside ``destinations``,
not above it: a shard does not know whether its store is replicated. It may import ``store`` and
the top-level ``config`` and ``metrics``; ``cluster`` above it drives it."""
