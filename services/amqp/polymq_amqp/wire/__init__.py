"""AMQP 0-9-1 on the wire, sans-IO (as nats.py's ``protocol/`` and aiohttp's ``_websocket/``):
the codec (``codec.py``: bytes in, events out, and back) with its hot frames (``fastpath.py``),
the events it reads (``events.py``), the one table of connection and channel states
(``states.py``) and field tables (``tables.py``). No asyncio and no socket; it may import only
the frontend's exception tree (``errors.py``), and the session and its parts above use it."""
