"""The service commands' flags (``polymq run``, ``core``, ``http``, ``stomp``, ``longpoll``,
``avro``, ``amqp``) and the settings they make.

:func:`add_arguments` adds the commands and their flags to ``polymq``'s parser
(:func:`common_arguments` the flags every service command shares, the bridge's too);
:func:`core_settings` and :func:`frontend_settings` read a service's settings from the
environment (``POLYMQ_...``) and change them by the flags given. A port left at its default
that is taken becomes 0 (a free one, and said). Running the services is
:mod:`polymq_cli.serve_cmd`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import importlib
import logging
import os
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from polymq_core.config import CoreSettings
from polymq_server.config import core_flag, from_env

__all__ = [
    "add_arguments",
    "common_arguments",
    "core_settings",
    "frontend_settings",
    "load_ref",
]

log = logging.getLogger("polymq")


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


OFF: Final = "off"  # a plain listener's port flag that turns it off (--amqp-port off)


def _port_or_off(text: str) -> int | str:
    """``--NAME-port``'s value where the plain listener can be off: a port, or ``off``."""
    if text.strip().lower() == OFF:
        return OFF
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a port number, or 'off'") from None


def _ports(args: argparse.Namespace, names: Sequence[str], defaults: Any) -> dict[str, Any]:
    """Resolve each ``--NAME-port``: explicit values stand; a taken default becomes 0;
    ``off`` turns the listener off (``NAME_plain``: false) and keeps the default port."""
    out: dict[str, Any] = {}
    for name in names:
        value = getattr(args, f"{name}_port")
        if value == OFF:
            out[f"{name}_plain"] = False
            value = getattr(defaults, f"{name}_port")
        elif value is None:
            value = getattr(defaults, f"{name}_port")
            if value and not _port_free(args.host, value):
                log.warning("port %d (%s) is taken; picking a free port instead", value, name)
                value = 0
        out[f"{name}_port"] = value
    return out


_CLUSTER_TLS_FLAGS: Final = (
    "cluster_tls_cert",
    "cluster_tls_key",
    "cluster_tls_ca",
    "peer_wire_port",
    "peer_admin_port",
)


def core_settings(args: argparse.Namespace) -> CoreSettings:
    """The core's settings: the environment's, changed by the flags (checked)."""
    base = from_env(CoreSettings, check=False)  # (checked below, with the flags)
    changes: dict[str, Any] = {"host": args.host or base.host}
    args.host = changes["host"]
    changes.update(_ports(args, ("core", "admin"), base))
    if args.insecure_dev_secret:
        changes["insecure_dev_secret"] = True
    # `polymq core --tls-cert/--tls-key` as the frontends take them (in `run` they are the
    # frontends'; the core's are --core-tls-cert/--core-tls-key in both)
    for name in ("cert", "key"):
        value = getattr(args, f"core_tls_{name}", None)
        if value is None and args.command == "core":
            value = getattr(args, f"tls_{name}", None)
        if value is not None:
            changes[f"core_tls_{name}"] = value
    if args.data_dir is not None:
        changes["data_dir"] = Path(args.data_dir)
    if args.shards is not None:
        changes["shards"] = args.shards
    if args.auth is not None:
        changes["auth"] = args.auth
    for flag in ("node_id", "peers", "cluster_port", "nats_url", *_CLUSTER_TLS_FLAGS):
        value = getattr(args, flag, None)
        if value is not None:
            changes[flag] = value
    settings: CoreSettings = dataclasses.replace(base, **changes)
    settings.check()
    return settings


def _frontend_changes(
    args: argparse.Namespace, core: tuple[str, int] | None, base: Any, ports: Sequence[str]
) -> dict[str, Any]:
    """What the flags change in a frontend's settings: host, ports, the core, auth."""
    changes: dict[str, Any] = {"host": args.host or base.host}
    args.host = changes["host"]
    changes.update(_ports(args, ports, base))
    if core is not None:
        changes["core_host"], changes["core_port"] = core
    elif getattr(args, "core", None):
        changes["core_host"], changes["core_port"] = core_flag(args.core)
    if args.auth is not None:
        changes["auth"] = args.auth
    for name in ("tls_cert", "tls_key", "core_tls", "core_tls_ca"):
        if getattr(args, name, None) is not None:
            changes[name] = getattr(args, name)
    return changes


