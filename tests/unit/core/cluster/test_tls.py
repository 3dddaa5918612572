"""Cluster TLS: the contexts of peer links and peer listeners trust the cluster's CA only and
ask for a certificate both ways; bad files are configuration errors that name their
variable; nats-server is told to route over TLS with verification."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from polymq.errors import Unauthorized
from polymq.events import Hello
from polymq_core.cluster.natsd import NatsConfig
from polymq_core.cluster.tls import ClusterTls
from polymq_core.config import CoreSettings
from polymq_core.service import CoreService
from polymq_server.auth.provider import AuthProvider, Principal
from polymq_server.config import ConfigError, from_env

from ....pki import HAVE_OPENSSL, Authority

pytestmark = pytest.mark.skipif(not HAVE_OPENSSL, reason="needs openssl to make certificates")


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return Authority.make(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls(ca: Authority) -> ClusterTls:
    cert, key = ca.issue("node")
    return ClusterTls(str(cert), str(key), str(ca.cert))


def test_of_settings_gives_absolute_paths(tls: ClusterTls, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(Path(tls.cert).parent)
    cluster = {"POLYMQ_PEERS": "127.0.0.1:17422,127.0.0.1:27422", "POLYMQ_CLUSTER_SECRET": "s" * 32}
    env = {
        **cluster,
        "POLYMQ_CLUSTER_TLS_CERT": Path(tls.cert).name,
        "POLYMQ_CLUSTER_TLS_KEY": Path(tls.key).name,
        "POLYMQ_CLUSTER_TLS_CA": Path(tls.ca).name,
    }
    assert ClusterTls.of(from_env(CoreSettings, env=env)) == tls
    assert ClusterTls.of(from_env(CoreSettings, env=cluster)) is None


def test_both_sides_require_a_certificate_from_the_cluster_ca_only(tls: ClusterTls) -> None:
    server, client = tls.server_context(), tls.client_context()
    for ctx in (server, client):
        assert ctx.verify_mode == ssl.CERT_REQUIRED
        assert ctx.minimum_version >= ssl.TLSVersion.TLSv1_2
        # the cluster's CA alone: no system CA vouches for a node
        assert [c["subject"] for c in ctx.get_ca_certs()] == [
            ((("commonName", "polymq test ca"),),)
        ]
    assert client.check_hostname is False  # peers' addresses come from system.peers


def test_a_key_that_is_not_the_certificates_is_named(ca: Authority, tls: ClusterTls) -> None:
    _, other_key = ca.issue("other")
    wrong = ClusterTls(tls.cert, str(other_key), tls.ca)
    with pytest.raises(ConfigError, match=r"POLYMQ_CLUSTER_TLS_KEY=.* is not the private key of"):
        wrong.server_context()


@pytest.mark.parametrize("field", ["cert", "key", "ca"])
def test_a_file_that_is_not_pem_is_named(tls: ClusterTls, tmp_path: Path, field: str) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    paths = {"cert": tls.cert, "key": tls.key, "ca": tls.ca, field: str(junk)}
    with pytest.raises(ConfigError, match=rf"POLYMQ_CLUSTER_TLS_{field.upper()}=.*junk.pem.*: not"):
        ClusterTls(**paths).client_context()


def test_nats_routes_are_tls_verified_against_the_ca(tls: ClusterTls, tmp_path: Path) -> None:
    text = NatsConfig(
        server_name="a", store_dir=tmp_path, cluster_port=6222, routes=(("b", 6223),), tls=tls
    ).render()
    cluster = text[text.index("cluster {") :]
    assert f'cert_file: "{tls.cert}"' in cluster
    assert f'key_file: "{tls.key}"' in cluster
    assert f'ca_file: "{tls.ca}"' in cluster
    assert "verify: true" in cluster
    plain = NatsConfig(
        server_name="a", store_dir=tmp_path, cluster_port=6222, routes=(("b", 6223),)
    )
    assert "tls {" not in plain.render()


class Nobody(AuthProvider):
    """Users' logins refused: what is left is the cluster secret's."""

    async def authenticate_password(self, user: str, password: str) -> Principal:
        raise Unauthorized("no such user")

    async def authenticate_token(self, token: str) -> Principal:
        raise Unauthorized("no such token")

    async def anonymous(self) -> Principal:
        raise Unauthorized("no anonymous access")

    def describe(self) -> str:
        return "nobody"


@pytest.mark.parametrize("cluster_tls", [True, False])
async def test_the_cluster_secret_logs_in_on_the_peers_listener_alone_with_cluster_tls(
    tls: ClusterTls, tmp_path: Path, cluster_tls: bool
) -> None:
    secret = "s" * 32
    files = (
        {"cluster_tls_cert": tls.cert, "cluster_tls_key": tls.key, "cluster_tls_ca": tls.ca}
        if cluster_tls
        else {}
    )
    settings = CoreSettings(
        peers="127.0.0.1:17422,127.0.0.1:27422",
        node_id="a",
        cluster_secret=secret,
        data_dir=tmp_path,
        **files,  # type: ignore[arg-type]
    )
    service = CoreService(settings, auth=Nobody())
    service.broker.ready = True
    peer = Hello(1, "peer/b", token=secret)
    assert service.peer_auth is not None
    assert (await service.broker.authenticate(peer, service.peer_auth)).name == "polymq-internal"
    if cluster_tls:  # the wire port for frontends and clients does not take it
        with pytest.raises(Unauthorized):
            await service.broker.authenticate(peer)
    else:  # peers log in on the wire port
        assert (await service.broker.authenticate(peer)).name == "polymq-internal"
