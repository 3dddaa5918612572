"""Who a request is (``Authorization: Basic`` or ``Bearer``) and what it may do.

A thin layer over :mod:`polymq_server.auth.provider`: the provider authenticates, and successful
logins are
remembered for a short while (keyed by a hash of the header, never the header itself) so
that a client sending Basic credentials on every request does not pay for scrypt each time.
A users reload (:mod:`polymq_server.reload`, heard from the core by :func:`reloaded_access`)
forgets them: an old password or grant does not outlive it. It reaches the requests held open too
(a long poll, a Server-Sent Events stream): each is :meth:`Access.held` while it waits,
and one whose login or permission the reload took away is ended with the error
(:func:`until_revoked`: Unauthorized, 401, or Forbidden, 403) rather than answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from polymq.errors import Forbidden, PolymqError, Unauthorized
from polymq.types import Message

from ..auth.provider import AuthProvider, Permission, Principal, authenticate_http, load_provider
from ..link.connections import revoked
from ..link.corelink import CoreLink
from ..reload import Reloader

__all__ = ["Access", "Revocation", "reloaded_access", "until_revoked"]

T = TypeVar("T")
Revocation = asyncio.Future[None]  # fails with why a held request's login or grant was taken


@dataclass(eq=False, slots=True)
class _Held:
    """A request held open as ``principal``, with ``permission`` on ``destination``."""

    principal: Principal
    permission: Permission
    destination: str
    revocation: Revocation


_TTL = 60.0  # seconds a successful login is remembered
_MAX_ENTRIES = 4096


class Access:
    def __init__(self, provider: AuthProvider) -> None:
        self.provider = provider
        self._cache: OrderedDict[bytes, tuple[float, Principal]] = OrderedDict()
        self._held: set[_Held] = set()  # requests held open (long polls, SSE streams)

    async def principal(self, authorization: str | None, source: str | None = None) -> Principal:
        """The principal behind an ``Authorization`` header of a request from the address
        ``source``; Unauthorized if refused (:class:`~polymq_server.auth.logins.TooManyLogins`
        when that source failed too often lately)."""
        if authorization is None or not authorization.strip():
            return await self.provider.anonymous()
        try:
            key = hashlib.sha256(authorization.encode("utf-8")).digest()
        except UnicodeEncodeError:
            raise Unauthorized("malformed Authorization header") from None
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None:
            if hit[0] > now:
                self._cache.move_to_end(key)
                return hit[1]
            del self._cache[key]
        principal = await authenticate_http(self.provider, authorization, source)
        self._cache[key] = (now + _TTL, principal)
        while len(self._cache) > _MAX_ENTRIES:
            self._cache.popitem(last=False)
        return principal

    def forget(self) -> None:
        """Forget every remembered login (the users changed)."""
        self._cache.clear()

    @contextlib.contextmanager
    def held(
        self, principal: Principal, permission: Permission, destination: str
    ) -> Iterator[Revocation]:
        """While a request of ``principal`` is held open using ``permission`` on
        ``destination``: a future that a users reload fails (:meth:`recheck`) if it took
        the login or that permission away (see :func:`until_revoked`)."""
        held = _Held(principal, permission, destination, asyncio.get_running_loop().create_future())
        self._held.add(held)
        try:
            yield held.revocation
        finally:
            self._held.discard(held)
            if held.revocation.done():
                held.revocation.exception()  # (retrieved: the request may have ended first)
            else:
                held.revocation.cancel()

    def recheck(self) -> None:
        """The users were reloaded: every request held open whose login no longer holds
        (its user removed, its password or token changed) fails with Unauthorized, and one
        whose permission was withdrawn with Forbidden."""
        for held in list(self._held):
            if held.revocation.done():
                continue
            now = self.provider.refresh(held.principal)
            error: PolymqError
            if now is None:
                error = Unauthorized(revoked(held.principal))
            else:
                try:
                    self.provider.authorize(now, held.permission, held.destination)
                    continue
                except Forbidden as exc:
                    error = Forbidden(f"{exc.message} (withdrawn by a users reload)")
            held.revocation.set_exception(error)

    def authorize(self, principal: Principal, permission: Permission, destination: str) -> None:
        """Return if allowed, else raise Forbidden."""
        self.provider.authorize(principal, permission, destination)

    def authorize_replies(self, principal: Principal, messages: Iterable[Message]) -> None:
        """Return if ``principal`` may write where each message's ``reply_to`` names (a
        responder writes there: ``AuthProvider.authorize_replies``), else Forbidden."""
        self.provider.authorize_replies(principal, messages)

    def authorize_prefix(self, principal: Principal, permission: Permission, prefix: str) -> None:
        """Return if allowed on every string that starts with ``prefix`` (listing the keys
        ``kv/<prefix>...``: ``AuthProvider.authorize_prefix``), else raise Forbidden."""
        self.provider.authorize_prefix(principal, permission, prefix)


def reloaded_access(auth: str | None, link: CoreLink, service: str) -> Access:
    """The :class:`Access` of frontend ``service`` from its ``POLYMQ_AUTH`` spec ``auth``;
    every reload the core publishes through ``link`` re-reads its users file and forgets the
    logins it remembered."""
    access = Access(load_provider(auth))
    reloader = Reloader(
        access.provider, users_required=False, name=service, applied=lambda _: access.forget()
    )
    reloader.users_hooks.append(access.recheck)  # (the requests held open)
    link.follow_config(reloader)
    return access


async def until_revoked(aw: Awaitable[T], revocation: Revocation) -> T:
    """What ``aw`` gives, unless ``revocation`` fails first (a users reload took the
    login or the permission away): then ``aw`` is cancelled and its error raised."""
    task = asyncio.ensure_future(aw)
    try:
        await asyncio.wait((task, revocation), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    revocation.result()  # (raises: it failed)
    raise AssertionError("a revocation only fails")  # pragma: no cover
