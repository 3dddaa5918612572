"""The store: one shard's durable state. The ``Store`` contract (``contract.py``), its writes as
records (``writes.py``: one frozen dataclass per kind, encoded once to the tuple SQLite
applies) and as the replicated log's entries and errors (``logentry.py``,
sans-IO), the SQLite store with its schema and migrations (``sqlite.py``, ``schema.py``) and a
shard's file copied whole (``filecopy.py``). The bottom layer: it imports nothing of the core but
``config`` and ``metrics``; everything above may import it (the ``layers`` contract in
pyproject.toml)."""
