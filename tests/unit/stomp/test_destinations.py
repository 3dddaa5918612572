"""STOMP destinations to the core's and back (``polymq_stomp.destinations``)."""

from __future__ import annotations

import pytest

from polymq.types import Kind
from polymq_stomp.destinations import (
    Control,
    ControlOp,
    ExchangeRef,
    Target,
    from_core,
    parse_destination,
)
from polymq_stomp.refusal import Refused

CONN = "c0ffee"


@pytest.mark.parametrize(
    ("stomp", "core", "kind"),
    [
        ("/queue/orders", "queue/orders", Kind.QUEUE),
        ("/topic/news.sport", "topic/news.sport", Kind.TOPIC),
        ("/stream/log", "stream/log", Kind.STREAM),
        ("/amq/queue/orders", "queue/orders", Kind.QUEUE),
        ("/exchange/amq.topic/a.b", "topic/a.b", Kind.TOPIC),
        ("/temp-queue/replies", f"queue/tmp.{CONN}.replies", Kind.QUEUE),
    ],
)
def test_mapped_forms(stomp: str, core: str, kind: Kind) -> None:
    target = parse_destination(stomp, CONN)
    assert isinstance(target, Target)
    assert (target.core, target.kind, target.stomp) == (core, kind, stomp)
    assert target.temp == stomp.startswith("/temp-queue/")


def test_topic_patterns_only_where_asked() -> None:
    target = parse_destination("/topic/news.#", CONN, pattern=True)
    assert isinstance(target, Target) and target.is_pattern
    with pytest.raises(Refused) as err:
        parse_destination("/topic/news.#", CONN)  # SEND cannot go to a pattern
    assert err.value.reason == "destination"


@pytest.mark.parametrize("bad", ["/queue/sp ace", "/queue/.x", "/topic/a..b"])
def test_names_the_core_cannot_take_are_refused_naming_the_accepted_forms(bad: str) -> None:
    with pytest.raises(Refused) as err:
        parse_destination(bad, CONN)
    assert (err.value.reason, err.value.message) == ("destination", "Invalid destination")
    assert "/queue/<name>" in err.value.detail


@pytest.mark.parametrize(
    ("bad", "message", "detail"),
    [
        (None, "Missing destination", "\"SEND\" must include a 'destination' header\n"),
        ("", "Missing destination", "\"SEND\" must include a 'destination' header\n"),
        ("/queue", "Invalid destination", "'' is not a valid queue destination\n"),
        ("/queue/", "Invalid destination", "'/' is not a valid queue destination\n"),
        ("/queue/a/b", "Invalid destination", "'/a/b' is not a valid queue destination\n"),
        ("/queue/a/", "Invalid destination", "'/a/' is not a valid queue destination\n"),
        ("/topic/a/b", "Invalid destination", "'/a/b' is not a valid topic destination\n"),
        ("/amq/queue", "Invalid destination", "'' is not a valid amqqueue destination\n"),
        ("/temp-queue/a/b", "Invalid destination",
         "'/a/b' is not a valid temp_queue destination\n"),
        ("/exchange", "Invalid destination", "'' is not a valid exchange destination\n"),
        ("/exchange/", "Invalid destination", "'/' is not a valid exchange destination\n"),
        ("/exchange//x", "Invalid destination", "'//x' is not a valid exchange destination\n"),
        ("/exchange/orders/a/b", "Invalid destination",
         "'/orders/a/b' is not a valid exchange destination\n"),
        ("/exchange/amq.topic/a/b", "Invalid destination",
         "'/amq.topic/a/b' is not a valid exchange destination\n"),
        ("/stream/", "Invalid destination", "'/' is not a valid stream destination\n"),
        ("queue/x", "Unknown destination", "'queue/x' is not a valid destination.\n"
         "Valid destination types are: /temp-queue, /exchange, /topic, /queue, /amq/queue, "
         "/stream, /control.\n"),
        ("/queuex", "Unknown destination", "'/queuex' is not a valid destination.\n"),
        ("/nowhere/x", "Unknown destination", "'/nowhere/x' is not a valid destination.\n"),
    ],
)  # fmt: skip
def test_refusals_of_a_shape_in_rabbitmqs_exact_words(
    bad: str | None, message: str, detail: str
) -> None:
    """As ``rabbit_routing_util:parse_endpoint`` and the plugin's ``with_destination``."""
    with pytest.raises(Refused) as err:
        parse_destination(bad, CONN)
    assert (err.value.reason, err.value.message) == ("destination", message)
    assert err.value.detail.startswith(detail), err.value.detail
    if message == "Invalid destination":
        assert err.value.detail == detail


def test_slash_inside_a_name_is_explained() -> None:
    with pytest.raises(Refused) as err:
        parse_destination("/control/count-msgs/queue/a/b", CONN)
    assert "cannot contain '/'" in err.value.detail


