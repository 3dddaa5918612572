"""The OpenAPI 3.1 document of the Avro API, served at ``/openapi.json``, with the running
service's own limits written in."""

from __future__ import annotations

from typing import Any

import polymq

from .compat import Compatibility
from .config import AvroSettings
from .payloads import ACCEPTED_TYPES, CONTAINER_TYPES, JSON_TYPE

_PROBLEM = {"$ref": "#/components/responses/Problem"}


def _path_param(name: str, description: str, pattern: str | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    if pattern is not None:
        schema["pattern"] = pattern
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": schema,
        "description": description,
    }


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": schema, "description": description}


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {JSON_TYPE: {"schema": schema}}}


def document(settings: AvroSettings) -> dict[str, Any]:
    name = _path_param("name", "destination name", r"^[A-Za-z0-9_.:\-]+$")
    subject = _path_param("subject", "subject name", r"^[A-Za-z0-9_.:\-]{1,255}$")
    avro_body = {t: {"schema": {"type": "string", "format": "binary"}} for t in ACCEPTED_TYPES}
    container = {t: {"schema": {"type": "string", "format": "binary"}} for t in CONTAINER_TYPES}
    max_ = _query(
        "max",
        {"type": "integer", "minimum": 1, "maximum": settings.avro_max_pull},
        "records to read at most (the queue's default 1, the stream's 100)",
    )
    wait = _query(
        "wait",
        {"type": "number", "minimum": 0, "maximum": settings.avro_max_wait},
        "seconds to wait for a first record",
    )
    schema_body = {
        "required": True,
        "content": {
            JSON_TYPE: {
                "schema": {
                    "type": "object",
                    "required": ["schema"],
                    "properties": {"schema": {"description": "JSON text, or the schema"}},
                }
            }
        },
    }
    read_answers = {
        "200": {
            "description": "an Avro object container (receipts in its metadata "
            "polymq.receipts, or the next offset in polymq.next) or JSON",
            "content": {
                **container,
                JSON_TYPE: {"schema": {"$ref": "#/components/schemas/Records"}},
            },
        },
        "204": {"description": "no records (within wait)"},
        "406": _PROBLEM,
        "default": _PROBLEM,
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "polymq Avro over HTTP",
            "version": polymq.__version__,
            "description": "Avro records in and out of polymq queues, topics and streams, "
            "one message per record in Avro's single-object encoding, and a schema registry.",
        },
        "paths": {
            "/v1/{kind}/{name}/records": {
                "post": {
                    "summary": "Publish an object container or single-object records, "
                    "atomically (all or none)",
                    "parameters": [
                        _path_param("kind", "queue, topic or stream", "^(queue|topic|stream)$"),
                        name,
                        _query("persistent", {"type": "boolean"}, "store the messages durably"),
                        _query("priority", {"type": "integer", "minimum": 0, "maximum": 9}, ""),
                        _query("ttl", {"type": "number", "exclusiveMinimum": 0}, "seconds"),
                        _query(
                            "subject",
                            {"type": "string"},
                            "register the schema under it; a single-object record's schema "
                            "is found among its versions",
                        ),
                        _query(
                            "schema_id",
                            {"type": "string", "pattern": "^[0-9a-f]{64}(,[0-9a-f]{64}){0,15}$"},
                            "the ids of the schemas of single-object records, separated by "
                            "commas (a fingerprint may be shared by schemas that differ in "
                            "logical types: without this or subject, a record's fingerprint "
                            "must be that of one registered schema alone, else 409)",
                        ),
                        {
                            "name": "Idempotency-Key",
                            "in": "header",
                            "schema": {"type": "string", "maxLength": 200},
                            "description": "a retry with the same key and records publishes "
                            f"nothing for {settings.avro_idempotency_window:g} seconds",
                        },
                    ],
                    "requestBody": {"required": True, "content": avro_body},
                    "responses": {
                        "200": _json({"$ref": "#/components/schemas/Published"}),
                        "409": _PROBLEM,
                        "413": _PROBLEM,
                        "415": _PROBLEM,
                        "422": _PROBLEM,
                        "default": _PROBLEM,
                    },
                }
            },
            "/v1/queue/{name}/records": {
                "get": {
                    "summary": "Lease records from a queue (settle with /v1/ack, /v1/nack)",
                    "parameters": [
                        name,
                        max_,
                        wait,
                        _query("visibility", {"type": "number"}, "seconds a lease lasts"),
                    ],
                    "responses": read_answers,
                }
            },
            "/v1/stream/{name}/records": {
                "get": {
                    "summary": "Read a stream from an offset",
                    "parameters": [
                        name,
                        _query(
                            "offset",
                            {"type": "string"},
                            "first (default), last, next, a sequence number, or a time "
                            "(1700000000.0, @1700000000 or ISO 8601)",
                        ),
                        max_,
                        wait,
                    ],
                    "responses": read_answers,
                }
            },
            "/v1/ack": {"post": _settle("Acknowledge leased records")},
            "/v1/nack": {"post": _settle("Give leased records back (or reject them)")},
            "/v1/schemas/subjects": {
                "get": {"responses": {"200": _json({"type": "array", "items": {"type": "string"}})}}
            },
            "/v1/schemas/subjects/{subject}/versions": {
                "post": {
                    "summary": "Register a schema under a subject",
                    "parameters": [subject],
                    "requestBody": schema_body,
                    "responses": {
                        "200": _json({"$ref": "#/components/schemas/Registered"}),
                        "409": _PROBLEM,
                        "422": _PROBLEM,
                        "default": _PROBLEM,
                    },
                },
                "get": {
                    "parameters": [subject],
                    "responses": {
                        "200": _json({"type": "array", "items": {"type": "integer"}}),
                        "404": _PROBLEM,
                    },
                },
            },
            "/v1/schemas/subjects/{subject}/versions/{version}": {
                "get": {
                    "parameters": [subject, _path_param("version", "a number or latest")],
                    "responses": {
                        "200": _json({"$ref": "#/components/schemas/Version"}),
                        "404": _PROBLEM,
                    },
                }
            },
            "/v1/schemas/ids/{id}": {
                "get": {
                    "parameters": [
                        _path_param(
                            "id",
                            "schema id (SHA-256 of its JSON, keys sorted), or the fingerprint "
                            "a schema stored before ids were digests is kept under",
                            "^([0-9a-f]{64}|[0-9a-f]{16})$",
                        )
                    ],
                    "responses": {
                        "200": _json({"$ref": "#/components/schemas/Schema"}),
                        "404": _PROBLEM,
                    },
                }
            },
            "/v1/schemas/compatibility/subjects/{subject}/versions/latest": {
                "post": {
                    "parameters": [subject],
                    "requestBody": schema_body,
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {
                                    "is_compatible": {"type": "boolean"},
                                    "messages": {"type": "array", "items": {"type": "string"}},
                                },
                            }
                        ),
                        "404": _PROBLEM,
                    },
                }
            },
            "/v1/schemas/config": {
                "get": {"responses": {"200": _json({"$ref": "#/components/schemas/Config"})}}
            },
            "/v1/schemas/config/{subject}": {
                "get": {
                    "parameters": [subject],
                    "responses": {"200": _json({"$ref": "#/components/schemas/Config"})},
                },
                "put": {
                    "parameters": [subject],
                    "requestBody": {
                        "required": True,
                        "content": {JSON_TYPE: {"schema": {"$ref": "#/components/schemas/Config"}}},
                    },
                    "responses": {"200": _json({"$ref": "#/components/schemas/Config"})},
                },
            },
            "/healthz": {"get": {"responses": {"200": {"description": "alive"}}}},
            "/readyz": {"get": {"responses": {"200": {"description": "ready"}, "503": _PROBLEM}}},
            "/metrics": {"get": {"responses": {"200": {"description": "Prometheus metrics"}}}},
        },
        "components": {
            "responses": {
                "Problem": {
                    "description": "RFC 9457 problem details",
                    "content": {"application/problem+json": {"schema": {"type": "object"}}},
                }
            },
            "schemas": {
                "Published": {
                    "type": "object",
                    "properties": {
                        "count": {"type": "integer"},
                        "schema_id": {"type": ["string", "null"]},
                        "ids": {"type": "array", "items": {"type": "string"}},
                        "seqs": {"type": "array", "items": {"type": "integer"}},
                        "subscribers": {"type": "integer"},
                        "duplicate": {"type": "boolean"},
                    },
                },
                "Records": {
                    "type": "object",
                    "properties": {
                        "records": {"type": "array", "items": {"type": "object"}},
                        "next": {"type": ["string", "null"]},
                    },
                },
                "Registered": {
                    "type": "object",
                    "properties": {"id": {"type": "string"}, "version": {"type": "integer"}},
                },
                "Version": {
                    "type": "object",
                    "properties": {
                        "subject": {"type": "string"},
                        "version": {"type": "integer"},
                        "id": {"type": "string"},
                        "schema": {"type": "string"},
                    },
                },
                "Schema": {
                    "type": "object",
                    "properties": {"id": {"type": "string"}, "schema": {"type": "string"}},
                },
                "Config": {
                    "type": "object",
                    "required": ["compatibility"],
                    "properties": {
                        "compatibility": {"enum": [c.value for c in Compatibility]},
                    },
                },
            },
        },
    }


def _settle(summary: str) -> dict[str, Any]:
    return {
        "summary": summary,
        "requestBody": {
            "required": True,
            "content": {
                JSON_TYPE: {
                    "schema": {
                        "type": "object",
                        "required": ["receipts"],
                        "properties": {
                            "receipts": {"type": "array", "items": {"type": "string"}},
                            "requeue": {"type": "boolean"},
                        },
                    }
                }
            },
        },
        "responses": {"200": _json({"type": "object"}), "default": _PROBLEM},
    }
