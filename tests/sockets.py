"""Raw sockets for tests that speak to a listener byte by byte (no client library)."""

from __future__ import annotations

import socket

__all__ = ["read_all"]


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes (the socket's timeout, if it passes, fails the
    test with TimeoutError)."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out
