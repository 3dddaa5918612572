"""AvroSettings: from the environment, with clear errors for nonsense."""

from __future__ import annotations

import pytest

from polymq_avro.compat import Compatibility
from polymq_avro.config import AvroSettings
from polymq_server.config import ConfigError, from_env


def test_defaults() -> None:
    s = from_env(AvroSettings, env={})
    assert (s.host, s.avro_port, s.core_host, s.core_port) == ("127.0.0.1", 7470, "127.0.0.1", 7400)
    assert s.avro_max_body == 64 * 1024 * 1024 and s.avro_max_records == 100_000
    assert s.avro_idempotency_window == 900.0 and s.compatibility is Compatibility.BACKWARD


def test_from_env() -> None:
    env = {
        "POLYMQ_AVRO_PORT": "0",
        "POLYMQ_AVRO_IDEMPOTENCY_WINDOW": "60",
        "POLYMQ_AVRO_COMPATIBILITY": "full_transitive",
        "POLYMQ_AVRO_MAX_RECORDS": "10",
        "POLYMQ_CORE_HOST": "core.example",
        "POLYMQ_MAX_BODY": "1",  # the HTTP frontend's setting: not this one's
    }
    s = from_env(AvroSettings, env=env)
    assert s.avro_port == 0 and s.avro_idempotency_window == 60.0 and s.avro_max_records == 10
    assert s.compatibility is Compatibility.FULL_TRANSITIVE and s.core_host == "core.example"
    assert s.avro_max_body == 64 * 1024 * 1024


@pytest.mark.parametrize(
    "env",
    [
        {"POLYMQ_AVRO_PORT": "70000"},
        {"POLYMQ_CORE_PORT": "0"},
        {"POLYMQ_AVRO_MAX_BODY": "10"},
        {"POLYMQ_AVRO_MAX_RECORDS": "0"},
        {"POLYMQ_AVRO_MAX_PULL": "-1"},
        {"POLYMQ_AVRO_MAX_WAIT": "nan"},
        {"POLYMQ_AVRO_IDEMPOTENCY_WINDOW": "0"},
        {"POLYMQ_AVRO_COMPATIBILITY": "SOMETIMES"},
        {"POLYMQ_AUTH": "ldap:x"},
        {"POLYMQ_CORE_PASSWORD": "p"},
    ],
)
def test_nonsense_is_refused(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as info:
        from_env(AvroSettings, env=env)
    assert next(iter(env)) in str(info.value) or "POLYMQ_" in str(info.value)
