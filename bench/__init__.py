"""polymq benchmarks: ``python -m bench --out bench-results.json`` (what ``make bench`` runs).

Each scenario starts its own fresh ``polymq core`` (or ``polymq run``) process with a temporary
data directory, drives it from separate load-generator processes (so the client's Python does
not share the core's GIL; on a machine with 2+ CPUs the core is pinned to CPU 0 and the load
generators to the others), and records one entry in the JSON document::

    {"machine": {...}, "timestamp": "...", "scenarios": [
        {"name", "target", "unit", "value", "ratio_to_target", "params", "notes", ...}, ...]}

A scenario that fails records its error and the run goes on. Modules:

``runner``    the command line, the scenario registry and the JSON document
``scenario``  what a scenario is given (``Context``) and gives back (``Result``)
``harness``   the broker process under test, load-generator processes, machine facts
``native``    scenarios over the native wire protocol (``polymq.Client``)
``backlog``   a persistent backlog past the queue window: RSS, restart, drain vs in memory
``backlog_rabbit``  the same on a private RabbitMQ node (aio-pika, classic queue v2)
``flow``      ``fast_producer``: a producer 10x its consumer, held by the memory alarm
``http``      the JSON over HTTP frontend (``polymq run``, aiohttp)
``rabbitmq``  an optional comparison against a local RabbitMQ (aio-pika)
``stomp``     STOMP scenarios: polymq's STOMP frontend vs RabbitMQ's STOMP plugin
``stomp_targets``  the two STOMP brokers (a fresh ``polymq run``; the local RabbitMQ)
``stomp_load``     the asyncio STOMP load generator's workers
``stomp_wire``     its hand-built frames, scanning reader, TCP and WebSocket links
``stomp_relay``    a do-nothing STOMP relay: the load generator's own ceiling
``avro``      the Avro frontend: raw container ingest, then Spark's format("polymq")
``amqp``      AMQP publish / confirm / consume-ack, polymq vs RabbitMQ, with aio-pika and pamqp
``amqp_wire``     the pamqp load generator (frames over raw asyncio, faster than the brokers)
``amqp_load``     its worker processes, one per client and broker
``amqp_targets``  the two brokers under test
``_profile``  a ``sitecustomize`` that runs the broker under cProfile for ``--profile DIR``

Numbers depend on the machine being otherwise idle: each entry records how much CPU other
processes used meanwhile (``other_cpu_share``), and ``--settle S`` waits for quiet first.
"""

from __future__ import annotations
