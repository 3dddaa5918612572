"""TLS on the aiohttp frontends: ``polymq http``, ``polymq longpoll`` and ``polymq avro`` with
``--tls-cert``/``--tls-key`` (or ``POLYMQ_TLS_CERT``/``POLYMQ_TLS_KEY``) serve HTTPS on their
one port and nothing else there, against a core in another process; ``polymq run`` puts
every frontend listener on TLS and leaves the core's admin port and AMQP's plain; a
certificate or key that is missing, unreadable or does not load stops the service at
start-up with a configuration error (exit 2) that names it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import requests

from ...procs import PolymqProcess, serving

pytestmark = pytest.mark.skipif(
    shutil.which("openssl") is None, reason="needs openssl to make a certificate"
)

FRONTENDS = ("http", "longpoll", "avro")
TIMEOUT = 10.0


def make_cert(directory: Path, name: str = "server") -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA) and its unencrypted key."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_cert(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    with serving("core", tmp_path_factory.mktemp("tls-core")) as proc:
        yield proc


@pytest.fixture(scope="module", params=FRONTENDS)
def frontend(
    request: pytest.FixtureRequest,
    core: PolymqProcess,
    pki: tuple[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PolymqProcess]:
    """One frontend with the certificate, against the core; its flags name it (avro: by
    POLYMQ_TLS_CERT/POLYMQ_TLS_KEY instead, the other way to set it)."""
    name: str = request.param
    cert, key = pki
    workdir = tmp_path_factory.mktemp(f"tls-{name}")
    args = ["--core", f"127.0.0.1:{core.ports['core']}"]
    env: dict[str, str] = {}
    if name == "avro":
        env = {"POLYMQ_TLS_CERT": str(cert), "POLYMQ_TLS_KEY": str(key)}
    else:
        args += ["--tls-cert", str(cert), "--tls-key", str(key)]
    with serving(name, workdir, *args, env=env) as proc:
        yield proc


def https(proc: PolymqProcess, name: str | None = None) -> str:
    return f"https://127.0.0.1:{proc.ports[name or proc.command]}"


def ready(base: str, cafile: Path) -> requests.Response:
    """``GET /readyz`` until 200 (the frontend connects to the core) or the timeout."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        r = requests.get(base + "/readyz", verify=str(cafile), timeout=TIMEOUT)
        if r.status_code == 200 or time.monotonic() > deadline:
            return r
        time.sleep(0.1)


def unique(prefix: str = "tls") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# ---- one frontend, TLS on its port ------------------------------------------------------------
def test_health_readiness_and_metrics_answer_over_https(
    frontend: PolymqProcess, pki: tuple[Path, Path]
) -> None:
    cert, _ = pki
    base = https(frontend)
    r = requests.get(base + "/healthz", verify=str(cert), timeout=TIMEOUT)
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    r = ready(base, cert)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "ready"
    r = requests.get(base + "/metrics", verify=str(cert), timeout=TIMEOUT)
    assert r.status_code == 200
    assert f"# TYPE polymq_{frontend.command}_requests" in r.text


def test_the_start_up_line_says_https(frontend: PolymqProcess) -> None:
    assert f"on https://127.0.0.1:{frontend.ports[frontend.command]}/ " in frontend.log()
    assert "http://127.0.0.1" not in frontend.log()


def test_plain_http_on_the_tls_port_gets_no_answer(
    frontend: PolymqProcess, pki: tuple[Path, Path]
) -> None:
    port = frontend.ports[frontend.command]
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/healthz", timeout=TIMEOUT)
    # what the server does with it: closes the connection without a byte of HTTP
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        received = b""
        while chunk := s.recv(4096):
            received += chunk
    assert b"HTTP/" not in received and b"ok" not in received, received
    # and it still serves TLS afterwards
    assert requests.get(https(frontend) + "/healthz", verify=str(pki[0]), timeout=TIMEOUT).ok


def test_the_certificate_is_the_one_given(frontend: PolymqProcess, tmp_path: Path) -> None:
    """A client that trusts another CA refuses the connection: it is this certificate."""
    other, _ = make_cert(tmp_path, "other")
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(https(frontend) + "/healthz", verify=str(other), timeout=TIMEOUT)


