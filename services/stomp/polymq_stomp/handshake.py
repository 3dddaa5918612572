"""A STOMP connection's handshake: what its CONNECT (or STOMP) frame asks, checked and agreed.

:func:`agree` takes the CONNECT frame and gives the :class:`Agreement` the session then
acts on: the protocol version (the highest both sides speak), the heart-beats (what the
client asks, no shorter than ``stomp_heartbeat_min``), the vhost, the login (checked by the
auth provider) and the connection limits' admission. It raises :class:`Refused` (an ERROR,
then the close) for a malformed header, a refused login or a limit reached,
:class:`VersionMismatch` when no version is common (the session answers with
:func:`version_error`, STOMP 1.2's ERROR listing what we speak), and ``Unavailable`` while
the core is away. The session owns the handshake timeout; the heart-beats run in
``heartbeat.py``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from polymq.errors import Unauthorized, Unavailable
from polymq_server.auth.logins import TooManyLogins, password_login, peer_source

from .codec import VERSIONS
from .frames import Command, Frame
from .refusal import Refused
from .vhost import choose_vhost

if TYPE_CHECKING:
    from polymq_server.auth.provider import AuthProvider, Principal
    from polymq_server.link.corelink import CoreLink
    from polymq_server.resources import Admission

    from .config import StompSettings

__all__ = ["SERVER_NAME", "Agreement", "VersionMismatch", "agree", "version_error"]

log = logging.getLogger(__name__)

SERVER_NAME: Final = "polymq-stomp/0.1.0"
_SUPPORTED: Final = ",".join(VERSIONS)


class VersionMismatch(Exception):
    """The client speaks none of our versions (``offered``: its accept-version header)."""

    def __init__(self, offered: str) -> None:
        super().__init__(offered)
        self.offered = offered


@dataclass(frozen=True, slots=True)
class Agreement:
    """What a CONNECT agreed: the connection acts on it from its CONNECTED on."""

    principal: Principal
    version: str
    vhost: str
    client_id: str  # CONNECT's client-id header: names durable subscriptions' queues
    heartbeat: tuple[int, int]  # (ms between the beats we send, ms between the client's)

    def connected(self, session_id: str) -> Frame:
        """The CONNECTED frame that answers the CONNECT."""
        hb_out, hb_in = self.heartbeat
        headers = (
            ("version", self.version),
            ("heart-beat", f"{hb_out},{hb_in}"),  # 0,0 in 1.0, as RabbitMQ says it
            ("server", SERVER_NAME),
            ("session", session_id),
        )
        return Frame(Command.CONNECTED, headers)


async def agree(
    frame: Frame,
    settings: StompSettings,
    *,
    auth: AuthProvider,
    link: CoreLink,
    admission: Admission,
    transport_host: str | None,
    peer: str = "?",
) -> Agreement:
    """Check the CONNECT ``frame`` and log its user in (``transport_host``: the host a
    WebSocket client opened its socket on, for the vhost; ``peer``: the client's
    ``host:port``, whose failed logins are held back, :mod:`polymq_server.auth.logins`)."""
    raw = frame.get("accept-version")
    if raw is None:
        offered = ["1.0"]
    else:
        offered = [v.strip() for v in raw.split(",")]
    common = [v for v in reversed(VERSIONS) if v in offered]
    if not common:
        raise VersionMismatch(raw or "")
    version = common[0]
    hb_out = hb_in = 0
    if version != "1.0":
        hb_out, hb_in = _heartbeats(frame.get("heart-beat") or "0,0", settings)
    vhost = choose_vhost(frame.get("host"), settings, transport_host)
    login = frame.get("login")
    try:
        if login:
            passcode = frame.get("passcode") or ""
            principal = await password_login(auth, login, passcode, peer_source(peer))
        else:
            principal = await auth.anonymous()
    except Unauthorized as exc:
        if not login:
            raise Refused("auth", "Bad CONNECT", f"Access refused: {exc.message}") from None
        if isinstance(exc, TooManyLogins):  # (polymq's own: the client is told to wait)
            who = f"Access refused for user '{login[:100]}'"
            raise Refused("auth", "Bad CONNECT", f"{who}: {exc.message}") from None
        # RabbitMQ's words, without the reason (which it only logs)
        log.info("stomp login of %r from %s refused: %s", login[:100], peer, exc.message)
        raise Refused("auth", "Bad CONNECT", f"Access refused for user '{login[:100]}'\n") from None
    if not link.connected:
        raise Unavailable(f"no connection to the core at {link.address}")
    refused = admission.login(principal.name)
    if refused is not None:
        raise Refused("limit", "Connection limit reached", refused)
    client_id = frame.get("client-id") or ""
    return Agreement(principal, version, vhost, client_id, (hb_out, hb_in))


def version_error() -> Frame:
    """ERROR with a ``version`` header listing what we speak (STOMP 1.2 says so), in
    RabbitMQ's words."""
    body = f"Supported versions are {_SUPPORTED}\n"
    data = body.encode()
    return Frame(
        Command.ERROR,
        (
            ("message", "Version mismatch"),
            ("version", _SUPPORTED),
            ("content-type", "text/plain"),
            ("content-length", str(len(data))),
        ),
        data,
    )


def _heartbeats(raw: str, settings: StompSettings) -> tuple[int, int]:
    """Our heart-beat header ``(sx, sy)``: we send every sx ms, and expect every sy ms.
    What the client asks for, no shorter than ``stomp_heartbeat_min``."""
    cx_s, sep, cy_s = (part.strip() for part in raw.partition(","))
    # ASCII digits, as RabbitMQ takes: int() would take Arabic-Indic digits, "+1" and "1_0"
    if not (sep and _is_ms(cx_s) and _is_ms(cy_s)):
        raise Refused(
            "version",
            "Invalid header",
            f"heart-beat: {raw[:60]!r}: expected two integers >= 0 such as 10000,10000",
        )
    cx, cy = int(cx_s), int(cy_s)
    floor = settings.stomp_heartbeat_min
    sx = max(cy, floor) if cy else 0  # the client wants ours every cy ms
    sy = max(cx, floor) if cx else 0  # the client can send every cx ms
    return sx, sy


def _is_ms(text: str) -> bool:
    """A heart-beat's milliseconds: ASCII digits, at most 18 (30 million years; more would
    overflow the timers' float seconds, or int() itself past 4300 digits)."""
    return text.isascii() and text.isdigit() and len(text) <= 18
