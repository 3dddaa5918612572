"""The OpenAPI 3.1 document of the admin API (``GET /api/openapi.json``), checked against the
running core with schemathesis (``tests/integration/core/test_admin_openapi.py``)."""

from __future__ import annotations

from typing import Any

from polymq.types import MAX_NAME_LENGTH, MAX_PRIORITY

from ..destinations.peek import MAX_PEEK

__all__ = ["DOCUMENT"]

_JSON = "application/json"
_PROBLEM = "application/problem+json"
# a destination name as the core takes it (polymq.types.validate_name), ASCII only here
_NAME = r"^[A-Za-z0-9_:\-]+(\.[A-Za-z0-9_:\-]+)*$"
_SORTS = ["name", "ready", "unacked", "consumers"]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _ok(schema: dict[str, Any], status: str = "200", what: str = "OK") -> dict[str, Any]:
    return {status: {"description": what, "content": {_JSON: {"schema": schema}}}}


def _problems(*statuses: int) -> dict[str, Any]:
    words = {
        400: "Bad request",
        401: "Login required (with --auth)",
        403: "The user's tags do not allow it, or a browser sent a write from another site",
        404: "Not found",
        409: "Not for this kind of destination",
        413: "Too large",
        415: "A write's body is not declared JSON (Content-Type: application/json)",
        429: "Too many failed logins from this address lately (Retry-After); or the queue is full",
        503: "The core is not ready",
    }
    return {
        str(s): {"description": words[s], "content": {_PROBLEM: {"schema": _ref("Problem")}}}
        for s in (401, 403, 429, 503, *statuses)
    }


def _op(summary: str, responses: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"summary": summary, "responses": responses, **more}


_DEST_PARAMS = [
    {
        "name": "kind",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "enum": ["queue", "topic", "stream", "channel"]},
    },
    {
        "name": "name",
        "in": "path",
        "required": True,
        "schema": {
            "type": "string",
            "pattern": _NAME,
            "minLength": 1,
            "maxLength": MAX_NAME_LENGTH,
        },
    },
]
_CONN_PARAM = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]
_NO_CONTENT = {"204": {"description": "Done"}}

_COUNT = {"type": "integer", "minimum": 0}
_RATE = {"type": "number", "minimum": 0}


def _numbers(schema: dict[str, Any], *names: str) -> dict[str, Any]:
    return {"type": "object", "required": list(names), "properties": dict.fromkeys(names, schema)}


