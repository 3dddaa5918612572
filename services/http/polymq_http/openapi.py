"""The OpenAPI 3.1 document of the API, served at ``/openapi.json``.

The document is package data (``openapi.json``); the limits that come from the settings
(batch size, pull size, longest wait) and the version are written into it here, so that it
always states the running service's own limits. Each schema mirrors a check in
``polymq_server/web/payloads.py`` (a unit test compares the shared constants); schemathesis
holds the running service to this document in the integration tests.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import polymq

from .config import HttpSettings


@functools.cache
def _template() -> dict[str, Any]:
    text = Path(__file__).with_name("openapi.json").read_text("utf-8")
    doc: dict[str, Any] = json.loads(text)
    return doc


def _query_param(operation: dict[str, Any], name: str) -> dict[str, Any]:
    for p in operation["parameters"]:
        if p.get("in") == "query" and p["name"] == name:
            schema: dict[str, Any] = p["schema"]
            return schema
    raise KeyError(name)


def document(settings: HttpSettings) -> dict[str, Any]:
    doc = copy.deepcopy(_template())
    doc["info"]["version"] = polymq.__version__
    schemas = doc["components"]["schemas"]
    schemas["Batch"]["properties"]["messages"]["maxItems"] = settings.max_batch
    schemas["Receipts"]["properties"]["receipts"]["maxItems"] = settings.max_batch
    schemas["NackReceipts"]["properties"]["receipts"]["maxItems"] = settings.max_batch
    schemas["Pulled"]["properties"]["messages"]["maxItems"] = settings.max_pull
    pull = doc["paths"]["/v1/queue/{name}/pull"]["post"]
    _query_param(pull, "max")["maximum"] = settings.max_pull
    _query_param(pull, "wait")["maximum"] = settings.max_wait
    return doc
