"""Passwords and tokens as a users file stores them (:mod:`polymq_server.usersfile`):
passwords as salted scrypt hashes, tokens as their sha256 hex, never in clear.

:func:`hash_password` and :func:`hash_token` make the stored values (``python -m
polymq_server.auth`` prints them), :func:`verify_password` checks a password against its
hash, :func:`parse_password_hash` checks a stored hash is one this module can verify, and
:func:`generate_token` makes a new token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

__all__ = [
    "generate_token",
    "hash_password",
    "hash_token",
    "parse_password_hash",
    "verify_password",
]

_SCRYPT_N, _SCRYPT_R, _SCRYPT_P, _SALT_BYTES, _DKLEN = 2**14, 8, 1, 16, 32


def hash_password(password: str) -> str:
    """Salted scrypt: ``scrypt$n$r$p$salt_b64$hash_b64``."""
    salt = secrets.token_bytes(_SALT_BYTES)
    digest = _scrypt(password, salt, _SCRYPT_N, _SCRYPT_R, _SCRYPT_P, _DKLEN)
    b64 = base64.b64encode
    return f"scrypt${_SCRYPT_N}${_SCRYPT_R}${_SCRYPT_P}${b64(salt).decode()}${b64(digest).decode()}"


def verify_password(password: str, encoded: str) -> bool:
    """True if ``password`` matches ``encoded``; ValueError if ``encoded`` is malformed."""
    n, r, p, salt, expected = parse_password_hash(encoded)
    return hmac.compare_digest(_scrypt(password, salt, n, r, p, len(expected)), expected)


def hash_token(token: str) -> str:
    """The sha256 hex under which a token is stored."""
    return hashlib.sha256(token.encode()).hexdigest()


def generate_token() -> str:
    return secrets.token_urlsafe(32)


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
    if n < 2 or n & (n - 1) or not 1 <= r <= 64 or not 1 <= p <= 64 or 128 * r * n > 2**30:
        raise ValueError("password hash has unusable scrypt parameters n, r, p")
    if len(salt) < 8 or len(digest) < 16:
        raise ValueError("password hash has a salt or hash that is too short")
    return n, r, p, salt, digest