_SCHEMAS: dict[str, Any] = {
    # the overview (polymq_core.admin.overview): a node now, and the samples of the last 10 minutes
    "Overview": {
        "type": "object",
        "required": [
            "node",
            "version",
            "uptime_seconds",
            "rates",
            "messages",
            "connections",
            "subscriptions",
            "memory",
            "disk",
            "alarms",
        ],
        "properties": {
            "node": {"type": "string"},
            "version": {"type": "string"},
            "uptime_seconds": {"type": "number", "minimum": 0},
            "rates": _numbers(_RATE, "publish", "deliver", "ack"),
            "messages": _numbers(_COUNT, "ready", "unacked"),
            "connections": {"type": "object", "additionalProperties": _COUNT},
            "subscriptions": {"type": "object", "additionalProperties": _COUNT},
            "memory": {
                **_numbers(_COUNT, "used_bytes", "limit_bytes"),
                "properties": dict.fromkeys(
                    ("used_bytes", "limit_bytes", "rises_at_bytes", "clears_at_bytes"), _COUNT
                ),
            },
            "disk": _numbers({"type": "integer", "minimum": -1}, "free_bytes", "limit_bytes"),
            "alarms": {"type": "array", "items": {"type": "string", "enum": ["memory", "disk"]}},
            "t": {"type": "number"},
        },
    },
    "Sample": {
        "type": "object",
        "required": ["t", "publish", "deliver", "ack", "ready", "unacked"],
        "properties": {
            "t": {"type": "number"},
            **dict.fromkeys(("publish", "deliver", "ack"), _RATE),
            **dict.fromkeys(("ready", "unacked"), _COUNT),
        },
    },
    "Problem": {
        "type": "object",
        "required": ["title", "status"],
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
        },
    },
    "Connection": {
        "type": "object",
        "required": [
            "id",
            "protocol",
            "peer",
            "subscriptions",
            "messages_in",
            "messages_out",
            "connected_at",
        ],
        "properties": {
            "id": {"type": "string"},
            "protocol": {
                "type": "string",
                "enum": ["stomp", "stomp-ws", "amqp", "http", "longpoll", "avro", "native"],
            },
            "frontend": {"type": "string"},
            "node": {"type": "string"},
            "peer": {"type": "string"},
            "user": {"type": ["string", "null"]},
            "vhost": {"type": "string"},
            "client": {"type": "string"},
            "subscriptions": {"type": "integer", "minimum": 0},
            "channels": {"type": "integer", "minimum": 0},
            "messages_in": {"type": "integer", "minimum": 0},
            "messages_out": {"type": "integer", "minimum": 0},
            "connected_at": {"type": "number"},
        },
    },
    "Destination": {
        "type": "object",
        "required": [
            "destination",
            "kind",
            "name",
            "durable",
            "ready",
            "unacked",
            "consumers",
            "publish_rate",
            "deliver_rate",
        ],
        "properties": {
            "destination": {"type": "string"},
            "kind": {"type": "string", "enum": ["queue", "topic", "stream", "channel"]},
            "name": {"type": "string"},
            "role": {"type": "string", "enum": ["server", "client"]},
            "durable": {"type": "boolean"},
            "ready": {"type": "integer", "minimum": 0},
            "unacked": {"type": "integer", "minimum": 0},
            "consumers": {"type": "integer", "minimum": 0},
            "paged": {"type": "integer", "minimum": 0},
            "in_memory": {"type": "boolean"},
            "publish_rate": {"type": "number", "minimum": 0},
            "deliver_rate": {"type": "number", "minimum": 0},
        },
    },
    "Message": {
        "type": "object",
        "required": [
            "id",
            "seq",
            "priority",
            "persistent",
            "content_type",
            "headers",
            "redelivered",
        ],
        "properties": {
            "id": {"type": "string"},
            "seq": {"type": "integer"},
            "priority": {"type": "integer", "minimum": 0, "maximum": MAX_PRIORITY},
            "persistent": {"type": "boolean"},
            "content_type": {"type": "string"},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "body": {"type": "string"},
            "body_base64": {"type": "string"},
            "redelivered": {"type": "boolean"},
            "timestamp": {"type": "number"},
        },
    },
    "Publish": {
        "type": "object",
        "additionalProperties": False,
        "oneOf": [{"required": ["body"]}, {"required": ["body_base64"]}],
        "properties": {
            "body": {"type": "string"},
            "body_base64": {
                "type": "string",
                "contentEncoding": "base64",
                "pattern": "^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$",
            },
            "content_type": {"type": "string", "maxLength": 255},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "priority": {"type": "integer", "minimum": 0, "maximum": MAX_PRIORITY},
            "persistent": {"type": "boolean"},
        },
    },
}

_ANY_OBJECT = {"type": "object"}

DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "polymq admin API",
        "version": "1",
        "description": "The operator's API on a core node's admin port (docs/admin-api.md).",
    },
    "components": {
        "schemas": _SCHEMAS,
        "securitySchemes": {
            "basic": {"type": "http", "scheme": "basic"},
            "bearer": {"type": "http", "scheme": "bearer"},
        },
    },
    "security": [{"basic": []}, {"bearer": []}, {}],
    "paths": {
        "/api/": {
            "get": _op(
                "The index of the API's routes",
                {
                    **_ok(
                        {
                            "type": "object",
                            "required": ["links"],
                            "properties": {
                                "links": {
                                    "type": "object",
                                    "additionalProperties": {"type": "string"},
                                }
                            },
                        }
                    ),
                    **_problems(),
                },
            )
        },
        "/api/overview": {
            "get": _op(
                "This node now: rates over the last sample, messages, connections, resources",
                {**_ok(_ref("Overview")), **_problems()},
            )
        },
        "/api/overview/history": {
            "get": _op(
                "The overview's samples of the last 10 minutes, oldest first",
                {
                    **_ok(
                        {
                            "type": "object",
                            "required": ["interval_seconds", "samples"],
                            "properties": {
                                "interval_seconds": {"type": "number", "exclusiveMinimum": 0},
                                "samples": {"type": "array", "items": _ref("Sample")},
                            },
                        }
                    ),
                    **_problems(),
                },
            )
        },
        "/api/overview/stream": {
            "get": _op(
                "Server-sent events: an `overview` event (an Overview with `t`) per sample, "
                "the latest at once; it ends when the node stops",
                {
                    "200": {
                        "description": "An endless text/event-stream",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
                    },
                    **_problems(),
                },
            )
        },
        "/api/nodes": {
            "get": _op(
                "This node, or every node of its cluster",
                {**_ok({"type": "object", "required": ["node_id", "nodes"]}), **_problems()},
            )
        },
        "/api/cluster": {
            "get": _op(
                "The cluster view (nodes, and shards in a cluster)",
                {**_ok({"type": "object", "required": ["node_id", "nodes"]}), **_problems()},
            )
        },
        "/api/alarms": {
            "get": _op(
                "The resource alarms on",
                {**_ok({"type": "object", "required": ["alarms"]}), **_problems()},
            )
        },
        "/api/connections": {
            "get": _op(
                "Every client connection of every frontend that answered within 2 s",
                {
                    **_ok(
                        {
                            "type": "object",
                            "required": ["connections", "frontends"],
                            "properties": {
                                "connections": {"type": "array", "items": _ref("Connection")},
                                "frontends": {"type": "array", "items": _ANY_OBJECT},
                            },
                        }
                    ),
                    **_problems(),
                },
            )
        },
        "/api/connections/{id}": {
            "parameters": _CONN_PARAM,
            "get": _op("One connection", {**_ok(_ref("Connection")), **_problems(404)}),
            "delete": _op(
                "Close a connection with its protocol's close",
                {**_NO_CONTENT, **_problems(404)},
            ),
        },
        "/api/destinations": {
            "get": _op(
                "The destinations",
                {
                    **_ok(
                        {
                            "type": "object",
                            "required": ["destinations"],
                            "properties": {
                                "destinations": {"type": "array", "items": _ref("Destination")}
                            },
                        }
                    ),
                    **_problems(400),
                },
                parameters=[
                    {
                        "name": "kind",
                        "in": "query",
                        "schema": {
                            "type": "string",
                            "enum": ["queue", "topic", "stream", "channel"],
                        },
                    },
                    {"name": "q", "in": "query", "schema": {"type": "string"}},
                    {
                        "name": "sort",
                        "in": "query",
                        "schema": {
                            "type": "string",
                            "enum": _SORTS + [f"-{s}" for s in _SORTS],
                        },
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 10_000},
                    },
                ],
            )
        },
        "/api/destinations/{kind}/{name}": {
            "parameters": _DEST_PARAMS,
            "get": _op("One destination", {**_ok(_ref("Destination")), **_problems(400, 404)}),
            "delete": _op("Delete it", {**_NO_CONTENT, **_problems(400, 404, 409)}),
        },
        "/api/destinations/{kind}/{name}/messages": {
            "parameters": _DEST_PARAMS,
            "get": _op(
                "Peek: a queue's first ready messages, a stream's last entries",
                {
                    **_ok(
                        {
                            "type": "object",
                            "required": ["messages"],
                            "properties": {"messages": {"type": "array", "items": _ref("Message")}},
                        }
                    ),
                    **_problems(400, 404, 409),
                },
                parameters=[
                    {
                        "name": "count",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PEEK},
                    }
                ],
            ),
            "post": _op(
                "Publish one message",
                {
                    **_ok(
                        {
                            "type": "object",
                            "required": ["id"],
                            "properties": {
                                "id": {"type": ["string", "null"]},
                                "seq": {"type": "integer"},
                                "subscribers": {"type": "integer"},
                            },
                        },
                        "201",
                        "Published",
                    ),
                    **_problems(400, 404, 409, 413, 415),
                },
                requestBody={"required": True, "content": {_JSON: {"schema": _ref("Publish")}}},
            ),
        },
        "/api/destinations/{kind}/{name}/contents": {
            "parameters": _DEST_PARAMS,
            "delete": _op(
                "Purge: drop its ready messages",
                {
                    **_ok(
                        {
                            "type": "object",
                            "required": ["purged"],
                            "properties": {"purged": {"type": "integer", "minimum": 0}},
                        }
                    ),
                    **_problems(400, 404, 409),
                },
            ),
        },
    },
}
