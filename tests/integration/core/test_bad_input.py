"""Bad input on the core's wire port: the offender is answered (a Fail for one bad request, a
Goodbye before closing for a broken connection) and the core goes on serving everyone else."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest

from polymq import BadRequest, Client, Message, NotFound, PayloadTooLarge
from polymq.codec import PREAMBLE
from polymq.types import Outcome

from ...procs import PolymqProcess
from .helpers import GOODBYE, OK, PING, FrameReader, RawConn, bodies, collect, connect, frame, uid

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(scope="module")
def core(module_core: PolymqProcess) -> PolymqProcess:
    """One core for the module's tests: each uses names of its own, none stops it."""
    return module_core


async def still_serving(core: PolymqProcess) -> None:
    """A normal client can still connect and round-trip a message."""
    q = f"queue/{uid()}"
    async with await connect(core.ports["core"]) as c:
        await c.publish(q, "alive")
        sub = await c.subscribe(q)
        assert bodies(await collect(sub, 1)) == [b"alive"]


def goodbye_of(r: FrameReader) -> list[object]:
    byes = r.of(GOODBYE)
    assert len(byes) == 1, r.ops
    assert r.ops[-1][0] == GOODBYE, "the Goodbye is the last thing said"
    return byes[0]


# ---- connection-level garbage: Goodbye, then close ------------------------------------------


