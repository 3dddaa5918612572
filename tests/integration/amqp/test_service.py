"""``polymq amqp`` on its own, against a core in another process: TLS, vhosts, and what
clients see when the core goes away and comes back."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aio_pika
import pika
import pytest
import requests

from polymq_server.auth.provider import hash_password

from ...pki import HAVE_OPENSSL, Authority
from ...procs import PolymqProcess
from .helpers import WAIT, Broker, eventually, unique

pytestmark = pytest.mark.timeout(90)
Connect = Callable[..., pika.BlockingConnection]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make a certificate")
def test_standalone_frontend_over_tls(broker: Broker, tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    args = ("--core", f"127.0.0.1:{broker.ports['core']}", "--tls-cert", str(cert))
    with PolymqProcess("amqp", tmp_path / "amqp", *args, "--tls-key", str(key)) as amqp:
        assert set(amqp.ports) == {"amqp", "amqp_tls", "amqp_admin"}
        ctx = ssl.create_default_context(cafile=str(cert))
        params = pika.ConnectionParameters(
            "127.0.0.1", amqp.ports["amqp_tls"], ssl_options=pika.SSLOptions(ctx, "127.0.0.1")
        )
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        q = unique("q")
        ch.queue_declare(q)
        ch.basic_publish("", q, b"over tls")
        conn.close()
        # the same core behind both frontends: the shared broker's AMQP sees the message
        plain = pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", broker.amqp_port)
        ).channel()
        _m, _p, body = plain.basic_get(q, auto_ack=True)
        assert body == b"over tls"
        plain.connection.close()
        assert amqp.stop() == 0, amqp.log()


@pytest.mark.skipif(not HAVE_OPENSSL, reason="needs openssl to make a certificate")
@pytest.mark.parametrize("how", ["flag", "environment"])
def test_plain_amqp_off_leaves_amqp_over_tls_alone(
    how: str, broker: Broker, tmp_path: Path
) -> None:
    """``--amqp-port off`` (or ``POLYMQ_AMQP_PLAIN=false``) with a certificate: aio-pika
    and pika connect over TLS, and nothing listens for plain AMQP."""
    ca = Authority.make(tmp_path / "pki")
    cert, key = ca.issue("amqp")
    with socket.socket() as probe:  # a port nobody listens on (for the environment's case)
        probe.bind(("127.0.0.1", 0))
        plain_port = probe.getsockname()[1]
    args = ["--core", f"127.0.0.1:{broker.ports['core']}"]
    args += ["--tls-cert", str(cert), "--tls-key", str(key)]
    env: dict[str, str] = {}
    if how == "flag":
        args += ["--amqp-port", "off"]
    else:  # the port named, its listener off
        args += ["--amqp-port", str(plain_port)]
        env["POLYMQ_AMQP_PLAIN"] = "false"
    with PolymqProcess("amqp", tmp_path / "amqp", *args, env=env) as amqp:
        assert set(amqp.ports) == {"amqp_tls", "amqp_admin"}, amqp.ports
        assert "amqp       listening" not in amqp.log()
        ctx = ssl.create_default_context(cafile=str(ca.cert))
        params = pika.ConnectionParameters(
            "127.0.0.1", amqp.ports["amqp_tls"], ssl_options=pika.SSLOptions(ctx, "127.0.0.1")
        )
        q = unique("q")
        with pika.BlockingConnection(params) as conn:
            ch = conn.channel()
            ch.queue_declare(q)
            ch.basic_publish("", q, b"tls only")

        async def consume() -> bytes:
            url = f"amqps://guest:guest@127.0.0.1:{amqp.ports['amqp_tls']}/"
            async with await aio_pika.connect(url, ssl_context=ctx) as conn:
                queue = await (await conn.channel()).get_queue(q)
                message = await queue.get(timeout=WAIT)
                await message.ack()
                return message.body

        assert asyncio.run(consume()) == b"tls only"
        if how == "environment":
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", plain_port), timeout=WAIT).close()
        assert amqp.stop() == 0, amqp.log()


def test_plain_amqp_off_without_a_certificate_is_a_configuration_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "polymq_cli", "amqp", "--amqp-port", "off",
         "--amqp-admin-port", "0", "--amqp-tls-port", "0"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "POLYMQ_AMQP_PLAIN=false" in done.stderr and "--tls-cert" in done.stderr, done.stderr


def test_vhosts_are_separate(connect: Connect) -> None:
    default = connect().channel()
    other = connect(virtual_host="other").channel()
    q, ex = unique("q"), unique("ex")
    for ch in (default, other):
        ch.exchange_declare(ex, "fanout")
        ch.queue_declare(q)
        ch.queue_bind(q, ex)
    default.basic_publish(ex, "", b"in /")
    other.basic_publish(ex, "", b"in other")
    other.basic_publish("", q, b"default exchange of other")
    assert default.basic_get(q, auto_ack=True)[2] == b"in /"
    assert default.basic_get(q)[0] is None
    assert other.basic_get(q, auto_ack=True)[2] == b"in other"
    assert other.basic_get(q, auto_ack=True)[2] == b"default exchange of other"
    other.exchange_delete(ex)
    default.exchange_declare(ex, passive=True)  # still there in /


def test_core_going_away_and_coming_back(tmp_path: Path) -> None:
    core = PolymqProcess("core", tmp_path / "core").start()
    amqp = None
    try:
        core_port = core.ports["core"]
        amqp = PolymqProcess("amqp", tmp_path / "amqp", "--core", f"127.0.0.1:{core_port}")
        amqp.start()
        admin = f"http://127.0.0.1:{amqp.ports['amqp_admin']}"
        params = pika.ConnectionParameters("127.0.0.1", amqp.ports["amqp"])
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        q = unique("durable")
        ch.queue_declare(q, durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", q, b"kept", pika.BasicProperties(delivery_mode=2))
        core.kill()  # no goodbye
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            deadline = time.monotonic() + WAIT
            while time.monotonic() < deadline:
                conn.process_data_events(time_limit=0.1)
        assert info.value.reply_code == 320
        eventually(lambda: requests.get(f"{admin}/readyz", timeout=WAIT).status_code == 503)
        core = PolymqProcess(
            "core", tmp_path / "core", "--core-port", str(core_port), "--data-dir",
            str(tmp_path / "core" / "data"),
        ).start()  # fmt: skip
        eventually(lambda: requests.get(f"{admin}/readyz", timeout=WAIT).status_code == 200, 20)
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        assert ch.queue_declare(q, durable=True).method.message_count == 1
        _m, props, body = ch.basic_get(q, auto_ack=True)
        assert (body, props.delivery_mode) == (b"kept", 2)
        conn.close()
        assert amqp.stop() == 0, amqp.log()
    finally:
        if amqp is not None:
            amqp.kill()
        core.kill()


def test_logins_and_permissions_from_a_users_file(tmp_path: Path) -> None:
    users = tmp_path / "users.json"
    grants = [{"pattern": "queue/ok.*", "permissions": ["read", "write", "configure"]}]
    users.write_text(
        json.dumps(
            {"users": {"alice": {"password_hash": hash_password("s3cret"), "grants": grants}}}
        )
    )
    with PolymqProcess("run", tmp_path / "run", "--auth", f"file:{users}") as run:
        port = run.ports["amqp"]

        def login(user: str, password: str) -> pika.BlockingConnection:
            creds = pika.PlainCredentials(user, password)
            return pika.BlockingConnection(
                pika.ConnectionParameters("127.0.0.1", port, credentials=creds)
            )

        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
            login("alice", "wrong")
        assert "ACCESS_REFUSED" in str(info.value)
        conn = login("alice", "s3cret")
        ch = conn.channel()
        q = f"ok.{unique()}"
        ch.queue_declare(q)
        ch.basic_publish("", q, b"allowed", pika.BasicProperties(user_id="alice"))
        assert ch.basic_get(q, auto_ack=True)[2] == b"allowed"
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as cinfo:
            ch.queue_declare(unique("forbidden"))
        assert cinfo.value.reply_code == 403
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as cinfo:
            ch.exchange_declare(unique("ex"), "topic")
        assert cinfo.value.reply_code == 403
        conn.close()
        # connection.update-secret: a password login never expires (RabbitMQ's internal
        # backend): any new secret is taken, the login and its grants stay
        # (test_update_secret.py has the token logins)
        conn = login("alice", "s3cret")
        conn.update_secret("wrong", "rotation")
        ch = conn.channel()
        ch.queue_declare(f"ok.{unique()}")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as cinfo:
            ch.queue_declare(unique("forbidden"))
        assert cinfo.value.reply_code == 403
        conn.close()
