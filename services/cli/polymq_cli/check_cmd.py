"""``polymq check``: publish one message through each frontend given and consume it back
(the chart's ``helm test``, or a smoke test of any deployment).

::

    polymq check [--http URL] [--longpoll URL] [--avro URL] [--stomp HOST:PORT]
                 [--amqp URL] [--core HOST:PORT] [--timeout S] [--insecure]
                 [--user U --password P | --token T]

For each address given, one fresh queue (``queue/polymq-check-<random>``) gets one message
with a random body through that frontend's own protocol, and the same frontend must hand that
body back: JSON over HTTP (publish, pull with a wait, ack), long polling (open a
subscription, publish, poll, close), Avro over HTTP (a one-record object container in, the
container read back, ack), STOMP (CONNECT, SUBSCRIBE with a receipt, SEND with a receipt,
the MESSAGE, DISCONNECT; the project's sans-IO codec in the client role), AMQP 0-9-1
(aio-pika: declare, publish with a confirm, basic.get, ack, delete) and the core's wire
protocol (``polymq.Client``). The frontends run at once; each has ``--timeout`` seconds.

One line per frontend, ``ok`` with the time taken or ``FAILED`` with the reason; exit 0
when every one passed, 1 otherwise, 2 when no address was given. Logins: ``--user`` and
``--password`` (HTTP Basic, STOMP login/passcode, AMQP PLAIN, the core's), or ``--token``
(HTTP Bearer, the core's; STOMP and AMQP take passwords only), from ``POLYMQ_CHECK_USER``,
``POLYMQ_CHECK_PASSWORD`` and ``POLYMQ_CHECK_TOKEN`` by default. TLS: ``https://``,
``amqps://``, ``--stomp stomp+ssl://HOST:PORT`` and ``--core tls://HOST:PORT``;
``--insecure`` skips checking the certificate (a Service's name is rarely in it).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import os
import secrets
import ssl
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TextIO

__all__ = ["FRONTENDS", "CheckFailed", "Login", "add_arguments", "check_all", "run"]

FRONTENDS = ("http", "longpoll", "avro", "stomp", "amqp", "core")
_WAIT = 5  # seconds one pull or poll may wait on the server
_SCHEMA = {
    "type": "record",
    "name": "Check",
    "namespace": "polymq.check",
    "fields": [{"name": "token", "type": "string"}],
}


class CheckFailed(Exception):
    """Why one frontend's check failed (printed after ``FAILED``)."""


@dataclass(frozen=True)
class Login:
    user: str = ""
    password: str = ""
    token: str = ""
    insecure: bool = False

    def http_headers(self) -> dict[str, str]:
        if self.token:
            return {"Authorization": f"Bearer {self.token}"}
        return {}

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.insecure:
            return True
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``check`` to ``polymq``'s sub-commands."""
    p = sub.add_parser(
        "check",
        help="publish and consume one message through each frontend given",
        description="Publish one message through each given frontend and consume it back "
        "through the same frontend; one line each, exit 1 if any failed.",
    )
    p.add_argument("--http", metavar="URL", help="the JSON over HTTP frontend, http(s)://H:P")
    p.add_argument("--longpoll", metavar="URL", help="the long-polling frontend, http(s)://H:P")
    p.add_argument("--avro", metavar="URL", help="the Avro over HTTP frontend, http(s)://H:P")
    p.add_argument(
        "--stomp", metavar="HOST:PORT", help="STOMP over TCP (stomp+ssl://HOST:PORT: over TLS)"
    )
    p.add_argument("--amqp", metavar="URL", help="the AMQP frontend, amqp(s)://H:P[/vhost]")
    p.add_argument(
        "--core", metavar="HOST:PORT", help="the core's wire protocol (tls://HOST:PORT: over TLS)"
    )
    p.add_argument(
        "--timeout", type=float, default=30.0, metavar="S", help="seconds per frontend (30)"
    )
    p.add_argument("--insecure", action="store_true", help="do not check TLS certificates")
    p.add_argument("--user", default=os.environ.get("POLYMQ_CHECK_USER", ""))
    p.add_argument("--password", default=os.environ.get("POLYMQ_CHECK_PASSWORD", ""))
    p.add_argument("--token", default=os.environ.get("POLYMQ_CHECK_TOKEN", ""))
    p.add_argument("--log-level", default=os.environ.get("POLYMQ_LOG_LEVEL", "WARNING"))


