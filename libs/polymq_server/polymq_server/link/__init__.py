"""A frontend's link to the core: the one reconnecting connection (``corelink.py``), the
client connections as the operator sees them and how the core asks each frontend for them
(``connections.py``), and their gauge (``connectiongauge.py``). It may import ``auth``,
``messages`` and the top-level modules; ``exchanges``, ``web`` and ``sessions`` build on it."""
