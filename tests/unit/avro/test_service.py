"""The Avro app as built (no listener, no core): every route is documented, every metric
is named ``polymq_avro_*``."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry

from polymq_avro import api
from polymq_avro.config import AvroSettings
from polymq_avro.openapi import document
from polymq_avro.service import build_app


def test_every_route_is_in_the_openapi_document() -> None:
    settings = AvroSettings()
    app = build_app(settings, CollectorRegistry())
    doc = json.loads(app[api.OPENAPI])
    assert doc["openapi"].startswith("3.1")
    routes = {
        (r.method.lower(), r.resource.canonical)
        for r in app.router.routes()
        if r.resource is not None and r.method != "HEAD" and r.resource.canonical != "/openapi.json"
    }
    documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert routes - documented == set()


def test_limits_come_from_the_settings() -> None:
    doc = document(AvroSettings(avro_max_pull=7, avro_max_wait=2.5))
    params = {p["name"]: p for p in doc["paths"]["/v1/queue/{name}/records"]["get"]["parameters"]}
    assert params["max"]["schema"]["maximum"] == 7 and params["wait"]["schema"]["maximum"] == 2.5


def test_metric_names() -> None:
    registry = CollectorRegistry()
    build_app(AvroSettings(), registry)
    names = {m.name for m in registry.collect()}
    assert names and all(n.startswith("polymq_avro_") for n in names)
    for wanted in ("records", "bytes", "batches", "duplicate_records_suppressed",
                   "schema_operations", "request_duration_seconds"):  # fmt: skip
        assert f"polymq_avro_{wanted}" in names