async def _round_trip(name: str, base: str, cafile: Path) -> None:
    """What each frontend is for, through aiohttp's client over TLS with the CA."""
    ctx = ssl.create_default_context(cafile=str(cafile))
    timeout = aiohttp.ClientTimeout(total=TIMEOUT * 2)
    async with aiohttp.ClientSession(base, timeout=timeout) as s:
        q = unique()
        if name == "http":
            async with s.post(f"/v1/queue/{q}/messages", json={"body": "secret"}, ssl=ctx) as r:
                assert r.status == 200, await r.text()
            async with s.post(f"/v1/queue/{q}/pull", params={"wait": "5"}, ssl=ctx) as r:
                assert r.status == 200, await r.text()
                assert [m["body"] for m in (await r.json())["messages"]] == ["secret"]
        elif name == "longpoll":
            body = {"destination": f"queue/{q}"}
            async with s.post("/v1/subscriptions", json=body, ssl=ctx) as r:
                assert r.status == 201, await r.text()
                sub = (await r.json())["id"]
            async with s.post(f"/v1/queue/{q}/messages", json={"body": "secret"}, ssl=ctx) as r:
                assert r.status == 200, await r.text()
            async with s.get(f"/v1/subscriptions/{sub}/poll", params={"wait": "5"}, ssl=ctx) as r:
                assert r.status == 200, await r.text()
                assert [m["body"] for m in (await r.json())["messages"]] == ["secret"]
        else:
            schema = {"type": "record", "name": "T", "fields": [{"name": "a", "type": "int"}]}
            path = f"/v1/schemas/subjects/{q}/versions"
            async with s.post(path, json={"schema": json.dumps(schema)}, ssl=ctx) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["version"] == 1
            async with s.get(f"{path}/latest", ssl=ctx) as r:
                assert r.status == 200, await r.text()
                assert json.loads((await r.json())["schema"]) == schema


def test_the_api_works_over_https_with_aiohttp(
    frontend: PolymqProcess, pki: tuple[Path, Path]
) -> None:
    cert, _ = pki
    assert ready(https(frontend), cert).status_code == 200
    asyncio.run(_round_trip(frontend.command, https(frontend), cert))


# ---- polymq run: every frontend listener ------------------------------------------------------
def test_run_puts_every_frontend_listener_on_tls_and_leaves_the_core_plain(
    pki: tuple[Path, Path], tmp_path: Path
) -> None:
    cert, key = pki
    tls = ("--tls-cert", str(cert), "--tls-key", str(key))
    with serving("run", tmp_path / "run", *tls) as proc:
        for name in (*FRONTENDS, "stomp_ws"):
            r = ready(https(proc, name), cert)
            assert r.status_code == 200, (name, r.text)
            with pytest.raises(requests.ConnectionError):
                requests.get(f"http://127.0.0.1:{proc.ports[name]}/healthz", timeout=TIMEOUT)
            assert f"polymq {name:<10} listening on https://127.0.0.1:{proc.ports[name]}" in (
                proc.log()
            )
        # the core's admin port and AMQP's admin port stay plain HTTP
        for name in ("admin", "amqp_admin"):
            r = requests.get(f"http://127.0.0.1:{proc.ports[name]}/healthz", timeout=TIMEOUT)
            assert r.status_code == 200, (name, r.text)
        for name in FRONTENDS:
            asyncio.run(_round_trip(name, https(proc, name), cert))


