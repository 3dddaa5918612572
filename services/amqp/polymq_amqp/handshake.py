"""The connection's handshake: connection.start with our properties, the login in
start-ok (PLAIN or AMQPLAIN, against polymq's auth provider), connection.tune, and
connection.open of a vhost.

A token of the users file logs in too, as RabbitMQ's OAuth 2 backend takes a JWT: the
token as the password, with the token's user as the login or none. A refused login is a
connection.close 403 ACCESS_REFUSED (RabbitMQ's ``authentication_failure_close``), an
unknown vhost a 530 NOT_ALLOWED, and a core that is away a 320 CONNECTION_FORCED at
connection.open (the client's reconnect loop then tries again, perhaps another replica).

connection.update-secret is answered as RabbitMQ's backends answer it: a password login
never expires (RabbitMQ's internal backend), so any new secret is taken and the connection
goes on as it was; a token login takes the new secret only if it is a valid token of the
same user (its grants from then on), else connection.close 530 NOT_ALLOWED "New secret was
refused by one of the backends" (``rabbit_reader``'s words).
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING, Any, Final, Protocol

from pamqp import commands, decode

from polymq.errors import Unauthorized
from polymq_server.auth.logins import TooManyLogins, password_login, peer_source
from polymq_server.names import VhostNames

from . import __version__
from .errors import ACCESS_REFUSED, CONNECTION_FORCED, NOT_ALLOWED, ConnectionException

if TYPE_CHECKING:
    from pamqp import base

    from polymq_server.auth.provider import AuthProvider, Principal
    from polymq_server.link.connections import Tracked
    from polymq_server.resources import Admission

    from .config import AmqpSettings
    from .hub import AmqpHub

__all__ = [
    "HandshakeSession",
    "credentials",
    "login",
    "open_vhost",
    "send_start",
    "server_properties",
    "update_secret",
]

log = logging.getLogger(__name__)

MECHANISMS: Final = "PLAIN AMQPLAIN"


class HandshakeSession(Protocol):
    """What the handshake asks of the session it runs for (a protocol, so that this module
    need not import ``session.py``, which imports it): what it learns of the client, the
    login, the vhost, and the methods it answers with."""

    client_properties: dict[str, Any]
    token_login: bool  # logged in with a token (not a password, not anonymously)
    cancel_notify: bool
    blocked_notify: bool
    vhost: str
    names: VhostNames
    tracked: Tracked  # its row in the admin API's connection table (the vhost is shown)

    @property
    def hub(self) -> AmqpHub: ...
    @property
    def settings(self) -> AmqpSettings: ...
    @property
    def principal(self) -> Principal | None: ...
    @property
    def admission(self) -> Admission: ...

    def send_method(self, channel: int, method: base.Frame) -> bool: ...
    def logged_in(self, principal: Principal) -> None: ...
    def opened(self) -> None: ...


def server_properties() -> dict[str, Any]:
    return {
        "product": "polymq",
        "version": __version__,
        "platform": "Python/asyncio",
        "copyright": "polymq contributors",
        "information": "polymq's AMQP 0-9-1 frontend",
        "capabilities": {
            "publisher_confirms": True,
            "exchange_exchange_bindings": True,
            "basic.nack": True,
            "consumer_cancel_notify": True,
            "connection.blocked": True,
            "consumer_priorities": True,
            "authentication_failure_close": True,
            "per_consumer_qos": True,
            "direct_reply_to": True,
        },
    }


def send_start(session: HandshakeSession) -> None:
    session.send_method(
        0,
        commands.Connection.Start(
            version_major=0,
            version_minor=9,
            server_properties=server_properties(),
            mechanisms=MECHANISMS,
            locales="en_US",
        ),
    )


async def login(session: HandshakeSession, start_ok: commands.Connection.StartOk) -> None:
    """Check the credentials of start-ok, then connection.tune."""
    props = start_ok.client_properties or {}
    session.client_properties = dict(props)
    caps = props.get("capabilities")
    if isinstance(caps, dict):
        session.cancel_notify = bool(caps.get("consumer_cancel_notify"))
        session.blocked_notify = bool(caps.get("connection.blocked"))
    mechanism = start_ok.mechanism or ""
    user, password = credentials(mechanism, start_ok.response)
    auth, source = session.hub.auth, peer_source(session.tracked.peer)
    try:
        principal = await _token_login(auth, user, password)
        if principal is not None:
            session.token_login = True
        elif user:
            principal = await password_login(auth, user, password, source)
        else:
            principal = await auth.anonymous()
    except TooManyLogins as exc:
        raise ConnectionException(ACCESS_REFUSED, f"Login was refused: {exc.message}") from None
    except Unauthorized:
        raise ConnectionException(
            ACCESS_REFUSED, f"Login was refused using authentication mechanism {mechanism}"
        ) from None
    session.logged_in(principal)
    s = session.settings
    session.send_method(
        0,
        commands.Connection.Tune(
            channel_max=s.amqp_channel_max, frame_max=s.amqp_frame_max, heartbeat=s.amqp_heartbeat
        ),
    )
    log.debug("amqp %s: logged in as %s", session, principal.name)


async def _token_login(auth: AuthProvider, user: str, secret: str) -> Principal | None:
    """The principal of ``secret`` if it is a token of user ``user`` ("": of any user),
    else None (in anonymous mode, where any token is a login: None, as a password)."""
    if not secret or auth.open:
        return None
    try:
        principal = await auth.authenticate_token(secret)
    except Unauthorized:
        return None
    return principal if not user or principal.name == user else None


async def update_secret(
    session: HandshakeSession, method: commands.Connection.UpdateSecret
) -> None:
    """connection.update-secret (a token refresh), answered as in the module docstring:
    update-secret-ok, or connection.close 530 NOT_ALLOWED."""
    old = session.principal
    assert old is not None
    if session.token_login:
        secret = method.new_secret
        if isinstance(secret, bytes | bytearray):
            secret = bytes(secret).decode("utf-8", "replace")
        principal = await _token_login(session.hub.auth, old.name, str(secret or ""))
        if principal is None:
            raise ConnectionException(NOT_ALLOWED, "New secret was refused by one of the backends")
        session.logged_in(principal)
    session.send_method(0, commands.Connection.UpdateSecretOk())
    log.info("amqp %s: secret updated for %s (%s)", session, old.name, method.reason)


def open_vhost(session: HandshakeSession, method: commands.Connection.Open) -> None:
    vhost = method.virtual_host or "/"
    if not session.settings.vhost_allowed(vhost):
        raise ConnectionException(NOT_ALLOWED, f"vhost {vhost} not found")
    link = session.hub.link
    if not link.connected:
        raise ConnectionException(
            CONNECTION_FORCED, f"the broker's core at {link.address} is unavailable"
        )
    # a connection limit (the listener's, the user's): refused here, as RabbitMQ does
    principal = session.principal
    assert principal is not None  # (logged in before connection.open)
    refused = session.admission.login(principal.name)
    if refused is not None:
        raise ConnectionException(
            NOT_ALLOWED, f"access to vhost '{vhost}' refused: connection limit reached: {refused}"
        )
    session.vhost = session.tracked.vhost = vhost
    session.names = VhostNames(vhost)
    session.send_method(0, commands.Connection.OpenOk())
    session.opened()


def credentials(mechanism: str, response: Any) -> tuple[str, str]:
    """(user, password) of a start-ok's response; ConnectionException 403 if unreadable."""
    raw = response.encode("utf-8", "surrogateescape") if isinstance(response, str) else response
    if not isinstance(raw, bytes | bytearray):
        raw = b""
    raw = bytes(raw)
    if mechanism == "PLAIN":
        parts = raw.split(b"\x00")
        if len(parts) != 3:
            raise ConnectionException(ACCESS_REFUSED, "malformed PLAIN response")
        return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
    if mechanism == "AMQPLAIN":  # a field table without its length (RabbitMQ reads both)
        table: dict[str, Any] = {}
        for data in (struct.pack(">I", len(raw)) + raw, raw):
            try:
                _, table = decode.field_table(data)
                break
            except (ValueError, struct.error):
                continue
        user, password = table.get("LOGIN", ""), table.get("PASSWORD", "")
        if isinstance(user, bytes):
            user = user.decode("utf-8", "replace")
        if isinstance(password, bytes):
            password = password.decode("utf-8", "replace")
        return str(user), str(password)
    raise ConnectionException(
        ACCESS_REFUSED, f"unsupported authentication mechanism {mechanism!r} (use PLAIN)"
    )
