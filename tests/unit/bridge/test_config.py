"""The links file and the settings: what is accepted, and what each mistake says."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from polymq_bridge.config import (
    BridgeSettings,
    Direction,
    InboundLink,
    OutboundLink,
    load_links,
    parse_links,
)
from polymq_server.config import ConfigError, from_env


def out(**kw: Any) -> dict[str, Any]:
    return {"name": "o", "direction": "polymq-to-rabbitmq", "source": "queue/orders", **kw}


def inb(**kw: Any) -> dict[str, Any]:
    return {
        "name": "i",
        "direction": "rabbitmq-to-polymq",
        "queue": "jobs",
        "destination": "queue/jobs",
        **kw,
    }


def test_a_full_file() -> None:
    cfg = parse_links(
        {
            "links": [
                out(
                    exchange="ex",
                    exchange_type="topic",
                    routing_key="a.b",
                    on_unroutable="reject",
                    prefetch=7,
                ),
                out(name="s", source="stream/events", offset=12),
                inb(
                    declare=True,
                    bindings=[{"exchange": "amq.topic", "routing_key": "j.#"}],
                    persistent="always",
                    prefetch=3,
                ),
            ]
        }
    )
    o, s, i = cfg.links
    assert isinstance(o, OutboundLink) and isinstance(s, OutboundLink)
    assert (o.exchange, o.exchange_type, o.routing_key, o.on_unroutable, o.prefetch) == (
        "ex", "topic", "a.b", "reject", 7,
    )  # fmt: skip
    assert o.direction is Direction.TO_RABBITMQ and o.direction.label == "to_rabbitmq"
    assert not o.is_stream
    assert s.is_stream and s.offset == 12 and s.offset_key == "polymq-bridge/s/offset"
    assert isinstance(i, InboundLink)
    assert i.declare and i.always_persistent and i.prefetch == 3
    assert i.bindings[0].exchange == "amq.topic" and i.bindings[0].routing_key == "j.#"
    assert i.direction.label == "to_polymq"


def test_defaults() -> None:
    o, i = parse_links({"links": [out(), inb()]}).links
    assert isinstance(o, OutboundLink) and isinstance(i, InboundLink)
    assert o.exchange == "" and o.routing_key == "orders"  # the default exchange, the name
    assert o.exchange_type is None and o.on_unroutable == "retry" and o.mandatory
    assert o.prefetch == 100
    assert o.offset == "first"
    assert i.declare is False and i.bindings == () and i.always_persistent is False


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "the top level must be an object"),
        ({"links": [], "x": 1}, 'unknown key(s) "x"'),
        ({"links": {}}, '"links" must be a non-empty list'),
        ({"links": [1]}, "links[0]: a link must be an object"),
        ({"links": [{"direction": "rabbitmq-to-polymq"}]}, 'links[0]: "name" is missing'),
        ({"links": [out(name="a b")]}, "\"name\" 'a b' must be 1..100 of letters"),
        ({"links": [out(), out()]}, "links[1] (o): another link has the same name"),
        ({"links": [out(source=3)]}, '"source" must be a string, not 3'),
        ({"links": [out(source="orders")]}, "\"source\": destination 'orders' must be"),
        ({"links": [out(source="channel/c")]}, '"source" must be a polymq queue/<name> or'),
        ({"links": [out(offset="first")]}, '"offset" applies to a stream source only'),
        ({"links": [out(source="stream/s", offset="never")]}, '"offset": offset must be'),
        ({"links": [out(prefetch=True)]}, '"prefetch" must be an integer, not true'),
        ({"links": [out(prefetch=10_001)]}, '"prefetch" must be 1..10000, not 10001'),
        ({"links": [out(on_unroutable=True)]}, '"on_unroutable" must be a string'),
        ({"links": [out(on_unroutable="ignore")]}, '"on_unroutable" must be one of'),
        ({"links": [out(exchange_type="weird", exchange="e")]}, '"exchange_type" must be one'),
        ({"links": [out(exchange_type="topic")]}, '"exchange_type" needs a named "exchange"'),
        ({"links": [out(exchange_type="topic", exchange="amq.x")]}, 'reserves "amq."'),
        ({"links": [out(routing_key="k" * 256)]}, '"routing_key" is longer than 255 bytes'),
        ({"links": [out(queue="q")]}, 'unknown key(s) "queue"'),
        ({"links": [inb(queue="")]}, '"queue" must not be empty'),
        ({"links": [inb(destination="queue/a b")]}, '"destination": destination name'),
        ({"links": [inb(destination="channel/c")]}, '"destination" must be a polymq queue/'),
        ({"links": [inb(bindings=[{"exchange": "e"}])]}, '"bindings" need "declare": true'),
        ({"links": [inb(declare=True, bindings=[{"x": 1}])]}, '"bindings"[0] must be'),
        ({"links": [inb(persistent="never")]}, '"persistent" must be "carry"'),
        ({"links": [inb(source="queue/x")]}, 'unknown key(s) "source"'),
        ({"links": [{"name": "z", "direction": "up"}]}, '"direction" must be "polymq-to-'),
    ],
)
def test_mistakes_say_where_and_what(doc: Any, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_links(doc, "/etc/links.json")
    text = str(e.value)
    assert text.startswith("bridge links file /etc/links.json: ")
    assert message in text


def test_load_links_reads_json(tmp_path: Path) -> None:
    p = tmp_path / "links.json"
    p.write_text(json.dumps({"links": [inb()]}))
    assert load_links(p).links[0].name == "i"
    p.write_text('{"links": [')
    with pytest.raises(ConfigError, match=r"not valid JSON: .* at line 1 column 12"):
        load_links(p)
    with pytest.raises(ConfigError, match="no such file"):
        load_links(tmp_path / "missing.json")


def test_settings_from_the_environment() -> None:
    s = from_env(
        BridgeSettings,
        env={
            "POLYMQ_BRIDGE_CONFIG": "/x.json",
            "POLYMQ_BRIDGE_RABBITMQ_URL": "amqp://u:secret@rabbit:5673/vh",
            "POLYMQ_CORE_PORT": "7411",
            "POLYMQ_BRIDGE_PORT": "0",
        },
    )
    assert s.bridge_config == "/x.json" and s.core_port == 7411 and s.bridge_port == 0
    assert s.rabbitmq_address == "amqp://rabbit:5673/vh"  # no credentials in logs
    assert BridgeSettings().bridge_rabbitmq_url == "amqp://guest:guest@127.0.0.1:5672/"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"POLYMQ_BRIDGE_RABBITMQ_URL": "http://h/"}, "must look like amqp://"),
        ({"POLYMQ_BRIDGE_RABBITMQ_URL": "amqp://h:x/"}, "bad port"),
        ({"POLYMQ_BRIDGE_PORT": "70000"}, "POLYMQ_BRIDGE_PORT must be 0..65535"),
        ({"POLYMQ_CORE_PORT": "0"}, "POLYMQ_CORE_PORT must name the core's port"),
        ({"POLYMQ_CORE_PASSWORD": "p"}, "POLYMQ_CORE_USER is not"),
        ({"POLYMQ_BRIDGE_BACKOFF_MIN": "9"}, "0 < min <= max"),
        ({"POLYMQ_BRIDGE_STOP_GRACE": "0"}, "POLYMQ_BRIDGE_STOP_GRACE must be"),
        ({"POLYMQ_BRIDGE_HEARTBEAT": "x"}, "invalid literal"),
    ],
)
def test_bad_settings(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        from_env(BridgeSettings, env=env)


def test_no_links_file_is_said_when_links_are_read() -> None:
    with pytest.raises(ConfigError, match="set POLYMQ_BRIDGE_CONFIG or pass --config"):
        BridgeSettings().links()


def test_the_polymq_cli_can_mount_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from polymq_bridge.main import add_arguments, settings_from

    for var in ("POLYMQ_BRIDGE_CONFIG", "POLYMQ_BRIDGE_RABBITMQ_URL", "POLYMQ_CORE_PORT"):
        monkeypatch.delenv(var, raising=False)
    cli = argparse.ArgumentParser(prog="polymq")
    sub = cli.add_subparsers(dest="command")
    sp = sub.add_parser("bridge")
    for flag in ("--host", "--ports-file", "--log-level", "--auth"):  # what `polymq` adds
        sp.add_argument(flag, default=None)
    add_arguments(sp, common=False)
    args = cli.parse_args(
        ["bridge", "--config", "/l.json", "--core", "h:7411", "--rabbitmq-url",
         "amqp://u:p@r:5673/", "--bridge-port", "0", "--host", "0.0.0.0"]
    )  # fmt: skip
    s = settings_from(args)
    assert (s.bridge_config, s.core_host, s.core_port) == ("/l.json", "h", 7411)
    assert s.bridge_rabbitmq_url == "amqp://u:p@r:5673/" and s.bridge_port == 0
    assert s.host == "0.0.0.0"