async def test_http_request_on_the_core_port_gets_a_goodbye(core: PolymqProcess) -> None:
    raw = await RawConn.open(core.ports["core"])
    await raw.send(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    r = await raw.read_to_eof(5)
    raw.close()
    _, code, message = goodbye_of(r)
    assert code == "protocol-error"
    assert "preamble" in message
    await still_serving(core)


async def test_random_bytes_after_a_valid_preamble_get_a_goodbye(core: PolymqProcess) -> None:
    raw = await RawConn.open(core.ports["core"])
    payload = b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1"  # a frame whose payload is not msgpack
    await raw.send(PREAMBLE + payload)
    r = await raw.read_to_eof(5)
    raw.close()
    assert goodbye_of(r)[1] == "protocol-error"
    await still_serving(core)


async def test_frame_length_over_the_maximum_gets_a_goodbye(core: PolymqProcess) -> None:
    c = await connect(core.ports["core"])
    max_frame = c.limits["max_frame"]
    await c.close()
    raw = await RawConn.open(core.ports["core"])
    await raw.handshake()
    await raw.send(struct.pack(">I", max_frame + 1) + b"\x90" * 64)  # announce, never send
    r = await raw.read_to_eof(5)
    raw.close()
    _, code, message = goodbye_of(r)
    assert code == "protocol-error"
    assert str(max_frame) in message
    await still_serving(core)


async def test_a_large_frame_before_the_hello_gets_a_goodbye(core: PolymqProcess) -> None:
    """Before a client has logged in, the core takes only small frames (64 KiB): a peer
    nobody knows cannot make it hold a large one (only the length is sent here)."""
    raw = await RawConn.open(core.ports["core"])
    await raw.send(PREAMBLE + struct.pack(">I", 64 * 1024 + 1) + b"\x90" * 64)
    r = await raw.read_to_eof(5)
    raw.close()
    _, code, message = goodbye_of(r)
    assert code == "protocol-error"
    assert "before the Hello" in message and str(64 * 1024) in message
    await still_serving(core)


async def test_sockets_that_do_not_log_in_are_closed_after_the_handshake_timeout(
    tmp_path: Path,
) -> None:
    env = {"POLYMQ_HANDSHAKE_TIMEOUT": "1"}
    with PolymqProcess("core", tmp_path / "core", env=env) as core:
        port = core.ports["core"]
        silent = await RawConn.open(port)  # says nothing at all
        half = await RawConn.open(port)
        await half.send(PREAMBLE + b"\x00\x00")  # the preamble and half a frame's length
        async with await connect(port) as client:  # logs in at once: never timed out
            for raw in (silent, half):
                r = await raw.read_to_eof(5)
                raw.close()
                _, code, message = goodbye_of(r)
                assert (code, message) == (
                    "timeout",
                    "no Hello (login) within 1 seconds of connecting",
                )
            await asyncio.sleep(0.5)
            await client.ping()
        assert "no login within 1s: closed" in core.log()
        await still_serving(core)


def test_the_open_files_limit_is_raised_to_the_hard_limit(core: PolymqProcess) -> None:
    assert core.proc is not None
    limits = Path(f"/proc/{core.proc.pid}/limits").read_text()
    [line] = [x for x in limits.splitlines() if x.startswith("Max open files")]
    soft, hard = line.split()[3:5]
    assert soft == hard, line
    assert f"open files: limit {soft} " in core.log()


async def test_client_that_disconnects_mid_frame(core: PolymqProcess) -> None:
    q = f"queue/{uid()}"
    raw = await RawConn.open(core.ports["core"])
    await raw.handshake()
    whole = frame([10, 7, q, [Message(b"half").to_wire()], None])
    await raw.send(whole[: len(whole) // 2])
    raw.sock.shutdown(2)  # SHUT_RDWR: gone mid-frame
    raw.close()
    await asyncio.sleep(0.1)
    async with await connect(core.ports["core"]) as c:
        await c.ping()
        with pytest.raises(NotFound):  # the half publish never happened
            await c.stats(q)
        sub = await c.subscribe(q)
        await c.publish(q, "whole")
        assert bodies(await collect(sub, 1)) == [b"whole"]
    await still_serving(core)


async def test_request_before_hello_is_a_protocol_error(core: PolymqProcess) -> None:
    raw = await RawConn.open(core.ports["core"])
    await raw.send(PREAMBLE + frame([PING, 1]))
    r = await raw.read_to_eof(5)
    raw.close()
    assert goodbye_of(r)[1] == "protocol-error"
    assert not r.of(OK)
    await still_serving(core)


# ---- one bad request: a Fail for it alone, the connection stays usable -----------------------


@pytest.mark.parametrize(
    "destination",
    [
        "queuename",  # no kind
        "queue/",  # empty name
        "queue/has space",
        "queue/semi;colon",
        "queue/ümlaut",
        "queue/a..b",
        "queue/" + "n" * 256,  # name too long
        "exchange/orders",  # unknown kind
        "queue/wild*",  # wildcards only for topic subscriptions
    ],
)
async def test_malformed_destination_fails_that_request_only(
    client: Client, destination: str
) -> None:
    q = f"queue/{uid()}"
    sub = await client.subscribe(q)
    for call in (
        client.publish(destination, "x"),
        client.declare(destination),
        client.subscribe(destination),
        client.stats(destination),
    ):
        with pytest.raises(BadRequest):
            await call
    # the same connection is still good, its subscription too
    await client.publish(q, "ok")
    assert bodies(await collect(sub, 1)) == [b"ok"]


async def test_longest_legal_name_is_accepted(client: Client) -> None:
    q = "queue/" + "n" * 255
    await client.publish(q, "x")
    assert (await client.stats(q)).messages == 1


async def test_body_over_max_body_is_payload_too_large(client: Client) -> None:
    q = f"queue/{uid()}"
    max_body = client.limits["max_body"]
    with pytest.raises(PayloadTooLarge) as exc:
        await client.publish(q, b"x" * (max_body + 1))
    assert exc.value.status == 413
    with pytest.raises(PayloadTooLarge):  # one too-large message fails its whole batch
        await client.publish(q, [Message(b"small"), Message(b"y" * (max_body + 1))])
    with pytest.raises(NotFound):  # nothing of either batch got in
        await client.stats(q)
    await client.publish(q, b"z" * 1024)
    assert (await client.stats(q)).messages == 1


@pytest.mark.parametrize(
    "options",
    [
        {"max_length": "10"},
        {"max_length": 0},
        {"max_length": True},
        {"durable": "yes"},
        {"overflow": "explode"},
        {"idle_ttl": "1"},
        {"idle_ttl": -1},
        {"dead_letter": 42},
        {"dead_letter": "channel/x"},
        {"max_deliveries": 1.5},
        {"no_such_option": 1},
    ],
)
async def test_wrong_types_in_declare_options_are_bad_requests(
    client: Client, options: dict[str, object]
) -> None:
    q = f"queue/{uid()}"
    with pytest.raises(BadRequest):
        await client.declare(q, **options)
    await client.declare(q, max_length=5)  # the connection is fine; nothing half-declared
    assert (await client.stats(q)).options.max_length == 5


@pytest.mark.parametrize(
    "options",
    [
        {"ack_mode": "sometimes"},
        {"prefetch": "5"},
        {"prefetch": -1},
        {"buffer_messages": 0.5},
        {"slow_policy": "ignore"},
        {"ack_timeout": "soon"},
        {"offset": [1]},
        {"role": "admin"},
        {"bogus": 1},
    ],
)
async def test_wrong_types_in_subscribe_options_are_bad_requests(
    client: Client, options: dict[str, object]
) -> None:
    q = f"queue/{uid()}"
    with pytest.raises(BadRequest):
        await client.subscribe(q, **options)
    with pytest.raises(NotFound):  # a refused subscription leaves nothing behind
        await client.stats(q)
    sub = await client.subscribe(q)
    await client.publish(q, "ok")
    assert bodies(await collect(sub, 1)) == [b"ok"]


@pytest.mark.parametrize(
    "fields",
    [
        {"priority": 10},
        {"priority": -1},
        {"priority": "high"},
        {"headers": {"k": 1}},
        {"content_type": 5},
        {"expires": "tomorrow"},
        {"ack_timeout": -3},
    ],
)
async def test_wrong_types_in_message_fields_are_bad_requests(
    client: Client, fields: dict[str, object]
) -> None:
    q = f"queue/{uid()}"
    with pytest.raises(BadRequest):
        await client.publish(q, [Message(b"m", **fields)])  # type: ignore[arg-type]
    with pytest.raises(NotFound):
        await client.stats(q)
    await client.publish(q, "fine")
    assert (await client.stats(q)).messages == 1


async def test_wrong_types_in_other_requests_are_bad_requests(client: Client) -> None:
    q = f"queue/{uid()}"
    with pytest.raises(BadRequest):
        await client.set_metadata(q, {"k": 1})  # type: ignore[dict-item]
    with pytest.raises(BadRequest):
        await client.kv_put("", b"v")
    with pytest.raises(BadRequest):
        await client.kv_put(uid(), "not bytes")  # type: ignore[arg-type]
    with pytest.raises(BadRequest):
        await client.settle([], Outcome.ACK)
    with pytest.raises(BadRequest):
        await client.settle(["x|1|1"], "maybe")  # type: ignore[arg-type]
    with pytest.raises(BadRequest):
        await client.pull(q, "3")  # type: ignore[arg-type]
    sub = await client.subscribe(q, ack_mode="client-individual")
    with pytest.raises(BadRequest):
        await sub.ack_many(["1"])  # type: ignore[list-item]
    await client.publish(q, "still-fine")
    assert bodies(await collect(sub, 1)) == [b"still-fine"]
