"""polymq's AMQP 0-9-1 frontend (``polymq amqp``, also mounted by ``polymq run``).

It speaks AMQP 0-9-1 outside (pika, aio-pika and the other clients of RabbitMQ) and the
polymq wire protocol inside, through one shared :class:`polymq.Client` to the core
(:class:`polymq_server.link.corelink.CoreLink`). Exchanges route through the core's topic bindings,
queues are core queues, and what AMQP declares that the core has no word for lives in the
core's key/value store (``topology.py``): the frontend keeps no state a restart would lose.

Modules: ``wire/`` (sans-IO: ``codec`` with its ``fastpath``, ``states`` (the one state
table), ``events`` and ``tables``) and ``errors`` (the exception tree, each error carrying
its reply code); AMQP names and exchanges are polymq_server's (``names``,
``exchanges/``: the STOMP frontend shares them); ``arguments`` (queue arguments),
``properties`` (messages both ways), ``topology`` (records of exchanges, queues and
bindings); ``hub`` (what connections share), ``session`` (one connection) with
``handshake`` (start, login, tune, open), ``channel`` (one channel: qos, acks, confirms,
transactions), ``declarations`` (exchange.* and queue.*), ``consumer`` (basic.consume,
basic.get, deliveries), ``publisher`` (basic.publish, returns, confirms); ``config``,
``metrics`` and ``service``. (The RabbitMQ bridge is a service of its own:
``services/bridge``.)
"""

__version__ = "0.1.0"
