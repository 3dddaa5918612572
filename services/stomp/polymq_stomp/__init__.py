"""polymq's STOMP 1.0-1.2 frontend, over TCP and WebSocket (``polymq stomp``, also mounted by
``polymq run``).

It speaks STOMP outside (stomp.py, @stomp/stompjs, clients of RabbitMQ's STOMP plugin or of
ocamlmq) and the polymq wire protocol inside, through one shared :class:`polymq.Client` to the
core (:class:`polymq_server.link.corelink.CoreLink`).

Modules: ``frames`` (frame events, the error tree) and ``codec`` (sans-IO), ``transports``
(TCP and WebSocket adapters), ``session`` (one connection: reading, writing, CONNECT,
heart-beats, closing), ``publisher`` (SEND, control destinations, transactions),
``subscription`` (SUBSCRIBE, UNSUBSCRIBE, ACK, NACK, MESSAGE frames), ``destinations``
(STOMP and core names), ``messages`` (headers and core messages), ``refusal`` (the error
that refuses a frame), ``config``, ``metrics``, ``page`` (the browser page) and ``service``.

Every refusal becomes an ERROR frame (``message`` header, explaining body, ``receipt-id``
when the frame had a receipt), written and flushed before the connection closes::

    frames.RemoteStompError       the codec refused the bytes (reason "protocol")
     └── refusal.Refused          a handler refused the frame (its own reason)
    polymq.errors.RequestError    the core refused (forbidden, queue full, ...)
    polymq.errors.ConnectionClosed / Unavailable   the core is away ("unavailable")
"""
