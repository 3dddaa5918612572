"""polymq's RabbitMQ bridge (``polymq bridge``): links that move messages between polymq and
an existing RabbitMQ, at least once, each way (aio-pika on the RabbitMQ side, the polymq
client on the core's). A service of its own: it imports no other service.

Modules: ``config`` (the links file and the settings), ``side`` (the two connections, each
made again with jittered backoff), ``link`` (a link's session life cycle), ``inbound``
(RabbitMQ queue -> polymq), ``outbound`` (polymq queue or stream -> a RabbitMQ exchange),
``props`` (message properties both ways), ``metrics``, ``service`` (the running bridge and
its admin HTTP) and ``main`` (the command line).
"""
