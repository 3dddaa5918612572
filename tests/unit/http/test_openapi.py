"""The OpenAPI document agrees with the checks in payloads.py and states the settings."""

from __future__ import annotations

from polymq.types import DeclareOptions
from polymq_http.config import HttpSettings
from polymq_http.openapi import document
from polymq_server.auth.deadletter import DECLARER
from polymq_server.web.payloads import (
    BASE64_PATTERN,
    MAX_CONTENT_TYPE,
    MAX_COUNT,
    MAX_METADATA_KEYS,
    MAX_SECONDS,
    MAX_TEXT,
    MAX_VISIBILITY,
    MESSAGE_KEYS,
    NAME_PATTERN,
)


def test_limits_come_from_the_settings() -> None:
    doc = document(HttpSettings(max_batch=7, max_pull=8, max_wait=2.5))
    schemas = doc["components"]["schemas"]
    assert schemas["Batch"]["properties"]["messages"]["maxItems"] == 7
    assert schemas["Receipts"]["properties"]["receipts"]["maxItems"] == 7
    assert schemas["NackReceipts"]["properties"]["receipts"]["maxItems"] == 7
    params = {p.get("name"): p for p in doc["paths"]["/v1/queue/{name}/pull"]["post"]["parameters"]}
    assert params["max"]["schema"]["maximum"] == 8
    assert params["wait"]["schema"]["maximum"] == 2.5
    assert params["visibility"]["schema"]["maximum"] == MAX_VISIBILITY
    # the template is not changed by a document made from it
    assert (
        document(HttpSettings())["components"]["schemas"]["Batch"]["properties"]["messages"][
            "maxItems"
        ]
        == HttpSettings().max_batch
    )


def test_schemas_mirror_the_checks() -> None:
    doc = document(HttpSettings())
    schemas = doc["components"]["schemas"]
    message = schemas["Message"]
    assert set(message["properties"]) == MESSAGE_KEYS
    assert set(schemas["SingleMessage"]["properties"]) == MESSAGE_KEYS | {"role"}
    assert message["then"]["properties"]["body"]["pattern"] == BASE64_PATTERN
    props = message["properties"]
    assert props["content_type"]["maxLength"] == MAX_CONTENT_TYPE
    assert props["correlation_id"]["maxLength"] == props["reply_to"]["maxLength"] == MAX_TEXT
    assert props["ttl"]["maximum"] == props["ack_timeout"]["maximum"] == MAX_SECONDS
    declare = schemas["DeclareOptions"]["properties"]
    assert set(declare) == DeclareOptions.KEYS - {DECLARER}  # (the server sets that one)
    assert declare["max_length"]["maximum"] == MAX_COUNT
    assert declare["idle_ttl"]["maximum"] == MAX_SECONDS
    assert schemas["Metadata"]["maxProperties"] == MAX_METADATA_KEYS
    assert doc["components"]["parameters"]["Name"]["schema"]["pattern"] == NAME_PATTERN


def test_every_operation_documents_its_errors_as_problems() -> None:
    doc = document(HttpSettings())
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method == "parameters" or not path.startswith("/v1/"):
                continue
            codes = set(op["responses"])
            assert {"200", "400", "401", "403", "503"} <= codes, (method, path)
            if "requestBody" in op:
                assert {"413", "415"} <= codes, (method, path)
    for name, response in doc["components"]["responses"].items():
        assert "application/problem+json" in response["content"], name
