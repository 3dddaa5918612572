"""``polymq nats``: the nats-server config it writes is the one the core would start its own
child with (one function, ``polymq_core.cluster.node.nats_config``), with a fixed client port,
readable by its owner alone, and without the secret itself; without peers it refuses."""

from __future__ import annotations

import argparse
import stat
from pathlib import Path

import pytest

from polymq_cli.main import _parser
from polymq_cli.nats_cmd import _prepared, _settings, prepare, run
from polymq_core.cluster.natsd import derived_password
from polymq_core.cluster.node import nats_config
from polymq_core.config import CoreSettings
from polymq_server.config import ConfigError

SECRET = "s" * 40
PEERS = "127.0.0.1:17001,127.0.0.1:17002,127.0.0.1:17003"


def _args(tmp_path: Path, *more: str) -> argparse.Namespace:
    return _parser().parse_args(
        ["nats", "--node-id", "n1", "--cluster-port", "17001", "--data-dir", str(tmp_path),
         *more]
    )  # fmt: skip


def test_the_config_is_the_cores_own_with_a_fixed_client_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLYMQ_CLUSTER_SECRET", SECRET)
    path = prepare(_args(tmp_path, "--peers", PEERS, "--client-port", "14222"))
    text = path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    settings = CoreSettings(
        node_id="n1", peers=PEERS, cluster_port=17001, data_dir=tmp_path, cluster_secret=SECRET
    )
    assert text == nats_config(settings, client_port=14222).render()
    assert 'server_name: "n1"' in text and "port: 14222" in text
    assert "sync_interval: always" in text and f'store_dir: "{tmp_path / "nats"}"' in text
    assert (tmp_path / "nats").is_dir()
    # routes to the two others, not to itself
    assert "127.0.0.1:17002" in text and "127.0.0.1:17003" in text
    assert "@127.0.0.1:17001" not in text
    assert derived_password(SECRET, "clients") in text and SECRET not in text


def test_without_peers_it_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POLYMQ_PEERS", raising=False)
    with pytest.raises(ConfigError, match="--peers"):
        prepare(_args(tmp_path))
    assert run(_args(tmp_path)) == 2
    assert run(_args(tmp_path, "--peers", PEERS, "--client-port", "0")) == 2


def test_cluster_tls_from_the_cores_settings_puts_the_routes_on_tls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chart's sidecar gets POLYMQ_CLUSTER_TLS_* as the core does: its routes are TLS,
    verified against the CA; a missing file is a configuration error (exit 2)."""
    files = {}
    for name in ("cert", "key", "ca"):
        files[name] = tmp_path / f"{name}.pem"
        files[name].write_text("-----BEGIN CERTIFICATE-----\n")
        monkeypatch.setenv(f"POLYMQ_CLUSTER_TLS_{name.upper()}", str(files[name]))
    monkeypatch.setenv("POLYMQ_CLUSTER_SECRET", SECRET)
    text = prepare(_args(tmp_path, "--peers", PEERS)).read_text()
    cluster = text[text.index("cluster {") :]
    for field, name in (("cert_file", "cert"), ("key_file", "key"), ("ca_file", "ca")):
        assert f'{field}: "{files[name]}"' in cluster
    assert "verify: true" in cluster
    files["key"].unlink()
    assert run(_args(tmp_path, "--peers", PEERS)) == 2


def test_a_kubernetes_service_instead_of_peers_and_no_api_exits_1_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """POLYMQ_K8S_SERVICE alone is a cluster (its endpoints are the routes); when the
    Kubernetes API cannot be configured, polymq nats says so and exits 1."""
    monkeypatch.delenv("POLYMQ_PEERS", raising=False)
    monkeypatch.setenv("POLYMQ_CLUSTER_SECRET", SECRET)
    monkeypatch.setenv("POLYMQ_K8S_SERVICE", "polymq-core-headless")
    monkeypatch.setenv("POLYMQ_KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    assert run(_args(tmp_path)) == 1
    assert "cannot reach the Kubernetes API" in capsys.readouterr().err


def test_nats_server_runs_under_the_cores_memory_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sidecar's nats-server gets the GOMEMLIMIT the core's own child would."""
    monkeypatch.setenv("POLYMQ_CLUSTER_SECRET", SECRET)
    monkeypatch.setenv("POLYMQ_NATS_MEMORY_LIMIT", str(300 << 20))
    _, env = _prepared(_args(tmp_path, "--peers", PEERS))
    assert env["GOMEMLIMIT"] == str(300 << 20)


def test_the_admin_port_its_partition_watch_probes_is_the_cores_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--admin-port`` (else POLYMQ_ADMIN_PORT, else 7401): the port the other nodes' cores
    answer on, which the sidecar's partition watch probes; a bad one exits 2."""
    monkeypatch.delenv("POLYMQ_ADMIN_PORT", raising=False)
    monkeypatch.setenv("POLYMQ_CLUSTER_SECRET", SECRET)
    assert _settings(_args(tmp_path, "--peers", PEERS)).admin_port == 7401
    monkeypatch.setenv("POLYMQ_ADMIN_PORT", "17401")
    assert _settings(_args(tmp_path, "--peers", PEERS)).admin_port == 17401
    assert _settings(_args(tmp_path, "--peers", PEERS, "--admin-port", "0")).admin_port == 0
    assert run(_args(tmp_path, "--peers", PEERS, "--admin-port", "70000")) == 2
