"""What the TCP frontends (STOMP and AMQP) share for their sessions: the TCP/TLS adapter
between asyncio and a session (``transport.py``) and the metrics, service set-up and session
I/O glue (``frontend.py``). It may import ``web``, ``link`` and everything below them."""
