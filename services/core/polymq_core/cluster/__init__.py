"""The cluster node: this node's part in a replicated core (docs/cluster.md). The node itself
(``node.py``) with who leads each shard (``leadership.py``; where the leads should go,
``balancer.py``, and the streams' replicas, ``replicas.py``) and the log's bounds and copies
(``retention.py``, ``snapshot.py``), membership, the Kubernetes endpoints, the NATS routes and the
``nats-server`` child (``natsroutes.py``, ``natsd.py``), TLS between nodes and the partition watch
(``isolation.py``). It may import the broker, ``reload`` and every layer below them (it wires
``replication`` under the shards); only ``admin`` and ``service`` import it."""
