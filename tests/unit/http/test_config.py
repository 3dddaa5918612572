"""HttpSettings: from the environment, with clear errors for nonsense."""

from __future__ import annotations

import pytest

from polymq_http.config import HttpSettings
from polymq_server.config import ConfigError, from_env


def test_defaults() -> None:
    s = from_env(HttpSettings, env={})
    assert (s.host, s.http_port, s.core_host, s.core_port) == ("127.0.0.1", 7480, "127.0.0.1", 7400)
    assert s.max_body == 16 * 1024 * 1024 and s.max_batch == 1000 and s.max_pull == 1000
    assert s.max_wait == 30.0 and s.auth == "anonymous" and s.core_user is None


def test_from_env() -> None:
    env = {"POLYMQ_MAX_BODY": "4096", "POLYMQ_MAX_WAIT": "2.5", "POLYMQ_CORE_USER": "fe"}
    s = from_env(HttpSettings, env=env)
    assert s.max_body == 4096 and s.max_wait == 2.5 and s.core_user == "fe"


@pytest.mark.parametrize(
    "env",
    [
        {"POLYMQ_HTTP_PORT": "70000"},
        {"POLYMQ_CORE_PORT": "0"},
        {"POLYMQ_MAX_BODY": "10"},
        {"POLYMQ_MAX_BATCH": "0"},
        {"POLYMQ_MAX_PULL": "-1"},
        {"POLYMQ_MAX_WAIT": "nan"},
        {"POLYMQ_MAX_WAIT": "-1"},
        {"POLYMQ_AUTH": "ldap:x"},
        {"POLYMQ_CORE_PASSWORD": "p"},
        {"POLYMQ_MAX_BODY": "lots"},
    ],
)
def test_nonsense_is_refused(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        from_env(HttpSettings, env=env)
