"""Passwords and tokens as a users file stores them (:mod:`polymq_server.auth.usersfile`):
passwords as salted scrypt hashes, tokens as their sha256 hex, never in clear.

:func:`hash_password` and :func:`hash_token` make the stored values (``python -m
polymq_server.auth.provider`` prints them), :func:`verify_password` checks a password against its
hash (:func:`check_password` does so off the event loop, in this module's own small pool of
threads), :func:`parse_password_hash` checks a stored hash is one this module can verify,
and :func:`generate_token` makes a new token.

New hashes cost what OWASP's Password Storage Cheat Sheet asks of scrypt today (N=2^17,
r=8, p=1: 128 MiB and about half a second of one core each); a hash states its own
parameters (``scrypt$n$r$p$...``), so older ones (N=2^14) keep verifying at their cost.
At most :data:`CHECK_THREADS` checks run at once (each holds 128 * r * N bytes while it
runs): the others wait for a thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import hashlib
import hmac
import secrets
from concurrent.futures import ThreadPoolExecutor

__all__ = [
    "CHECK_THREADS",
    "DEFAULT_COST",
    "check_password",
    "generate_token",
    "hash_password",
    "hash_token",
    "parse_password_hash",
    "verify_password",
]

DEFAULT_COST = 2**17  # scrypt's N for new hashes (OWASP: N=2^17, r=8, p=1)
CHECK_THREADS = 2  # password checks at once (each needs 128 MiB at N=2^17)
_SCRYPT_R, _SCRYPT_P, _SALT_BYTES, _DKLEN = 8, 1, 16, 32
_MAX_MEMORY = 2**30  # bytes of scrypt's memory (128 * r * N) a stored hash may ask for


def hash_password(password: str, *, cost: int | None = None) -> str:
    """Salted scrypt: ``scrypt$n$r$p$salt_b64$hash_b64`` (n: ``cost``, a power of two;
    :data:`DEFAULT_COST` as it is when called, if none)."""
    cost = DEFAULT_COST if cost is None else cost
    if cost < 2 or cost & (cost - 1) or 128 * _SCRYPT_R * cost > _MAX_MEMORY:
        raise ValueError(f"scrypt's cost N must be a power of two from 2 to {_MAX_MEMORY // 1024}")
    salt = secrets.token_bytes(_SALT_BYTES)
    digest = _scrypt(password, salt, cost, _SCRYPT_R, _SCRYPT_P, _DKLEN)
    b64 = base64.b64encode
    return f"scrypt${cost}${_SCRYPT_R}${_SCRYPT_P}${b64(salt).decode()}${b64(digest).decode()}"


def verify_password(password: str, encoded: str) -> bool:
    """True if ``password`` matches ``encoded``; ValueError if ``encoded`` is malformed."""
    n, r, p, salt, expected = parse_password_hash(encoded)
    return hmac.compare_digest(_scrypt(password, salt, n, r, p, len(expected)), expected)


async def check_password(password: str, encoded: str | None) -> bool:
    """:func:`verify_password` in this module's pool of :data:`CHECK_THREADS` threads;
    ``encoded`` None (no such user, or one without a password) is False after checking a
    throw-away hash of today's cost, so that it takes as long as a real check."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool(), _verify_or_dummy, password, encoded)


def hash_token(token: str) -> str:
    """The sha256 hex under which a token is stored."""
    return hashlib.sha256(token.encode()).hexdigest()


def generate_token() -> str:
    return secrets.token_urlsafe(32)


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="polymq-password")


@functools.cache
def _dummy_hash() -> str:
    return hash_password(secrets.token_urlsafe(16))


def _verify_or_dummy(password: str, encoded: str | None) -> bool:
    return verify_password(password, encoded or _dummy_hash()) and encoded is not None


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int, dklen: int) -> bytes:
    maxmem = 128 * r * (n + p + 2) + 1024 * 1024
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=maxmem, dklen=dklen)


def parse_password_hash(encoded: str) -> tuple[int, int, int, bytes, bytes]:
    """``encoded``'s scrypt parameters n, r, p, its salt and its hash; ValueError if it is
    malformed or its parameters are unusable."""
    parts = encoded.split("$") if isinstance(encoded, str) else []
    try:
        if len(parts) != 6 or parts[0] != "scrypt":
            raise ValueError
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt = base64.b64decode(parts[4], validate=True)
        digest = base64.b64decode(parts[5], validate=True)
    except (ValueError, binascii.Error):
        raise ValueError("password hash must be 'scrypt$n$r$p$salt_b64$hash_b64'") from None
    if n < 2 or n & (n - 1) or not 1 <= r <= 64 or not 1 <= p <= 64 or 128 * r * n > _MAX_MEMORY:
        raise ValueError("password hash has unusable scrypt parameters n, r, p")
    if len(salt) < 8 or len(digest) < 16:
        raise ValueError("password hash has a salt or hash that is too short")
    return n, r, p, salt, digest
