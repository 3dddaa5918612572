"""HTTP: the shared base of the aiohttp frontends and the core's admin HTTP (``app.py``), the
listener that takes at most so many connections, the checks before a body is read
(``guards.py``), who a request is (``access.py``), RFC 9457 problem details (``problemdoc.py``,
the document alone; ``problems.py``, the aiohttp answers), aiohttp's server logger
(``serverlog.py``), request metrics, and the JSON frontends' bodies and receipts
(``payloads.py``, ``receipts.py``). It may import ``link``, ``auth``, ``messages`` and the
top-level modules; ``sessions`` builds on it."""
