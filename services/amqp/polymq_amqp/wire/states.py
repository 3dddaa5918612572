"""The states of an AMQP 0-9-1 connection and of its channels, in one table (as h11's
``_state.py``), and the methods a client may send.

:data:`TRANSITIONS` maps ``(state, trigger)`` to the next state; a trigger is a method
received or sent that changes a state. A channel without an entry in the codec's table is
``CHANNEL_CLOSED``. What is not in the table is not allowed: the codec answers a received
one with a connection exception, and refuses to send one (LocalProtocolError).
"""

from __future__ import annotations

import enum
from typing import Final

from pamqp import base, commands

__all__ = [
    "CLIENT_METHODS",
    "RECV_TRIGGERS",
    "SEND_TRIGGERS",
    "TRANSITIONS",
    "WAIT_FOR",
    "State",
    "Trigger",
    "method_name",
]


class State(enum.Enum):
    # the connection
    AWAIT_HEADER = "await-header"
    GREETING = "greeting"  # header read, connection.start to send
    AWAIT_START_OK = "await-start-ok"
    AUTHENTICATING = "authenticating"  # start-ok read, connection.tune to send
    AWAIT_TUNE_OK = "await-tune-ok"
    AWAIT_OPEN = "await-open"
    OPENING = "opening"  # connection.open read, open-ok to send
    OPEN = "open"
    CLOSE_RECEIVED = "close-received"  # the client closed: close-ok to send
    CLOSING = "closing"  # we closed: waiting for close-ok
    CLOSED = "closed"
    # one channel
    CHANNEL_CLOSED = "channel-closed"
    CHANNEL_OPEN = "channel-open"
    CHANNEL_CLOSE_RECEIVED = "channel-close-received"
    CHANNEL_CLOSING = "channel-closing"


class Trigger(enum.Enum):
    RECV_HEADER = "recv header"
    SEND_START = "send connection.start"
    RECV_START_OK = "recv connection.start-ok"
    SEND_TUNE = "send connection.tune"
    RECV_TUNE_OK = "recv connection.tune-ok"
    RECV_OPEN = "recv connection.open"
    SEND_OPEN_OK = "send connection.open-ok"
    RECV_CLOSE = "recv connection.close"
    SEND_CLOSE = "send connection.close"
    RECV_CLOSE_OK = "recv connection.close-ok"
    RECV_UPDATE_SECRET = "recv connection.update-secret"
    SEND_CLOSE_OK = "send connection.close-ok"
    RECV_CHANNEL_OPEN = "recv channel.open"
    RECV_CHANNEL_CLOSE = "recv channel.close"
    SEND_CHANNEL_CLOSE = "send channel.close"
    RECV_CHANNEL_CLOSE_OK = "recv channel.close-ok"
    SEND_CHANNEL_CLOSE_OK = "send channel.close-ok"


S, T = State, Trigger
_HANDSHAKE = (S.AWAIT_START_OK, S.AUTHENTICATING, S.AWAIT_TUNE_OK, S.AWAIT_OPEN, S.OPENING)
TRANSITIONS: Final[dict[tuple[State, Trigger], State]] = {
    (S.AWAIT_HEADER, T.RECV_HEADER): S.GREETING,
    (S.GREETING, T.SEND_START): S.AWAIT_START_OK,
    (S.AWAIT_START_OK, T.RECV_START_OK): S.AUTHENTICATING,
    (S.AUTHENTICATING, T.SEND_TUNE): S.AWAIT_TUNE_OK,
    (S.AWAIT_TUNE_OK, T.RECV_TUNE_OK): S.AWAIT_OPEN,
    (S.AWAIT_OPEN, T.RECV_OPEN): S.OPENING,
    (S.OPENING, T.SEND_OPEN_OK): S.OPEN,
    (S.OPEN, T.RECV_UPDATE_SECRET): S.OPEN,  # answered update-secret-ok, or closed
    **{(s, T.SEND_CLOSE): S.CLOSING for s in (*_HANDSHAKE, S.OPEN)},
    **{(s, T.RECV_CLOSE): S.CLOSE_RECEIVED for s in (*_HANDSHAKE, S.OPEN)},
    (S.CLOSE_RECEIVED, T.SEND_CLOSE_OK): S.CLOSED,
    (S.CLOSING, T.RECV_CLOSE_OK): S.CLOSED,
    (S.CLOSING, T.RECV_CLOSE): S.CLOSING,  # both sides closed at once
    (S.CLOSING, T.SEND_CLOSE_OK): S.CLOSED,
    # channels
    (S.CHANNEL_CLOSED, T.RECV_CHANNEL_OPEN): S.CHANNEL_OPEN,
    (S.CHANNEL_OPEN, T.RECV_CHANNEL_CLOSE): S.CHANNEL_CLOSE_RECEIVED,
    (S.CHANNEL_CLOSE_RECEIVED, T.SEND_CHANNEL_CLOSE_OK): S.CHANNEL_CLOSED,
    (S.CHANNEL_OPEN, T.SEND_CHANNEL_CLOSE): S.CHANNEL_CLOSING,
    (S.CHANNEL_CLOSING, T.RECV_CHANNEL_CLOSE_OK): S.CHANNEL_CLOSED,
    (S.CHANNEL_CLOSING, T.RECV_CHANNEL_CLOSE): S.CHANNEL_CLOSING,
    (S.CHANNEL_CLOSING, T.SEND_CHANNEL_CLOSE_OK): S.CHANNEL_CLOSED,
}
del S, T

