"""The core's settings from ``POLYMQ_*``: the replicated log's purge settings reach the
cluster node, and bad values are start-up errors that name their variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from polymq_core.cluster import snapshot
from polymq_core.config import DEV_SECRET, CoreSettings
from polymq_core.service import CoreService
from polymq_server.config import ConfigError, from_env

CLUSTER = {
    "POLYMQ_NODE_ID": "a",
    "POLYMQ_PEERS": "127.0.0.1:17422,127.0.0.1:27422",
    "POLYMQ_CLUSTER_SECRET": "s" * 32,
}


def test_the_log_settings_default_to_the_purge_defaults() -> None:
    s = from_env(CoreSettings, env=CLUSTER)
    assert s.log_purge_every == snapshot.PURGE_EVERY
    assert s.log_keep_entries == snapshot.KEEP_ENTRIES
    assert s.log_max_entries == snapshot.MAX_ENTRIES
    assert s.log_keep_bytes == snapshot.KEEP_BYTES


@pytest.mark.parametrize(("max_entries", "most"), [("50000", 50_000), ("0", None)])
async def test_the_log_settings_reach_the_cluster_node(max_entries: str, most: int | None) -> None:
    env = {
        **CLUSTER,
        "POLYMQ_LOG_PURGE_EVERY": "5",
        "POLYMQ_LOG_KEEP_ENTRIES": "100",
        "POLYMQ_LOG_KEEP_BYTES": "1000000",
        "POLYMQ_LOG_MAX_ENTRIES": max_entries,
    }
    service = CoreService(from_env(CoreSettings, env=env))
    node = service.cluster
    assert node is not None
    retention = node.retention
    assert (retention.purge_every, retention.keep_entries, retention.max_entries) == (
        5.0,
        100,
        most,
    )
    assert retention.keep_bytes == 1_000_000


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("POLYMQ_LOG_PURGE_EVERY", "0"),
        ("POLYMQ_LOG_PURGE_EVERY", "-1"),
        ("POLYMQ_LOG_PURGE_EVERY", "100000"),
        ("POLYMQ_LOG_KEEP_ENTRIES", "-5"),
        ("POLYMQ_LOG_MAX_ENTRIES", "9999"),  # fewer than the 10,000 always kept
        ("POLYMQ_LOG_KEEP_BYTES", "-1"),
        ("POLYMQ_NATS_MEMORY_LIMIT", "512"),  # MiB meant: a few hundred bytes
        ("POLYMQ_NATS_MEMORY_LIMIT", "-1"),
    ],
)
def test_bad_log_settings_are_start_up_errors(var: str, value: str) -> None:
    with pytest.raises(ConfigError, match=var):
        from_env(CoreSettings, env={**CLUSTER, var: value})


# ---- cluster TLS (docs/cluster.md, "Security") ------------------------------------------------
def _tls_env(**files: str) -> dict[str, str]:
    return {**CLUSTER, **{f"POLYMQ_CLUSTER_TLS_{k.upper()}": v for k, v in files.items()}}


def _pem_files(tmp_path: Path) -> dict[str, str]:
    out = {}
    for name in ("cert", "key", "ca"):
        path = tmp_path / f"{name}.pem"
        path.write_text("-----BEGIN CERTIFICATE-----\n")
        out[name] = str(path)
    return out


def test_cluster_tls_is_off_without_its_files() -> None:
    s = from_env(CoreSettings, env=CLUSTER)
    assert not s.cluster_tls


def test_cluster_tls_with_all_three_readable_files(tmp_path: Path) -> None:
    s = from_env(CoreSettings, env=_tls_env(**_pem_files(tmp_path)))
    assert s.cluster_tls
    assert (s.peer_wire_port, s.peer_admin_port) == (7423, 7424)


@pytest.mark.parametrize("left_out", ["cert", "key", "ca"])
def test_cluster_tls_needs_all_three_files(tmp_path: Path, left_out: str) -> None:
    files = _pem_files(tmp_path)
    del files[left_out]
    with pytest.raises(ConfigError, match=f"POLYMQ_CLUSTER_TLS_{left_out.upper()} missing"):
        from_env(CoreSettings, env=_tls_env(**files))


def test_cluster_tls_files_must_be_readable(tmp_path: Path) -> None:
    files = _pem_files(tmp_path)
    files["key"] = str(tmp_path / "nowhere.pem")
    with pytest.raises(ConfigError, match=r"POLYMQ_CLUSTER_TLS_KEY='.*nowhere.pem': no such file"):
        from_env(CoreSettings, env=_tls_env(**files))
    files["key"] = str(tmp_path)
    with pytest.raises(ConfigError, match=r"POLYMQ_CLUSTER_TLS_KEY=.*: a directory"):
        from_env(CoreSettings, env=_tls_env(**files))


def test_cluster_tls_without_peers_is_not_used(tmp_path: Path) -> None:
    """Without --peers (set by a flag after the environment is read) nothing goes between
    nodes: the files are not checked, and there is no cluster TLS."""
    env = {f"POLYMQ_CLUSTER_TLS_{k.upper()}": v for k, v in _pem_files(tmp_path).items()}
    env["POLYMQ_CLUSTER_TLS_KEY"] = str(tmp_path / "nowhere.pem")
    assert not from_env(CoreSettings, env=env).cluster_tls


def test_the_peer_ports_are_checked(tmp_path: Path) -> None:
    env = {**_tls_env(**_pem_files(tmp_path)), "POLYMQ_PEER_WIRE_PORT": "70000"}
    with pytest.raises(ConfigError, match=r"POLYMQ_PEER_WIRE_PORT must be 0\.\.65535"):
        from_env(CoreSettings, env=env)


@pytest.mark.parametrize(
    ("env", "clustered"),
    [
        ({}, False),  # make run: one node
        ({"POLYMQ_PEERS": "127.0.0.1:17422"}, True),
        ({"POLYMQ_K8S_SERVICE": "polymq-core-headless"}, True),  # peers from the endpoints
        ({"POLYMQ_K8S_SERVICE": "core", "POLYMQ_PEERS": "127.0.0.1:17422"}, True),
        ({"POLYMQ_K8S_NAMESPACE": "polymq", "POLYMQ_KUBECONFIG": "/k"}, False),  # no Service
    ],
)
def test_cluster_mode_is_on_with_peers_or_a_kubernetes_service(
    env: dict[str, str], clustered: bool
) -> None:
    env = {**env, "POLYMQ_CLUSTER_SECRET": "s" * 32}
    assert from_env(CoreSettings, env=env).clustered is clustered


def test_a_kubernetes_service_alone_checks_the_cluster_settings() -> None:
    env = {"POLYMQ_K8S_SERVICE": "core", "POLYMQ_NODE_ID": "core 0"}
    with pytest.raises(ConfigError, match="node id 'core 0'"):
        from_env(CoreSettings, env=env)


@pytest.mark.parametrize("value", ["0", "0.05", "61", "-1"])
def test_the_overview_interval_is_a_tenth_of_a_second_to_a_minute(value: str) -> None:
    with pytest.raises(ConfigError, match="POLYMQ_OVERVIEW_INTERVAL"):
        from_env(CoreSettings, env={"POLYMQ_OVERVIEW_INTERVAL": value})
    assert from_env(CoreSettings, env={"POLYMQ_OVERVIEW_INTERVAL": "0.1"}).overview_interval == 0.1


# ---- the cluster secret and the core's own TLS -----------------------------------------------
def test_a_replicated_core_needs_the_cluster_secret() -> None:
    env = {k: v for k, v in CLUSTER.items() if k != "POLYMQ_CLUSTER_SECRET"}
    for cluster in (env, {"POLYMQ_K8S_SERVICE": "core-headless"}):
        with pytest.raises(ConfigError, match="needs a cluster secret") as err:
            from_env(CoreSettings, env=cluster)
        assert "POLYMQ_CLUSTER_SECRET" in str(err.value)
        assert "--insecure-dev-secret" in str(err.value)
    assert from_env(CoreSettings, env={}).secret  # (one node: no secret needed)


def test_the_development_switch_runs_on_the_public_secret_and_a_secret_wins() -> None:
    env = {k: v for k, v in CLUSTER.items() if k != "POLYMQ_CLUSTER_SECRET"}
    dev = from_env(CoreSettings, env={**env, "POLYMQ_INSECURE_DEV_SECRET": "1"})
    assert dev.secret == DEV_SECRET
    both = from_env(CoreSettings, env={**CLUSTER, "POLYMQ_INSECURE_DEV_SECRET": "1"})
    assert both.secret == "s" * 32


def test_the_core_tls_files_are_both_or_neither_and_readable(tmp_path: Path) -> None:
    files = _pem_files(tmp_path)
    with pytest.raises(ConfigError, match="both POLYMQ_CORE_TLS_CERT and POLYMQ_CORE_TLS_KEY"):
        from_env(CoreSettings, env={"POLYMQ_CORE_TLS_CERT": files["cert"]})
    env = {"POLYMQ_CORE_TLS_CERT": files["cert"], "POLYMQ_CORE_TLS_KEY": str(tmp_path / "no")}
    with pytest.raises(ConfigError, match=r"POLYMQ_CORE_TLS_KEY=.*: no such file"):
        from_env(CoreSettings, env=env)
    env["POLYMQ_CORE_TLS_KEY"] = files["key"]
    assert from_env(CoreSettings, env=env).core_tls


def test_core_tls_in_a_cluster_needs_cluster_tls(tmp_path: Path) -> None:
    files = _pem_files(tmp_path)
    core = {"POLYMQ_CORE_TLS_CERT": files["cert"], "POLYMQ_CORE_TLS_KEY": files["key"]}
    with pytest.raises(ConfigError, match="needs cluster TLS too"):
        from_env(CoreSettings, env={**CLUSTER, **core})
    assert from_env(CoreSettings, env={**_tls_env(**files), **core}).core_tls