# ---- bad certificates and keys: exit 2 at start-up --------------------------------------------
def _bad_files(tmp: Path, cert: Path, key: Path) -> dict[str, tuple[list[str], list[str]]]:
    """case -> (the flags, what the error must say)."""
    other_cert, other_key = make_cert(tmp, "other")
    garbage = tmp / "garbage.pem"
    garbage.write_text("not a certificate\n")
    encrypted = tmp / "encrypted.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(key), "-aes256", "-passout", "pass:pw",
         "-out", str(encrypted)],
        check=True, capture_output=True,
    )  # fmt: skip
    return {
        "cert-without-key": (["--tls-cert", str(cert)], ["POLYMQ_TLS_KEY", "--tls-key"]),
        "key-without-cert": (["--tls-key", str(key)], ["POLYMQ_TLS_CERT", "--tls-cert"]),
        "missing-cert": (
            ["--tls-cert", str(tmp / "nope.crt"), "--tls-key", str(key)],
            ["POLYMQ_TLS_CERT", "nope.crt", "no such file"],
        ),
        "missing-key": (
            ["--tls-cert", str(cert), "--tls-key", str(tmp / "nope.key")],
            ["POLYMQ_TLS_KEY", "nope.key", "no such file"],
        ),
        "directory": (
            ["--tls-cert", str(tmp), "--tls-key", str(key)],
            ["POLYMQ_TLS_CERT", "a directory"],
        ),
        "not-a-certificate": (
            ["--tls-cert", str(garbage), "--tls-key", str(key)],
            ["POLYMQ_TLS_CERT", "garbage.pem", "not a PEM certificate"],
        ),
        "not-a-key": (
            ["--tls-cert", str(cert), "--tls-key", str(other_cert)],
            ["POLYMQ_TLS_KEY", "other.crt", "not a PEM private key"],
        ),
        "key-of-another-cert": (
            ["--tls-cert", str(cert), "--tls-key", str(other_key)],
            ["other.key", "is not the private key of", "server.crt"],
        ),
        "encrypted-key": (
            ["--tls-cert", str(cert), "--tls-key", str(encrypted)],
            ["POLYMQ_TLS_KEY", "encrypted"],
        ),
    }


BAD_CASES = [
    "cert-without-key",
    "key-without-cert",
    "missing-cert",
    "missing-key",
    "directory",
    "not-a-certificate",
    "not-a-key",
    "key-of-another-cert",
    "encrypted-key",
]


def _polymq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polymq_cli", *args],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,  # an encrypted key must not prompt for its password
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def bad_files(
    pki: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[list[str], list[str]]]:
    cert, key = pki
    return _bad_files(tmp_path_factory.mktemp("bad-tls"), cert, key)


@pytest.mark.parametrize("case", BAD_CASES)
@pytest.mark.parametrize("name", FRONTENDS)
def test_a_bad_certificate_or_key_is_a_configuration_error(
    name: str, case: str, bad_files: dict[str, tuple[list[str], list[str]]]
) -> None:
    flags, hints = bad_files[case]
    # the core is never reached: the settings are refused before anything listens
    r = _polymq(name, f"--{name}-port", "0", "--core", "127.0.0.1:1", *flags)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    [line] = [x for x in r.stderr.splitlines() if x.startswith("polymq: configuration error:")]
    for hint in hints:
        assert hint in line, (hint, line)
    assert "Traceback" not in r.stderr


def test_the_environment_variables_are_checked_the_same_way(tmp_path: Path) -> None:
    r = _polymq(
        "longpoll", "--longpoll-port", "0", "--core", "127.0.0.1:1",
        env={"POLYMQ_TLS_CERT": str(tmp_path / "nope.crt"), "POLYMQ_TLS_KEY": "/x"},
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "POLYMQ_TLS_CERT=" in r.stderr and "no such file" in r.stderr


def test_run_refuses_a_bad_certificate_before_serving(
    bad_files: dict[str, tuple[list[str], list[str]]], tmp_path: Path
) -> None:
    flags, hints = bad_files["key-of-another-cert"]
    ports = [f"--{p}-port" for p in ("core", "admin", "http", "stomp", "stomp-ws", "longpoll",
                                     "avro", "amqp", "amqp-admin", "amqp-tls")]  # fmt: skip
    r = _polymq("run", *(a for p in ports for a in (p, "0")), "--data-dir", str(tmp_path), *flags)
    assert r.returncode == 2, r.stderr[-2000:]
    assert all(hint in r.stderr for hint in hints), r.stderr[-2000:]
    assert "polymq ready" not in r.stdout


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_key_is_a_configuration_error(pki: tuple[Path, Path], tmp_path: Path) -> None:
    cert, key = pki
    locked = tmp_path / "locked.key"
    shutil.copy(key, locked)
    locked.chmod(0)
    r = _polymq("http", "--http-port", "0", "--core", "127.0.0.1:1",
                "--tls-cert", str(cert), "--tls-key", str(locked))  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "POLYMQ_TLS_KEY=" in r.stderr and "not readable by this process" in r.stderr
