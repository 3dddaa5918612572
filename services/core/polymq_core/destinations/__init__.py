"""Destinations: the shard (the unit of ownership and storage) and what it holds. Queues and
their paging, streams, subscriptions, idempotent batches, peeking, and the shard's durable writes
(``shardwrites.py``, the one place a change leaves a shard for its ``Store``). It may import
``topics``, ``store`` and the top-level ``config`` and ``metrics``; never ``replication``, the
handlers or anything above them."""
