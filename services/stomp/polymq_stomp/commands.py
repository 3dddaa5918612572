"""What each frame a STOMP client sends asks of its session: :data:`COMMANDS`, the table the
session's reading looks every frame's command up in.

A handler runs at once, as the frame is read, and awaits nothing: what must be answered
before the next frame is read (CONNECT, SUBSCRIBE, DISCONNECT) starts as the session's busy
task; what may be answered later (an ACK's receipt) as a task of its own. SENDs and the
transaction frames go to the session's publisher (``publisher.py``), SUBSCRIBE and
UNSUBSCRIBE to its subscriptions (``subscription.py``); ACK and NACK are settled here,
fire-and-forget to the core. CONNECT and DISCONNECT are the session's own (its handshake
and its close). A handler refuses a frame by raising (a :class:`Refused`, or the core's
error): the session answers with an ERROR.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Final, Protocol

from polymq.types import Outcome

from .frames import Command, Frame
from .refusal import Refused

if TYPE_CHECKING:
    from polymq.client import Client
    from polymq_server.link.connections import Tracked

    from .parts import PartHub
    from .publisher import StompPublisher
    from .subscription import Subscriptions

__all__ = ["BY_NAME", "COMMANDS", "CommandSession"]


class CommandSession(Protocol):
    """The session as the frames' handlers see it."""

    publishing: bool  # it sent a SEND: held while a resource alarm is on

    @property
    def hub(self) -> PartHub: ...
    @property
    def tracked(self) -> Tracked: ...
    @property
    def publisher(self) -> StompPublisher: ...
    @property
    def subscriptions(self) -> Subscriptions: ...

    def client(self) -> Client: ...
    def update_reading(self) -> None: ...
    def receipt(self, receipt_id: str, *extra: tuple[str, str]) -> None: ...
    def start_busy(self, coro: Coroutine[Any, Any, None], frame: Frame) -> None: ...
    def spawn(self, coro: Coroutine[Any, Any, None], frame: Frame) -> None: ...
    async def connect(self, frame: Frame) -> None: ...
    async def disconnect(self, frame: Frame) -> None: ...


def _connect(session: CommandSession, frame: Frame) -> None:
    session.start_busy(session.connect(frame), frame)


def _send(session: CommandSession, frame: Frame) -> None:
    if not session.publishing:
        session.publishing = True  # a publisher: held while a resource alarm is on
        if session.hub.link.alarms:
            session.update_reading()
    session.tracked.messages_in += 1
    session.publisher.send(frame)


def _subscribe(session: CommandSession, frame: Frame) -> None:
    session.start_busy(session.subscriptions.subscribe(frame), frame)


def _unsubscribe(session: CommandSession, frame: Frame) -> None:
    session.subscriptions.unsubscribe(frame)


def _ack(session: CommandSession, frame: Frame) -> None:
    _settle(session, frame, nack=False)


def _nack(session: CommandSession, frame: Frame) -> None:
    _settle(session, frame, nack=True)


def _settle(session: CommandSession, frame: Frame, *, nack: bool) -> None:
    """ACK/NACK: fire-and-forget to the core; a RECEIPT once the core has processed it.
    NACK takes ``requeue: false`` to reject (dead-letter) instead of requeueing."""
    what = "NACK" if nack else "ACK"
    sub, tag = session.subscriptions.resolve(frame, what)
    outcome = Outcome.ACK
    if nack:
        raw = (frame.get("requeue") or "true").strip().lower()
        if raw not in ("true", "false"):
            raise Refused("header", "Invalid header", "requeue: true or false")
        outcome = Outcome.of_nack(raw == "true")
    receipt = frame.get("receipt")
    tx = frame.get("transaction")
    if tx is not None:  # (the receipt at once, as RabbitMQ: only a SEND's waits for COMMIT)
        session.publisher.add_ack(tx, sub, tag, outcome)
        if receipt is not None:
            session.receipt(receipt)
        return
    session.subscriptions.settle(sub, tag, outcome)
    if receipt is not None:
        session.spawn(_barrier_receipt(session, receipt), frame)


async def _barrier_receipt(session: CommandSession, receipt: str) -> None:
    """RECEIPT once the core has processed what was sent before (acks included)."""
    client = session.client()
    await session.hub.link.guard(client, client.ping())
    session.receipt(receipt)


def _begin(session: CommandSession, frame: Frame) -> None:
    session.publisher.begin(frame)


def _commit(session: CommandSession, frame: Frame) -> None:
    session.publisher.commit(frame)


def _abort(session: CommandSession, frame: Frame) -> None:
    session.publisher.abort(frame)


def _disconnect(session: CommandSession, frame: Frame) -> None:
    session.start_busy(session.disconnect(frame), frame)


COMMANDS: Final[dict[Command, Callable[[CommandSession, Frame], None]]] = {
    Command.CONNECT: _connect,
    Command.STOMP: _connect,
    Command.SEND: _send,
    Command.SUBSCRIBE: _subscribe,
    Command.UNSUBSCRIBE: _unsubscribe,
    Command.ACK: _ack,
    Command.NACK: _nack,
    Command.BEGIN: _begin,
    Command.COMMIT: _commit,
    Command.ABORT: _abort,
    Command.DISCONNECT: _disconnect,
}
# the same by command name: what the session looks up per frame (a name hashes in C, an
# Enum member in Python)
BY_NAME: Final = {command.value: handler for command, handler in COMMANDS.items()}
