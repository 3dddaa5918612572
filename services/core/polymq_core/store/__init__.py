"""The store: one shard's durable state. The ``Store`` contract (``contract.py``), its writes as
plain values (``writeencoder.py``) and as the replicated log's entries and errors (``logentry.py``,
sans-IO), the SQLite store with its schema and migrations (``sqlite.py``, ``schema.py``) and a
shard's file copied whole (``filecopy.py``). The bottom layer: it imports nothing of the core but
``config`` and ``metrics``; everything above may import it (the ``layers`` contract in
pyproject.toml)."""
