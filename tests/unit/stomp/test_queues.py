"""The queues a SUBSCRIBE makes (``polymq_stomp.queues``): x- arguments and the queue behind
a topic subscription."""

from __future__ import annotations

import pytest

from polymq.types import AckMode, Kind
from polymq_stomp.config import StompSettings
from polymq_stomp.destinations import Target
from polymq_stomp.frames import Command, Frame
from polymq_stomp.queues import Backing, backing_queue, durable_asked, queue_arguments
from polymq_stomp.refusal import Refused

TOPIC = Target("topic/news.*", Kind.TOPIC, "/topic/news.*")
SETTINGS = StompSettings()


def sub(**headers: str) -> Frame:
    return Frame(Command.SUBSCRIBE, tuple(headers.items()))


def test_queue_arguments_in_the_cores_units() -> None:
    frame = sub(
        **{
            "x-max-length": "10",
            "x-max-length-bytes": "2048",
            "x-message-ttl": "1500",
            "x-expires": "60000",
            "x-max-priority": "200",
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "dead",
        }
    )
    assert queue_arguments(frame, "amqp:vv.") == {
        "max_length": 10,
        "max_bytes": 2048,
        "overflow": "drop-oldest",  # RabbitMQ's default
        "message_ttl": 1.5,
        "idle_ttl": 60.0,
        "max_priority": 9,  # the core's highest
        "dead_letter": "queue/amqp:vv.dead",
    }
    assert queue_arguments(sub(**{"x-overflow": "reject-publish"}), "") == {"overflow": "reject"}
    assert queue_arguments(sub(id="1"), "") == {}


@pytest.mark.parametrize(
    "headers",
    [
        {"x-max-length": "-1"},
        {"x-overflow": "sometimes"},
        {"x-message-ttl": "soon"},
        {"x-dead-letter-exchange": "my.exchange", "x-dead-letter-routing-key": "k"},
        {"x-dead-letter-exchange": ""},  # no routing key
    ],
)
def test_bad_queue_arguments(headers: dict[str, str]) -> None:
    with pytest.raises(Refused) as exc:
        queue_arguments(sub(**headers), "")
    assert exc.value.message == "Invalid header"


def back(frame: Frame, mode: AckMode = AckMode.AUTO, **kw: str) -> Backing | None:
    return backing_queue(
        frame, TOPIC, mode, sid="s1", client_id=kw.get("client_id", "c1"), vhost="/",
        private="queue/tmp.x.sub-1", settings=SETTINGS, arguments={},
    )  # fmt: skip


def test_which_topic_subscriptions_have_a_queue() -> None:
    assert back(sub()) is None
    assert back(sub(ack="client"), AckMode.CLIENT) is None  # no prefetch: straight from the topic
    assert back(sub(**{"prefetch-count": "5", "x-slow-policy": "drop"}), AckMode.CLIENT) is None
    flow = back(sub(**{"prefetch-count": "5"}), AckMode.CLIENT_INDIVIDUAL)
    assert flow is not None
    assert (flow.core, flow.keep) == ("queue/tmp.x.sub-1", False)
    durable = back(sub(durable="true", **{"auto-delete": "false"}))
    assert durable is not None
    assert (durable.core, durable.keep) == ("queue/stomp-subscription-c1-s1", True)
    assert durable.options["durable"] is True
    gone_with_it = back(sub(persistent="true"))  # no auto-delete: false: deleted when it ends
    assert gone_with_it is not None
    assert gone_with_it.keep is False
    named = back(sub(**{"x-queue-name": "my q"}))
    assert named is not None
    assert (named.core, named.keep) == ("queue/my:20q", False)


def test_durable_asked() -> None:
    assert durable_asked(sub(durable="true")) and durable_asked(sub(persistent="TRUE"))
    assert not durable_asked(sub(durable="false")) and not durable_asked(sub())