RECV_TRIGGERS: Final[dict[type[base.Frame], Trigger]] = {
    commands.Connection.StartOk: Trigger.RECV_START_OK,
    commands.Connection.TuneOk: Trigger.RECV_TUNE_OK,
    commands.Connection.Open: Trigger.RECV_OPEN,
    commands.Connection.Close: Trigger.RECV_CLOSE,
    commands.Connection.CloseOk: Trigger.RECV_CLOSE_OK,
    commands.Connection.UpdateSecret: Trigger.RECV_UPDATE_SECRET,
}
SEND_TRIGGERS: Final[dict[type[base.Frame], Trigger]] = {
    commands.Connection.Start: Trigger.SEND_START,
    commands.Connection.Tune: Trigger.SEND_TUNE,
    commands.Connection.OpenOk: Trigger.SEND_OPEN_OK,
    commands.Connection.Close: Trigger.SEND_CLOSE,
    commands.Connection.CloseOk: Trigger.SEND_CLOSE_OK,
}
# Methods a client may send, by pamqp index (class << 16 | method).
CLIENT_METHODS: Final[frozenset[int]] = frozenset(
    m.index
    for m in (
        commands.Connection.StartOk,
        commands.Connection.SecureOk,
        commands.Connection.TuneOk,
        commands.Connection.Open,
        commands.Connection.Close,
        commands.Connection.CloseOk,
        commands.Connection.UpdateSecret,
        commands.Channel.Open,
        commands.Channel.Flow,
        commands.Channel.FlowOk,
        commands.Channel.Close,
        commands.Channel.CloseOk,
        commands.Exchange.Declare,
        commands.Exchange.Delete,
        commands.Exchange.Bind,
        commands.Exchange.Unbind,
        commands.Queue.Declare,
        commands.Queue.Bind,
        commands.Queue.Purge,
        commands.Queue.Delete,
        commands.Queue.Unbind,
        commands.Basic.Qos,
        commands.Basic.Consume,
        commands.Basic.Cancel,
        commands.Basic.CancelOk,
        commands.Basic.Publish,
        commands.Basic.Get,
        commands.Basic.Ack,
        commands.Basic.Reject,
        commands.Basic.RecoverAsync,
        commands.Basic.Recover,
        commands.Basic.Nack,
        commands.Tx.Select,
        commands.Tx.Commit,
        commands.Tx.Rollback,
        commands.Confirm.Select,
    )
)
CLASSES: Final = frozenset({10, 20, 40, 50, 60, 90, 85})
WAIT_FOR: Final = {
    State.AWAIT_START_OK: "connection.start-ok",
    State.AWAIT_TUNE_OK: "connection.tune-ok",
    State.AWAIT_OPEN: "connection.open",
}


_NAMES: dict[str, str] = {}


def method_name(method: base.Frame | type[base.Frame]) -> str:
    """``basic.publish`` for pamqp's ``Basic.Publish`` (RabbitMQ's spelling)."""
    name = method.name
    found = _NAMES.get(name)
    if found is None:
        cls, _, meth = name.partition(".")
        found = _NAMES[name] = f"{cls.lower()}.{_dashed(meth)}"
    return found


def _dashed(camel: str) -> str:
    out = []
    for i, ch in enumerate(camel):
        if ch.isupper() and i:
            out.append("-")
        out.append(ch.lower())
    return "".join(out)
