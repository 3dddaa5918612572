"""Topics: which subscribers and which queues a topic publish reaches. The topic trie
(``trie.py``), bindings from a pattern to a queue (``bindings.py``), the mesh that carries topic
messages between the nodes of a cluster (``mesh.py``) and every shard's durable bindings as its log
has them (``durableroutes.py``). It may import ``store`` (the schema's write kinds) and the
top-level ``config`` and ``metrics``; ``destinations`` and everything above may import it."""
