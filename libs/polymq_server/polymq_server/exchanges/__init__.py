"""AMQP's exchanges, which the STOMP frontend's ``/exchange/`` destinations share: the
exchange types and how each routes (``kinds.py``), the records of exchanges and bindings in the
core's key/value store (``records.py``) and where a publish to an exchange goes
(``resolution.py``). It may import ``link`` (records are read through the core link),
``messages`` and the top-level ``names``; only the frontends import it."""
