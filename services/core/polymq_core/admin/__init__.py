"""The operator's side of the core: its admin HTTP (``app.py``: metrics, health, cluster), the
operator's API and its OpenAPI document (``api.py``, ``openapi.py``), who may use them
(``auth.py``), the API's own link to its core (``link.py``), the overview and the console with its
static files (``overview.py``, ``console.py``, ``static/``). It may import everything below it,
``cluster`` included (the snapshot header); only ``service`` imports it."""
