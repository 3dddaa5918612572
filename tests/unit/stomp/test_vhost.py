"""The vhost a CONNECT frame's host header selects (``polymq_stomp.vhost``)."""

from __future__ import annotations

import socket

import pytest

from polymq_stomp.config import StompSettings
from polymq_stomp.refusal import Refused
from polymq_stomp.vhost import choose_vhost

SETTINGS = StompSettings(stomp_vhosts="/,prod", stomp_host_names="stomp.example.com")


@pytest.mark.parametrize(
    ("host", "vhost"),
    [
        (None, "/"),  # no host header (stomp.py's STOMP 1.0)
        ("/", "/"),
        ("prod", "prod"),
        # names of this server: the default vhost (STOMP 1.2 asks clients to send them)
        ("127.0.0.1", "/"),
        ("::1", "/"),
        ("[::1]", "/"),
        ("10.1.2.3", "/"),
        ("localhost", "/"),
        ("LOCALHOST", "/"),
        (socket.gethostname(), "/"),
        ("stomp.example.com", "/"),  # POLYMQ_STOMP_HOST_NAMES
    ],
)
def test_chosen(host: str | None, vhost: str) -> None:
    assert choose_vhost(host, SETTINGS) == vhost


def test_the_host_a_websocket_reached_is_the_default() -> None:
    assert choose_vhost("broker.internal", SETTINGS, reached="broker.internal") == "/"


@pytest.mark.parametrize("host", ["staging", "", "Prod", "broker.internal"])
def test_unknown_vhosts_are_refused_in_rabbitmqs_words(host: str) -> None:
    with pytest.raises(Refused) as exc:
        choose_vhost(host, SETTINGS)
    assert (exc.value.reason, exc.value.message) == ("auth", "Bad CONNECT")
    assert exc.value.detail == f"Virtual host '{host}' access denied"


def test_any_vhost_with_a_star() -> None:
    settings = StompSettings(stomp_vhosts="*")
    assert choose_vhost("anything", settings) == "anything"
    with pytest.raises(Refused):
        choose_vhost("", settings)  # as RabbitMQ: an empty host names no vhost