@pytest.mark.parametrize(
    ("stomp", "op", "core"),
    [
        ("/control/count-msgs/queue/q", ControlOp.COUNT_MESSAGES, "queue/q"),
        ("/control/count-subscribers/queue/q", ControlOp.COUNT_SUBSCRIBERS, "queue/q"),
        ("/control/count-subscribers/topic/t", ControlOp.COUNT_SUBSCRIBERS, "topic/t"),
        ("/control/count-msgs/stream/s", ControlOp.COUNT_MESSAGES, "stream/s"),
    ],
)
def test_control_destinations(stomp: str, op: ControlOp, core: str) -> None:
    control = parse_destination(stomp, CONN)
    assert isinstance(control, Control)
    assert (control.op, control.core) == (op, core)


@pytest.mark.parametrize(
    "bad", ["/control/count-msgs/topic/t", "/control/purge/queue/q", "/control/count-msgs/x"]
)
def test_bad_control_destinations(bad: str) -> None:
    with pytest.raises(Refused):
        parse_destination(bad, CONN)


def test_from_core() -> None:
    assert from_core("queue/x") == "/queue/x"
    assert from_core("topic/a.b") == "/topic/a.b"
    assert from_core("stream/s") == "/stream/s"
    assert from_core(f"queue/tmp.{CONN}.r", CONN) == "/temp-queue/r"
    assert from_core(f"queue/tmp.{CONN}.r", "other") == f"/queue/tmp.{CONN}.r"
    assert from_core("channel/c") is None
    assert from_core("not a destination") is None


# ---- vhosts ------------------------------------------------------------------------------
OTHER = "amqp:vother."  # polymq_server.names.VhostNames("other").prefix


@pytest.mark.parametrize(
    ("stomp", "core", "back"),
    [
        ("/queue/orders", f"queue/{OTHER}orders", "/queue/orders"),
        ("/topic/news.*", f"topic/{OTHER}news.*", "/topic/news.*"),
        ("/stream/log", f"stream/{OTHER}log", "/stream/log"),
        ("/amq/queue/orders", f"queue/{OTHER}orders", "/queue/orders"),
        ("/temp-queue/replies", f"queue/tmp.{CONN}.replies", "/temp-queue/replies"),  # private
    ],
)
def test_a_vhost_prefixes_the_core_names(stomp: str, core: str, back: str) -> None:
    target = parse_destination(stomp, CONN, pattern=True, vhost_prefix=OTHER)
    assert isinstance(target, Target)
    assert (target.core, target.stomp) == (core, stomp)
    assert from_core(core, CONN, OTHER) == back


def test_a_vhost_does_not_show_another_vhosts_names() -> None:
    assert from_core("queue/orders", CONN, OTHER) is None
    assert from_core(f"queue/{OTHER}orders", CONN) == f"/queue/{OTHER}orders"  # (from /)


def test_control_destinations_count_in_the_vhost() -> None:
    ctl = parse_destination("/control/count-msgs/queue/q", CONN, vhost_prefix=OTHER)
    assert isinstance(ctl, Control)
    assert ctl.core == f"queue/{OTHER}q"


@pytest.mark.parametrize(
    ("destination", "message", "detail"),
    [
        (None, "Missing destination", "\"SUBSCRIBE\" must include a 'destination' header\n"),
        ("/nowhere/x", "Unknown destination", "'/nowhere/x' is not a valid destination"),
        ("/queue/a b", "Invalid destination", "'/queue/a b' is not a valid destination"),
    ],
)
def test_refusals_in_rabbitmqs_words(destination: str | None, message: str, detail: str) -> None:
    with pytest.raises(Refused) as exc:
        parse_destination(destination, CONN, command="SUBSCRIBE")
    assert (exc.value.reason, exc.value.message) == ("destination", message)
    assert detail in exc.value.detail


@pytest.mark.parametrize(
    ("stomp", "name", "key"),
    [
        ("/exchange/amq.fanout", "amq.fanout", ""),
        # a direct exchange: its bound queues get a SEND, not the queue "jobs" (the default
        # exchange's), as AMQP's basic.publish to amq.direct with key "jobs"
        ("/exchange/amq.direct/jobs", "amq.direct", "jobs"),
        ("/exchange/amq.direct", "amq.direct", ""),
        ("/exchange/amq.fanout/k", "amq.fanout", "k"),
        ("/exchange/orders/eu.new", "orders", "eu.new"),
        ("/exchange/orders/a.b-c", "orders", "a.b-c"),
    ],
)
def test_other_exchanges_wait_for_their_type(stomp: str, name: str, key: str) -> None:
    assert parse_destination(stomp, CONN) == ExchangeRef(name, key, stomp)
