"""aiohttp's server logger for polymq's listeners (``polymq_server.web.serverlog``): what the
client got wrong is one DEBUG line, what went wrong in the server stays an ERROR with its
traceback."""

from __future__ import annotations

import logging

import pytest
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong

from polymq_server.web.app import deadline_runner
from polymq_server.web.serverlog import SERVER_LOG


@pytest.mark.parametrize(
    ("exc", "said"),
    [
        (
            BadHttpMessage("Invalid header value char:\n\n  b'X-Probe: \\x00'\n           ^"),
            "BadHttpMessage: Invalid header value char: b'X-Probe: \\x00' ^",
        ),
        (LineTooLong("Status line is too long", "8190"), "LineTooLong: Got more than 8190"),
        (
            web.RequestPayloadError("400, message:\n  Can not decode content-encoding: gzip"),
            "RequestPayloadError: 400, message: Can not decode content-encoding: gzip",
        ),
    ],
)
def test_what_the_client_sent_wrong_is_one_debug_line(
    caplog: pytest.LogCaptureFixture, exc: Exception, said: str
) -> None:
    """As aiohttp logs a request it cannot parse (``RequestHandler.handle_error``)."""
    with caplog.at_level(logging.DEBUG, "aiohttp.server"):
        SERVER_LOG.exception("Error handling request from %s", "127.0.0.1", exc_info=exc)
    [record] = caplog.records
    assert record.name == "aiohttp.server" and record.levelno == logging.DEBUG
    assert record.exc_info is None and "\n" not in record.getMessage()
    assert record.getMessage().startswith(f"Error handling request from 127.0.0.1: {said}")


def test_it_is_not_logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, "aiohttp.server"):
        SERVER_LOG.exception(
            "Error handling request from %s", "1.2.3.4", exc_info=BadHttpMessage("x")
        )
    assert caplog.records == []


def test_a_bug_stays_an_error_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    try:
        raise KeyError("bug")
    except KeyError as exc:
        bug = exc
    with caplog.at_level(logging.INFO, "aiohttp.server"):
        SERVER_LOG.exception("Error handling request from %s", "1.2.3.4", exc_info=bug)
        SERVER_LOG.warning("a warning")
    error, warning = caplog.records
    assert error.levelno == logging.ERROR and error.exc_info is not None
    assert error.getMessage() == "Error handling request from 1.2.3.4"
    assert "KeyError: 'bug'" in caplog.text
    assert warning.levelno == logging.WARNING


async def test_every_runner_uses_it() -> None:
    """Its request handlers (made by the runner's server) log through :data:`SERVER_LOG`."""
    runner = deadline_runner(web.Application())
    await runner.setup()
    try:
        assert runner.server is not None
        assert runner.server().logger is SERVER_LOG
    finally:
        await runner.cleanup()