def load_ref(ref: str) -> Any:
    """The class a ``"module:class"`` reference names, its module imported now (a service's
    dependencies are imported only when it runs)."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def frontend_settings(
    args: argparse.Namespace,
    core: tuple[str, int] | None,
    settings_ref: str,
    ports: Sequence[str],
    token: str | None,
) -> Any:
    """A frontend's settings: the environment's, changed by the flags (and, in `polymq
    run`, the one-off token its in-process core gave it)."""
    base = from_env(load_ref(settings_ref), check=False)  # (checked below, with the flags)
    changes = _frontend_changes(args, core, base, ports)
    if token is not None:
        changes["core_token"] = token
    settings = dataclasses.replace(base, **changes)
    settings.check()
    return settings


def common_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
    sp.add_argument("--ports-file", default=None, help="write the bound ports here as JSON")
    sp.add_argument("--auth", default=None, help="'anonymous' or 'file:/path/users.json'")
    sp.add_argument("--log-level", default=os.environ.get("POLYMQ_LOG_LEVEL", "INFO"))


def _core_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--core-port", type=int, default=None, help="wire protocol (7400; 0=any)")
    sp.add_argument("--admin-port", type=int, default=None, help="admin HTTP (7401; 0=any)")
    sp.add_argument("--data-dir", default=None, help="where the store lives")
    sp.add_argument("--shards", type=int, default=None, help="number of shards (4)")
    sp.add_argument("--node-id", default=None, help="this node's id in a cluster (POLYMQ_NODE_ID)")
    sp.add_argument(
        "--peers",
        default=None,
        metavar="HOST:PORT,...",
        help="the cluster nodes' cluster addresses, the same list on every node (self is "
        "skipped); turns on the replicated core, as POLYMQ_K8S_SERVICE does (POLYMQ_PEERS; "
        "docs/cluster.md)",
    )
    sp.add_argument(
        "--cluster-port",
        type=int,
        default=None,
        help="this node's cluster (NATS route) port (7422; POLYMQ_CLUSTER_PORT)",
    )
    sp.add_argument(
        "--nats",
        dest="nats_url",
        default=None,
        metavar="URL",
        help="use a NATS server run apart instead of starting one (POLYMQ_NATS_URL)",
    )
    for name, what in (
        ("cert", "this node's PEM certificate (chain) for TLS between the nodes"),
        ("key", "its PEM private key, unencrypted"),
        ("ca", "the PEM CA bundle that signed every node's certificate"),
    ):
        sp.add_argument(
            f"--cluster-tls-{name}",
            default=None,
            metavar="PEM",
            help=f"{what} (POLYMQ_CLUSTER_TLS_{name.upper()}; all three or none)",
        )
    sp.add_argument(
        "--insecure-dev-secret",
        action="store_true",
        default=False,
        help="a replicated core without POLYMQ_CLUSTER_SECRET runs on a public development "
        "secret, with which anyone reaching its ports is a peer and an administrator: for "
        "a development cluster only (POLYMQ_INSECURE_DEV_SECRET=1); else it refuses to start",
    )
    sp.add_argument(
        "--core-tls-cert",
        default=None,
        metavar="PEM",
        help="PEM certificate (chain): the core's wire and admin ports speak TLS only "
        "(POLYMQ_CORE_TLS_CERT; in a cluster, with cluster TLS)",
    )
    sp.add_argument(
        "--core-tls-key",
        default=None,
        metavar="PEM",
        help="PEM private key of --core-tls-cert, unencrypted (POLYMQ_CORE_TLS_KEY)",
    )
    sp.add_argument(
        "--peer-wire-port",
        type=int,
        default=None,
        help="with cluster TLS: the wire protocol for peers (7423; 0=any)",
    )
    sp.add_argument(
        "--peer-admin-port",
        type=int,
        default=None,
        help="with cluster TLS: the admin HTTP for peers (7424; 0=any)",
    )


def _http_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--http-port", type=int, default=None, help="JSON over HTTP (7480; 0=any)")


def _stomp_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--stomp-port", type=int, default=None, help="STOMP over TCP (61613; 0=any)")
    sp.add_argument(
        "--stomp-ws-port",
        type=int,
        default=None,
        help="STOMP over WebSocket at /ws, and a page at / (15674; 0=any)",
    )


def _tls_flags(sp: argparse.ArgumentParser, what: str) -> None:
    sp.add_argument(
        "--tls-cert",
        default=None,
        metavar="PEM",
        help=f"PEM certificate (chain): {what} (POLYMQ_TLS_CERT)",
    )
    sp.add_argument(
        "--tls-key",
        default=None,
        metavar="PEM",
        help="PEM private key of --tls-cert, unencrypted (POLYMQ_TLS_KEY)",
    )


def _longpoll_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--longpoll-port",
        type=int,
        default=None,
        help="long polling and SSE, a JS client and a demo page (7490; 0=any)",
    )


def _avro_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--avro-port",
        type=int,
        default=None,
        help="Avro over HTTP and the schema registry (7470; 0=any)",
    )


def _amqp_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--amqp-port",
        type=_port_or_off,
        default=None,
        help="AMQP 0-9-1 (5672; 0=any); 'off': no plain AMQP, AMQP over TLS only (with "
        "--tls-cert/--tls-key; POLYMQ_AMQP_PLAIN=false)",
    )
    sp.add_argument(
        "--amqp-admin-port",
        type=int,
        default=None,
        help="the AMQP frontend's /healthz, /readyz and /metrics (15692; 0=any)",
    )
    sp.add_argument(
        "--amqp-tls-port",
        type=int,
        default=None,
        help="AMQP over TLS, with --tls-cert and --tls-key (5671; 0=any)",
    )


_FRONTENDS: list[tuple[str, str, Callable[[argparse.ArgumentParser], None], str]] = [
    (
        "http",
        "the JSON over HTTP frontend",
        _http_flags,
        "HTTPS on --http-port (one listener, TLS only)",
    ),
    (
        "stomp",
        "the STOMP frontend (TCP and WebSocket)",
        _stomp_flags,
        "STOMP over TLS on both listeners (WSS on --stomp-ws-port)",
    ),
    (
        "longpoll",
        "the long-polling and SSE frontend for browsers",
        _longpoll_flags,
        "HTTPS on --longpoll-port (one listener, TLS only)",
    ),
    (
        "avro",
        "the Avro over HTTP frontend and schema registry",
        _avro_flags,
        "HTTPS on --avro-port (one listener, TLS only)",
    ),
    (
        "amqp",
        "the AMQP 0-9-1 frontend",
        _amqp_flags,
        "AMQP over TLS on --amqp-tls-port, besides plain AMQP (--amqp-port off: alone)",
    ),
]


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the service commands (``run``, ``core``, ``http``, ``stomp``, ``longpoll``,
    ``avro``, ``amqp``) to ``polymq``'s, in the order ``polymq --help`` lists them."""
    run = sub.add_parser("run", help="the core and every frontend in one process")
    common_arguments(run)
    run.add_argument(
        "--workers",
        default=os.environ.get("POLYMQ_WORKERS") or "auto",
        metavar="N|auto",
        help="processes serving STOMP and AMQP on the same ports (SO_REUSEPORT): this one "
        "with the core and every frontend, and N - 1 workers; auto: the CPUs this process "
        "may use, one process on two or fewer (POLYMQ_WORKERS; docs/workers.md)",
    )
    _core_flags(run)
    _http_flags(run)
    _stomp_flags(run)
    _longpoll_flags(run)
    _avro_flags(run)
    _amqp_flags(run)
    _tls_flags(
        run,
        "TLS on every frontend listener: HTTPS on the http, longpoll and avro ports, STOMP "
        "over TLS and WSS, and AMQP's amqps port; plain AMQP (unless --amqp-port off) and "
        "AMQP's admin port stay plain, the core's ports too (see --core-tls-cert)",
    )
    core = sub.add_parser("core", help="the core broker")
    common_arguments(core)
    _core_flags(core)
    for name in ("cert", "key"):  # (as the frontends take theirs)
        core.add_argument(
            f"--tls-{name}", default=None, metavar="PEM", help=f"as --core-tls-{name}"
        )
    # each frontend alone: its flags, its TLS, and the core it links to
    for name, what, flags, tls in _FRONTENDS:
        frontend = sub.add_parser(name, help=what)
        common_arguments(frontend)
        flags(frontend)
        _tls_flags(frontend, tls)
        frontend.add_argument(
            "--core",
            default=os.environ.get("POLYMQ_CORE") or None,
            metavar="HOST:PORT[,HOST:PORT...]",
            help="the core's address, or several (a cluster's nodes; a name may resolve to "
            "several, as a headless Service's does): the link tries them in turn and moves "
            "on when one is lost (POLYMQ_CORE; default 127.0.0.1:7400)",
        )
        frontend.add_argument(
            "--core-tls",
            action="store_true",
            default=None,
            help="TLS to the core (one started with --tls-cert), its certificate verified "
            "against the system's CAs (POLYMQ_CORE_TLS)",
        )
        frontend.add_argument(
            "--core-tls-ca",
            default=None,
            metavar="PEM",
            help="TLS to the core, its certificate verified against this PEM CA bundle "
            "(POLYMQ_CORE_TLS_CA)",
        )
