"""TLS on the core's own ports: ``polymq core --tls-cert/--tls-key`` serves the wire
protocol and the admin HTTP over TLS only (certificates from a throw-away CA,
``tests/pki.py``). ``polymq.Client`` connects with an ``ssl`` context, ``requests`` reads
the admin API over HTTPS, a plain connection to either port is refused, and a frontend
given ``--core-tls-ca`` links to the core over TLS."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from polymq import Client
from polymq.errors import ConnectionClosed

from ...pki import HAVE_OPENSSL, Authority
from ...procs import PolymqProcess, serving

pytestmark = [
    pytest.mark.skipif(not HAVE_OPENSSL, reason="needs openssl to make certificates"),
    pytest.mark.timeout(90),
]

TIMEOUT = 10.0


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return Authority.make(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def core(ca: Authority, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    cert, key = ca.issue("core")
    workdir = tmp_path_factory.mktemp("tls-core")
    with serving("core", workdir, "--tls-cert", str(cert), "--tls-key", str(key)) as proc:
        yield proc


def _trusting(ca: Authority) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca.cert))


def _queue() -> str:
    return f"queue/tls-{uuid.uuid4().hex[:12]}"


async def _receive(port: int, ctx: ssl.SSLContext, queue: str) -> bytes:
    async with await Client.connect("127.0.0.1", port, ssl=ctx) as client:
        sub = await client.subscribe(queue, ack_mode="client")
        delivery = await asyncio.wait_for(sub.get(TIMEOUT), TIMEOUT)
        delivery.ack()
        return delivery.message.body


def test_polymq_client_publishes_and_consumes_over_tls(core: PolymqProcess, ca: Authority) -> None:
    async def main() -> bytes:
        queue = _queue()
        port = core.ports["core"]
        async with await Client.connect("127.0.0.1", port, ssl=_trusting(ca)) as client:
            published = await client.publish(queue, b"over tls")
            assert published.count == 1
        return await _receive(port, _trusting(ca), queue)

    assert asyncio.run(main()) == b"over tls"


def test_a_plain_or_untrusting_client_cannot_use_the_wire_port(core: PolymqProcess) -> None:
    async def main() -> None:
        port = core.ports["core"]
        # plain: the core closes it (its Hello is no TLS handshake)
        with pytest.raises(ConnectionClosed, match="closed the connection"):
            await Client.connect("127.0.0.1", port, timeout=5)
        # TLS, but with the system's CAs only: the core's certificate is not one of theirs
        with pytest.raises(ConnectionClosed, match="certificate verify failed"):
            await Client.connect("127.0.0.1", port, ssl=True, timeout=5)

    asyncio.run(main())


def test_the_admin_port_speaks_https_only(core: PolymqProcess, ca: Authority) -> None:
    base = f"https://127.0.0.1:{core.ports['admin']}"
    for path in ("/healthz", "/readyz", "/metrics"):
        r = requests.get(base + path, verify=str(ca.cert), timeout=TIMEOUT)
        assert r.status_code == 200, (path, r.text)
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{core.ports['admin']}/healthz", timeout=TIMEOUT)
    assert f"polymq admin      listening on {base}" in core.log()


@pytest.mark.parametrize(("frontend", "admin"), [("http", "http"), ("amqp", "amqp_admin")])
def test_a_frontend_links_to_the_core_over_tls(
    frontend: str, admin: str, core: PolymqProcess, ca: Authority, tmp_path: Path
) -> None:
    """An aiohttp frontend (HTTP) and a session one (AMQP), each given the CA: ready (linked
    to the core), and a message published through HTTP is the core's."""
    args = ("--core", f"127.0.0.1:{core.ports['core']}", "--core-tls-ca", str(ca.cert))
    with serving(frontend, tmp_path / frontend, *args) as proc:
        deadline = time.monotonic() + TIMEOUT
        while (r := requests.get(f"{proc.url(admin)}/readyz", timeout=TIMEOUT)).status_code != 200:
            assert time.monotonic() < deadline, r.text
            time.sleep(0.1)
        if frontend == "http":
            queue = _queue()
            kind, name = queue.split("/")
            r = requests.post(
                f"{proc.url()}/v1/{kind}/{name}/messages", json={"body": "x"}, timeout=TIMEOUT
            )
            assert r.status_code in (200, 201), r.text
            assert asyncio.run(_receive(core.ports["core"], _trusting(ca), queue)) == b"x"


def test_polymq_check_reaches_the_core_over_tls(core: PolymqProcess, ca: Authority) -> None:
    """``polymq check --core tls://HOST:PORT``: the certificate checked against the system's
    CAs, which ``SSL_CERT_FILE`` names here (OpenSSL's own variable)."""
    address = f"tls://127.0.0.1:{core.ports['core']}"
    done = subprocess.run(
        [sys.executable, "-m", "polymq_cli", "check", "--core", address, "--timeout", "20"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SSL_CERT_FILE": str(ca.cert)},
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "ok" in done.stdout, done.stdout
