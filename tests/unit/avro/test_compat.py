"""Compatibility rules (``polymq_avro.compat``), decided by Apache Avro's checker."""

from __future__ import annotations

import json
from typing import Any

import pytest

from polymq_avro.compat import Compatibility, apache_schema, incompatibilities
from polymq_server.messages.avro import InvalidSchema


def record(*fields: dict[str, Any]) -> str:
    return json.dumps({"type": "record", "name": "User", "fields": list(fields)})


NAME = {"name": "name", "type": "string"}
V1 = record(NAME)
WITH_DEFAULT = record(NAME, {"name": "age", "type": "int", "default": 0})
WITHOUT_DEFAULT = record(NAME, {"name": "age", "type": "int"})
NAME_AS_INT = record({"name": "name", "type": "int"})


@pytest.mark.parametrize(
    ("rule", "new", "ok"),
    [
        (Compatibility.BACKWARD, WITH_DEFAULT, True),
        (Compatibility.BACKWARD, WITHOUT_DEFAULT, False),
        (Compatibility.BACKWARD, NAME_AS_INT, False),
        (Compatibility.FORWARD, WITH_DEFAULT, True),
        (Compatibility.FORWARD, WITHOUT_DEFAULT, True),  # the old reader ignores the field
        (Compatibility.FORWARD, NAME_AS_INT, False),
        (Compatibility.FULL, WITH_DEFAULT, True),
        (Compatibility.FULL, WITHOUT_DEFAULT, False),
        (Compatibility.NONE, NAME_AS_INT, True),
    ],
)
def test_rules(rule: Compatibility, new: str, ok: bool) -> None:
    messages = incompatibilities(rule, new, [(1, V1)])
    assert (messages == []) is ok, messages


def test_messages_say_which_version_and_where() -> None:
    (message,) = incompatibilities(Compatibility.BACKWARD, WITHOUT_DEFAULT, [(1, V1)])
    assert "version 1" in message and "reader_field_missing_default_value" in message
    assert "age" in message


def test_type_promotion_is_one_way() -> None:
    as_long = record({"name": "n", "type": "long"})
    as_int = record({"name": "n", "type": "int"})
    assert incompatibilities(Compatibility.BACKWARD, as_long, [(1, as_int)]) == []
    assert incompatibilities(Compatibility.BACKWARD, as_int, [(1, as_long)]) != []


def test_transitive_rules_check_every_version() -> None:
    """v1 has no age, v2 adds it with a default, v3 drops the default: v3 reads v2 (which
    always writes age) but not v1. BACKWARD looks at v2 only; BACKWARD_TRANSITIVE at both."""
    history = [(1, V1), (2, WITH_DEFAULT)]
    assert incompatibilities(Compatibility.BACKWARD, WITHOUT_DEFAULT, history) == []
    (message,) = incompatibilities(Compatibility.BACKWARD_TRANSITIVE, WITHOUT_DEFAULT, history)
    assert "version 1" in message
    assert incompatibilities(Compatibility.FULL_TRANSITIVE, WITHOUT_DEFAULT, history) != []


def test_no_history_is_always_compatible() -> None:
    for rule in Compatibility:
        assert incompatibilities(rule, NAME_AS_INT, []) == []


def test_apache_avro_refuses_what_it_does_not_take() -> None:
    with pytest.raises(InvalidSchema):
        apache_schema('{"type": "record", "name": "R"}')  # fields are required
    with pytest.raises(InvalidSchema):
        apache_schema('["int", "int"]')
    assert apache_schema(V1).type == "record"


def test_rule_properties() -> None:
    assert Compatibility.FULL.backward and Compatibility.FULL.forward
    assert not Compatibility.FORWARD.backward and Compatibility.FORWARD_TRANSITIVE.transitive
    assert not any((Compatibility.NONE.backward, Compatibility.NONE.forward))
