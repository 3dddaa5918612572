"""Which virtual host a CONNECT frame's ``host`` header selects.

As RabbitMQ: the ``host`` header names the vhost (``/`` when there is none), and a vhost
this frontend does not serve (``POLYMQ_STOMP_VHOSTS``, ``/`` unless told; ``*`` serves any)
is refused with ERROR ``Bad CONNECT`` and RabbitMQ's body ``Virtual host '<name>' access
denied``. Unlike RabbitMQ, a host header that names this server, as STOMP 1.2 recommends
clients send ("the host name that the socket was established against") and as stomp.py
does by default, means the default vhost ``/``: an IP address, ``localhost``, this
machine's host name, the host a WebSocket was opened on, or a name listed in
``POLYMQ_STOMP_HOST_NAMES`` (e.g. a Kubernetes Service's DNS names). A configured vhost of
the same name wins.

What a vhost changes is the core names of the destinations (see ``destinations.py``).
"""

from __future__ import annotations

import ipaddress
import socket
from functools import lru_cache

from polymq_server.names import DEFAULT_VHOST

from .config import StompSettings
from .refusal import Refused

__all__ = ["DEFAULT_VHOST", "choose_vhost"]


@lru_cache(maxsize=1)
def _machine_names() -> frozenset[str]:
    names = {"localhost", "localhost.localdomain"}
    for get in (socket.gethostname, socket.getfqdn):
        try:
            names.add(get().lower())
        except OSError:  # pragma: no cover - no name at all
            pass
    return frozenset(names)


def _names_this_server(host: str, settings: StompSettings, reached: str | None) -> bool:
    low = host.strip().lower()
    name = low[1:-1] if low.startswith("[") and low.endswith("]") else low
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    return (
        name in _machine_names()
        or name in settings.host_names
        or (reached is not None and name == reached.lower())
    )


def choose_vhost(host: str | None, settings: StompSettings, reached: str | None = None) -> str:
    """The vhost of a CONNECT frame whose ``host`` header is ``host`` (None: absent), for a
    client that ``reached`` this host name (a WebSocket's Host), or Refused."""
    if host is None:
        return DEFAULT_VHOST
    vhosts = settings.vhosts
    if host in vhosts or ("*" in vhosts and host):
        return host
    if host and _names_this_server(host, settings, reached):
        return DEFAULT_VHOST
    raise Refused("auth", "Bad CONNECT", f"Virtual host '{host[:200]}' access denied")
