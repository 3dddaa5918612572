"""Where a client reaches the core: its addresses, as ``"host:port"`` strings (a list, or one
comma-separated string), each name expanded to every address DNS gives it (a Kubernetes
headless Service names every ready pod), and the jittered exponential back-off between
rounds of attempts. Sans-IO: the resolver is passed in, and randomness too where a test
wants it fixed.

::

    parse_addresses("n1:7400,n2:7400")          # [Address('n1', 7400), Address('n2', 7400)]
    parse_addresses(["[::1]:7400", "core"])       # the port defaults to 7400
    await expand(addrs, resolve)                  # names -> one Address per IP, in order
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

__all__ = ["DEFAULT_PORT", "Address", "Backoff", "Resolver", "expand", "is_ip", "parse_addresses"]

DEFAULT_PORT = 7400

# the IP addresses ``host`` resolves to for TCP on ``port`` (OSError when it resolves to none)
Resolver = Callable[[str, int], Awaitable[list[str]]]


@dataclass(frozen=True, slots=True)
class Address:
    """One place to connect to: ``host`` (a name or an IP) and ``port``; ``name`` is the
    host name it was given as, when DNS expanded it to ``host`` (TLS checks the certificate
    against ``name``)."""

    host: str
    port: int
    name: str = ""

    @property
    def server_name(self) -> str:
        """The host name as given (what a TLS certificate must name)."""
        return self.name or self.host

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        shown = f"{host}:{self.port}"
        return f"{shown} ({self.name})" if self.name and self.name != self.host else shown


def _one(text: str, default_port: int) -> Address:
    item = text.strip()
    if not item:
        raise ValueError("an empty address")
    if item.startswith("["):  # [v6]:port or [v6]
        host, sep, rest = item[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"{item!r}: expected [IPv6]:PORT")
        port_text = rest[1:]
    elif item.count(":") > 1:  # a bare IPv6 address, no port
        host, port_text = item, ""
    else:
        host, _, port_text = item.partition(":")
    if not host:
        raise ValueError(f"{item!r}: no host")
    if not port_text:
        return Address(host, default_port)
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"{item!r}: the port {port_text!r} is not a number") from None
    if not 1 <= port <= 65535:
        raise ValueError(f"{item!r}: the port must be 1..65535")
    return Address(host, port)


def parse_addresses(spec: str | Iterable[str], default_port: int = DEFAULT_PORT) -> list[Address]:
    """The addresses of ``spec``: ``"host:port"`` strings (``[v6]:port`` for IPv6; a
    missing port is ``default_port``), as a list or as one comma-separated string.
    Duplicates are dropped, the order kept. ``ValueError`` names a malformed one."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    if isinstance(spec, str) and not spec.strip():
        raise ValueError("no core address given")
    out: list[Address] = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"{item!r}: an address is a 'host:port' string")
        address = _one(item, default_port)
        if address not in out:
            out.append(address)
    if not out:
        raise ValueError("no core address given")
    return out


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def expand(
    addresses: Sequence[Address],
    resolve: Resolver,
    keep: Callable[[Address], bool] = lambda a: False,
) -> list[Address]:
    """Each address whose host is a name, replaced by one address per IP it resolves to (as
    a headless Service's name gives every pod), in the resolver's order; IPs, and those
    ``keep`` says to keep as they are, stay. A name that does not resolve stays too (the
    attempt to connect will say why). Duplicates are dropped."""
    out: list[Address] = []
    for address in addresses:
        found: list[Address] = [address]
        if not is_ip(address.host) and not keep(address):
            try:
                ips = await resolve(address.host, address.port)
            except OSError:
                ips = []
            if ips:
                found = [Address(ip, address.port, address.host) for ip in ips]
        for a in found:
            if a not in out:
                out.append(a)
    return out


class Backoff:
    """Jittered exponential back-off: each :meth:`next` delay is the current step times a
    random factor in [0.5, 1), and the step doubles up to ``maximum``; :meth:`reset` after
    a success."""

    def __init__(
        self,
        initial: float = 0.05,
        maximum: float = 2.0,
        factor: float = 2.0,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if not 0 < initial <= maximum or factor < 1:
            raise ValueError("need 0 < initial <= maximum and factor >= 1")
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self._rand = rand
        self._step = initial

    def next(self) -> float:
        delay = self._step * (0.5 + 0.5 * self._rand())
        self._step = min(self._step * self.factor, self.maximum)
        return delay

    def reset(self) -> None:
        self._step = self.initial