def _name() -> str:
    return f"polymq-check-{secrets.token_hex(6)}"


def _hostport(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit():
        raise CheckFailed(f"{what} {text!r}: expected HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def _expect(got: bytes | str, want: str, where: str) -> None:
    text = got.decode(errors="replace") if isinstance(got, bytes) else got
    if text != want:
        raise CheckFailed(f"{where}: got body {text[:60]!r}, not the one sent")


# ---- the HTTP frontends (aiohttp) ----------------------------------------------------------
async def _json(response: Any, status: int, what: str) -> Any:
    if response.status != status:
        text = (await response.text())[:200].strip()
        raise CheckFailed(f"{what}: HTTP {response.status} {text}")
    if status == 204:
        return None
    return await response.json(content_type=None)


def _session(base: str, login: Login) -> Any:
    import aiohttp

    auth = None
    if login.user and not login.token:
        auth = aiohttp.BasicAuth(login.user, login.password)
    return aiohttp.ClientSession(
        base_url=base.rstrip("/") + "/",
        auth=auth,
        headers=login.http_headers(),
        connector=aiohttp.TCPConnector(ssl=login.ssl_context()),
    )


async def check_http(url: str, login: Login) -> None:
    name, body = _name(), secrets.token_hex(8)
    async with _session(url, login) as s:
        async with s.post(f"v1/queue/{name}/messages", json={"body": body}) as r:
            await _json(r, 200, "publish")
        async with s.post(f"v1/queue/{name}/pull", params={"max": "1", "wait": str(_WAIT)}) as r:
            messages = (await _json(r, 200, "pull"))["messages"]
        if not messages:
            raise CheckFailed(f"pull: nothing came back within {_WAIT} s")
        _expect(messages[0]["body"], body, "pull")
        async with s.post("v1/ack", json={"receipts": [messages[0]["receipt"]]}) as r:
            await _json(r, 200, "ack")


async def check_longpoll(url: str, login: Login) -> None:
    name, body = _name(), secrets.token_hex(8)
    async with _session(url, login) as s:
        opened = {"destination": f"queue/{name}", "ack": "auto"}
        async with s.post("v1/subscriptions", json=opened) as r:
            sub = await _json(r, 201, "open a subscription")
        try:
            async with s.post(f"v1/queue/{name}/messages", json={"body": body}) as r:
                await _json(r, 200, "publish")
            query = {"cursor": sub["cursor"], "wait": str(_WAIT)}
            async with s.get(sub["poll"].lstrip("/"), params=query) as r:
                messages = (await _json(r, 200, "poll"))["messages"]
            if not messages:
                raise CheckFailed(f"poll: nothing came back within {_WAIT} s")
            _expect(messages[0]["body"], body, "poll")
        finally:
            async with s.delete(f"v1/subscriptions/{sub['id']}") as r:
                await _json(r, 204, "close the subscription")


async def check_avro(url: str, login: Login) -> None:
    import fastavro

    name, body = _name(), secrets.token_hex(8)
    out = io.BytesIO()
    fastavro.writer(out, fastavro.parse_schema(_SCHEMA), [{"token": body}])
    async with _session(url, login) as s:
        headers = {"Content-Type": "application/avro"}
        async with s.post(f"v1/queue/{name}/records", data=out.getvalue(), headers=headers) as r:
            await _json(r, 200, "publish a record")
        params = {"max": "1", "wait": str(_WAIT)}
        async with s.get(f"v1/queue/{name}/records", params=params) as r:
            if r.status == 204:
                raise CheckFailed(f"read: nothing came back within {_WAIT} s")
            if r.status != 200:
                raise CheckFailed(f"read: HTTP {r.status} {(await r.text())[:200].strip()}")
            data = await r.read()
        reader = fastavro.reader(io.BytesIO(data))
        records = list(reader)
        if not records or not isinstance(records[0], dict):
            raise CheckFailed("read: an empty container")
        _expect(str(records[0].get("token")), body, "read")
        receipts = json.loads(reader.metadata["polymq.receipts"])
        async with s.post("v1/ack", json={"receipts": receipts}) as r:
            await _json(r, 200, "ack")


# ---- STOMP (the project's sans-IO codec, client side) ----------------------------------------
async def check_stomp(address: str, login: Login) -> None:
    from polymq_stomp.codec import CLOSED, NEED_DATA, Role, StompConnection
    from polymq_stomp.frames import Command, Frame

    scheme, sep, rest = address.partition("://")
    tls = sep and scheme in ("stomp+ssl", "stomps", "ssl")
    host, port = _hostport(rest if sep else address, "--stomp")
    name, body = _name(), secrets.token_hex(8)
    conn = StompConnection(Role.CLIENT)
    context = login.ssl_context() if tls else None
    reader, writer = await asyncio.open_connection(
        host, port, ssl=ssl.create_default_context() if context is True else context or None
    )

    async def frame() -> Frame:
        while True:
            event = conn.next_event()
            if event is NEED_DATA:
                data = await reader.read(65536)
                if not data:
                    raise CheckFailed("the server closed the connection")
                conn.receive_data(data)
            elif event is CLOSED:
                raise CheckFailed("the server closed the connection")
            elif isinstance(event, Frame):
                if event.command is Command.ERROR:
                    why = event.get("message") or event.body.decode(errors="replace")
                    raise CheckFailed(f"ERROR frame: {why[:200]}")
                return event

    async def until(command: Command, **headers: str) -> Frame:
        while True:
            got = await frame()
            if got.command is command and all(got.get(k) == v for k, v in headers.items()):
                return got

    try:
        connect = [("accept-version", "1.2"), ("host", "/"), ("heart-beat", "0,0")]
        if login.user:
            connect += [("login", login.user), ("passcode", login.password)]
        writer.write(conn.send(Frame(Command.CONNECT, tuple(connect))))
        connected = await until(Command.CONNECTED)
        conn.negotiate(connected.get("version") or "1.0")
        dest = f"/queue/{name}"
        writer.write(
            conn.send(
                Frame(
                    Command.SUBSCRIBE,
                    (("destination", dest), ("id", "1"), ("ack", "auto"), ("receipt", "sub")),
                )
            )
        )
        await until(Command.RECEIPT, **{"receipt-id": "sub"})
        sent = (("destination", dest), ("content-type", "text/plain"), ("receipt", "send"))
        writer.write(conn.send(Frame(Command.SEND, sent, body.encode())))
        message = await until(Command.MESSAGE)
        _expect(message.body, body, "MESSAGE")
        writer.write(conn.send(Frame(Command.DISCONNECT, (("receipt", "bye"),))))
        await until(Command.RECEIPT, **{"receipt-id": "bye"})
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass


# ---- AMQP 0-9-1 (aio-pika) ---------------------------------------------------------------------
async def check_amqp(url: str, login: Login) -> None:
    import aio_pika
    import yarl

    target = yarl.URL(url)
    if login.user and not target.user:
        target = target.with_user(login.user).with_password(login.password)
    name, body = _name(), secrets.token_hex(8)
    kwargs: dict[str, Any] = {}
    if target.scheme == "amqps" and login.insecure:
        kwargs["ssl_context"] = login.ssl_context()
    connection = await aio_pika.connect(target, **kwargs)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(name, durable=False)
        try:
            await channel.default_exchange.publish(
                aio_pika.Message(body.encode(), content_type="text/plain"), routing_key=name
            )
            deadline = time.monotonic() + _WAIT
            while True:
                got = await queue.get(no_ack=False, fail=False)
                if got is not None:
                    break
                if time.monotonic() > deadline:
                    raise CheckFailed(f"basic.get: nothing came back within {_WAIT} s")
                await asyncio.sleep(0.1)
            _expect(got.body, body, "basic.get")
            await got.ack()
        finally:
            await queue.delete(if_unused=False, if_empty=False)


# ---- the core's wire protocol ------------------------------------------------------------------
async def check_core(address: str, login: Login) -> None:
    from polymq.client import Client

    scheme, sep, rest = address.partition("://")
    tls = bool(sep) and scheme in ("tls", "ssl")  # a core started with --tls-cert
    host, port = _hostport(rest if sep else address, "--core")
    name, body = _name(), secrets.token_hex(8)
    client = await Client.connect(
        host,
        port,
        client="polymq-check",
        user=login.user or None,
        password=login.password or None,
        token=login.token or None,
        ssl=login.ssl_context() if tls else None,
    )
    try:
        await client.publish(f"queue/{name}", body)
        leases = await client.pull(f"queue/{name}", 1, wait=_WAIT)
        if not leases:
            raise CheckFailed(f"pull: nothing came back within {_WAIT} s")
        _expect(leases[0].message.body, body, "pull")
        await client.settle([leases[0].receipt])
    finally:
        await client.close()


_CHECKS: dict[str, Callable[[str, Login], Awaitable[None]]] = {
    "http": check_http,
    "longpoll": check_longpoll,
    "avro": check_avro,
    "stomp": check_stomp,
    "amqp": check_amqp,
    "core": check_core,
}


def _reason(exc: BaseException) -> str:
    if isinstance(exc, CheckFailed):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = str(exc) or type(exc).__name__
    if isinstance(exc, OSError):
        return f"cannot connect: {text}"
    return f"{type(exc).__name__}: {text}"


def _shown(address: str) -> str:
    """``address`` as printed: a password in a URL masked."""
    scheme, sep, rest = address.partition("://")
    userinfo, at, hostpart = rest.rpartition("@")
    if sep and at and ":" in userinfo:
        return f"{scheme}://{userinfo.partition(':')[0]}:***@{hostpart}"
    return address


async def _one(kind: str, address: str, login: Login, timeout: float) -> tuple[bool, str]:
    started = time.monotonic()
    try:
        await asyncio.wait_for(_CHECKS[kind](address, login), timeout)
    except asyncio.CancelledError:
        raise
    except TimeoutError:
        return False, f"timed out after {timeout:g} s"
    except Exception as exc:
        return False, _reason(exc)
    return True, f"{time.monotonic() - started:.2f} s"


async def check_all(
    targets: dict[str, str], login: Login, timeout: float
) -> dict[str, tuple[bool, str]]:
    """Every check at once: kind -> (passed, the time taken or why it failed)."""
    kinds = [k for k in FRONTENDS if k in targets]
    results = await asyncio.gather(*(_one(k, targets[k], login, timeout) for k in kinds))
    return dict(zip(kinds, results, strict=True))


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``polymq check``; the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    targets = {k: getattr(args, k) for k in FRONTENDS if getattr(args, k, None)}
    if not targets:
        flags = ", ".join(f"--{k}" for k in FRONTENDS)
        print(f"polymq check: nothing to check: give at least one of {flags}", file=err)
        return 2
    login = Login(args.user, args.password, args.token, args.insecure)
    logging.getLogger("aiormq").setLevel(logging.CRITICAL)  # its failures are in our lines
    results = asyncio.run(check_all(targets, login, args.timeout))
    for kind, (passed, detail) in results.items():
        verdict = "ok" if passed else "FAILED"
        print(f"{kind:<9} {_shown(targets[kind])}  {verdict} ({detail})", file=out, flush=True)
    return 0 if all(passed for passed, _ in results.values()) else 1
