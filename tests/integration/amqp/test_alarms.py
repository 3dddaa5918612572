"""connection.blocked / connection.unblocked (issue 16, point 11) with pika, against polymq
(its forced alarm: the test switch ``/alarm/forced`` of the admin port, see
``polymq_amqp.service``) and RabbitMQ (a memory alarm: its watermark set below what it uses):
while a resource alarm is set, a connection that publishes is blocked before its message is
taken (connection.blocked, to clients that announce the capability); one that does not
publish goes on; when the alarm clears, connection.unblocked, and the message goes on."""

from __future__ import annotations

import time
from collections.abc import Callable

import pika
import pytest

from .helpers import QUIET, WAIT, Target, unique

pytestmark = pytest.mark.timeout(120)


def wait_for(conn: pika.BlockingConnection, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, "not in time"
        conn.process_data_events(time_limit=0.05)


def test_a_publisher_is_blocked_while_an_alarm_is_set(target: Target) -> None:
    publisher, other = target.pika(), target.pika()
    events: dict[str, list[str]] = {"publisher": [], "other": []}
    for name, conn in (("publisher", publisher), ("other", other)):
        assert conn._impl.server_capabilities["connection.blocked"] is True
        conn.add_on_connection_blocked_callback(
            lambda _c, frame, name=name: events[name].append("blocked " + frame.method.reason)
        )
        conn.add_on_connection_unblocked_callback(
            lambda _c, _f, name=name: events[name].append("unblocked")
        )
    q = unique("alarm")
    och = other.channel()
    och.queue_declare(q, auto_delete=False)
    pch = publisher.channel()
    pch.basic_publish("", q, b"before")
    deadline = time.monotonic() + WAIT  # (it takes its time to reach the queue under load)
    while och.basic_get(q, auto_ack=True)[0] is None:
        assert time.monotonic() < deadline, "the first message never came"
        time.sleep(0.02)
    target.set_alarm(True)
    try:
        publisher.process_data_events(time_limit=QUIET)
        assert events["publisher"] == []  # not blocked until it publishes
        pch.basic_publish("", q, b"held")
        wait_for(publisher, lambda: bool(events["publisher"]))
        assert events["publisher"][0].startswith("blocked ")
        # the message waits with its publisher; others go on (a declare, a get)
        time.sleep(QUIET)
        assert och.queue_declare(q, passive=True).method.message_count == 0
        assert och.basic_get(q, auto_ack=True)[0] is None
    finally:
        target.set_alarm(False)
    wait_for(publisher, lambda: len(events["publisher"]) == 2)
    assert events["publisher"][1] == "unblocked"
    deadline = time.monotonic() + WAIT
    while (got := och.basic_get(q, auto_ack=True))[0] is None:
        assert time.monotonic() < deadline, "the held message never came"
        time.sleep(0.02)
    assert got[2] == b"held"
    other.process_data_events(time_limit=0.1)
    assert events["other"] == []  # it never published: never blocked
    och.queue_delete(q)
    publisher.close()
    other.close()
