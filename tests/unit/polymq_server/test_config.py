"""Tests for polymq_server.config.from_env: settings from ``POLYMQ_...`` variables."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from polymq_server.config import ConfigError, check_core, core_flag, core_ssl_context, from_env


@dataclasses.dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 7400
    max_wait: float = 60.0
    debug: bool = False
    data_dir: Path = Path("./data")
    auth_file: Path | None = None
    node: str | None = "node-0"
    limit: int | None = 10
    origins: tuple[str, ...] = ("http://localhost",)
    ports: tuple[int, ...] = (1, 2)
    ratio: float | None = None

    checked: int = 0  # how many times check() ran (it only may count, the class is frozen)

    def check(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError("POLYMQ_PORT must be 0..65535")
        object.__setattr__(self, "checked", self.checked + 1)


@dataclasses.dataclass(frozen=True)
class Required:
    name: str
    count: int = 1


@dataclasses.dataclass(frozen=True)
class Unsupported:
    mode: dict[str, str] = dataclasses.field(default_factory=dict)


def test_defaults_when_nothing_is_set() -> None:
    s = from_env(Settings, env={})
    assert s == Settings(checked=1)


def test_unknown_and_foreign_variables_are_ignored() -> None:
    env = {"POLYMQ_NOPE": "x", "PORT": "1", "OTHER_PORT": "2", "polymq_port": "3"}
    assert from_env(Settings, env=env) == Settings(checked=1)


def test_every_type() -> None:
    env = {
        "POLYMQ_HOST": "0.0.0.0",
        "POLYMQ_PORT": "8080",
        "POLYMQ_MAX_WAIT": "2.5",
        "POLYMQ_DEBUG": "true",
        "POLYMQ_DATA_DIR": "/var/lib/polymq",
        "POLYMQ_AUTH_FILE": "users.json",
        "POLYMQ_NODE": "n1",
        "POLYMQ_LIMIT": "0",
        "POLYMQ_ORIGINS": "https://a.example, https://b.example,,",
        "POLYMQ_PORTS": "80, 443",
        "POLYMQ_RATIO": "0.5",
    }
    s = from_env(Settings, env=env)
    assert s == Settings(
        host="0.0.0.0",
        port=8080,
        max_wait=2.5,
        debug=True,
        data_dir=Path("/var/lib/polymq"),
        auth_file=Path("users.json"),
        node="n1",
        limit=0,
        origins=("https://a.example", "https://b.example"),
        ports=(80, 443),
        ratio=0.5,
        checked=1,
    )
    assert type(s.port) is int
    assert type(s.max_wait) is float
    assert isinstance(s.data_dir, Path)
    assert isinstance(s.auth_file, Path)
    assert all(type(p) is int for p in s.ports)


def test_the_os_environment_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYMQ_PORT", "9999")
    assert from_env(Settings).port == 9999


def test_another_prefix() -> None:
    env = {"POLYMQ_PORT": "1", "HTTP_PORT": "2"}
    assert from_env(Settings, prefix="HTTP_", env=env).port == 2


def test_ints_accept_surrounding_space_and_sign() -> None:
    assert from_env(Settings, env={"POLYMQ_PORT": " 80 "}).port == 80
    assert from_env(Settings, env={"POLYMQ_LIMIT": "-5"}).limit == -5


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("true", True),
        ("True", True),
        ("TRUE", True),
        ("1", True),
        ("yes", True),
        ("on", True),
        (" yes ", True),
        ("false", False),
        ("False", False),
        ("0", False),
        ("no", False),
        ("off", False),
    ],
)
def test_bools(raw: str, value: bool) -> None:
    assert from_env(Settings, env={"POLYMQ_DEBUG": raw}).debug is value


@pytest.mark.parametrize(
    ("var", "field"),
    [("POLYMQ_AUTH_FILE", "auth_file"), ("POLYMQ_NODE", "node"), ("POLYMQ_LIMIT", "limit")],
)
def test_empty_optional_is_none(var: str, field: str) -> None:
    assert getattr(from_env(Settings, env={var: ""}), field) is None


def test_empty_str_is_empty_not_default() -> None:
    assert from_env(Settings, env={"POLYMQ_HOST": ""}).host == ""


def test_empty_tuple() -> None:
    assert from_env(Settings, env={"POLYMQ_ORIGINS": ""}).origins == ()
    assert from_env(Settings, env={"POLYMQ_ORIGINS": " , "}).origins == ()


def test_single_item_tuple() -> None:
    assert from_env(Settings, env={"POLYMQ_ORIGINS": "x"}).origins == ("x",)


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        ("POLYMQ_PORT", "eighty"),
        ("POLYMQ_PORT", "80.0"),
        ("POLYMQ_PORT", ""),
        ("POLYMQ_PORT", "0x50"),
        ("POLYMQ_MAX_WAIT", "soon"),
        ("POLYMQ_MAX_WAIT", ""),
        ("POLYMQ_DEBUG", "maybe"),
        ("POLYMQ_DEBUG", ""),
        ("POLYMQ_DEBUG", "2"),
        ("POLYMQ_LIMIT", "ten"),
        ("POLYMQ_RATIO", "half"),
    ],
)
def test_malformed_values_name_the_variable(var: str, raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_env(Settings, env={var: raw})
    assert str(info.value).startswith(f"{var}={raw!r}: ")


def test_malformed_tuple_item_names_the_variable_and_the_item() -> None:
    with pytest.raises(ConfigError, match=r"^POLYMQ_PORTS='https': invalid literal"):
        from_env(Settings, env={"POLYMQ_PORTS": "80,https"})


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_check_is_called_and_its_error_propagates() -> None:
    assert from_env(Settings, env={}).checked == 1
    with pytest.raises(ConfigError, match=r"POLYMQ_PORT must be 0\.\.65535"):
        from_env(Settings, env={"POLYMQ_PORT": "70000"})


def test_check_can_wait_for_the_flags() -> None:
    """``check=False``: the CLI checks once its flags are in (a flag may mend the value)."""
    assert from_env(Settings, env={"POLYMQ_PORT": "70000"}, check=False).checked == 0


@dataclasses.dataclass(frozen=True)
class CoreLinkSettings:
    core_tls: bool = False
    core_tls_ca: str | None = None


def test_the_core_link_speaks_tls_with_a_ca_or_the_switch(tmp_path: Path) -> None:
    assert core_ssl_context(CoreLinkSettings()) is None  # type: ignore[arg-type]
    system = core_ssl_context(CoreLinkSettings(core_tls=True))  # type: ignore[arg-type]
    assert system is not None and system.check_hostname
    missing = CoreLinkSettings(core_tls_ca=str(tmp_path / "ca.pem"))
    with pytest.raises(ConfigError, match=r"POLYMQ_CORE_TLS_CA=.*ca\.pem.*: no such file"):
        core_ssl_context(missing)  # type: ignore[arg-type]
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"POLYMQ_CORE_TLS_CA=.*not a PEM CA bundle"):
        core_ssl_context(missing)  # type: ignore[arg-type]


def test_missing_required_setting_names_the_variable() -> None:
    assert from_env(Required, env={"POLYMQ_NAME": "x"}) == Required("x")
    with pytest.raises(
        ConfigError, match=r"^POLYMQ_NAME is missing, and Required\.name has no default"
    ):
        from_env(Required, env={"POLYMQ_COUNT": "2"})


def test_a_class_without_check() -> None:
    assert from_env(Required, env={"POLYMQ_NAME": "n", "POLYMQ_COUNT": "3"}) == Required("n", 3)


def test_unsupported_type_is_a_config_error_when_set() -> None:
    assert from_env(Unsupported, env={}) == Unsupported()
    with pytest.raises(ConfigError, match="POLYMQ_MODE: unsupported setting type"):
        from_env(Unsupported, env={"POLYMQ_MODE": "a=b"})


# ---- the core's addresses: --core, POLYMQ_CORE, POLYMQ_CORE_HOST -------------------------
@pytest.mark.parametrize(
    ("flag", "setting"),
    [
        ("core.svc:7500", ("core.svc", 7500)),
        (":7500", ("127.0.0.1", 7500)),  # this machine's port, as it always was
        ("core.svc", ("core.svc", 7400)),
        ("n1:7401, n2 ,[::1]:7403", ("n1:7401,n2:7400,[::1]:7403", 7401)),
    ],
)
def test_the_core_flag_takes_one_address_or_several(flag: str, setting: tuple[str, int]) -> None:
    assert core_flag(flag) == setting


@pytest.mark.parametrize("flag", ["", "n1:x", "n1:7400,,n2", "n1:0"])
def test_a_malformed_core_flag_names_itself(flag: str) -> None:
    with pytest.raises(ConfigError, match=r"--core .*expected HOST:PORT\[,HOST:PORT\.\.\.\]"):
        core_flag(flag)


def test_the_core_host_setting_may_list_several_and_is_checked() -> None:
    check_core("n1:7401,n2", 7400)
    with pytest.raises(ConfigError, match=r"POLYMQ_CORE_HOST='n1:7401,n2:port'.*not a number"):
        check_core("n1:7401,n2:port", 7400)
    with pytest.raises(ConfigError, match="POLYMQ_CORE_PORT must name the core's port"):
        check_core("n1", 0)
