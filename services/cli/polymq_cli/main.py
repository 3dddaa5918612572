"""The ``polymq`` command: one sub-command per service, and ``run`` for all in one process.

::

    polymq run   [--host H] [--core-port N] [--admin-port N] [--http-port N]
                 [--stomp-port N] [--stomp-ws-port N] [--tls-cert PEM --tls-key PEM]
                 [--longpoll-port N] [--avro-port N] [--amqp-port N] [--amqp-admin-port N]
                 [--amqp-tls-port N] [--data-dir DIR] [--ports-file FILE]
    polymq core  [--host H] [--core-port N] [--admin-port N] [--data-dir DIR] ...
    polymq http  [--host H] [--http-port N] [--tls-cert PEM --tls-key PEM] [--core HOST:PORT] ...
    polymq stomp [--host H] [--stomp-port N] [--stomp-ws-port N] [--tls-cert PEM --tls-key PEM]
                 [--core HOST:PORT] ...
    polymq longpoll [--host H] [--longpoll-port N] [--tls-cert PEM --tls-key PEM]
                 [--core HOST:PORT] ...
    polymq avro  [--host H] [--avro-port N] [--tls-cert PEM --tls-key PEM] [--core HOST:PORT] ...
    polymq amqp  [--host H] [--amqp-port N] [--amqp-admin-port N] [--amqp-tls-port N]
                 [--tls-cert PEM --tls-key PEM] [--core HOST:PORT] ...

    polymq run   --node-id ID --peers HOST:PORT,... [--cluster-port N] [--nats URL] ...
                 (one node of a replicated core: docs/cluster.md; POLYMQ_K8S_SERVICE instead
                 of or besides --peers: the peers from that Service's endpoints)
    polymq cluster list --admin URL [--timeout S] [--json]
                 (the nodes that answered, as one node's admin API sees them)
    polymq destinations list | connections list | connections close ID | peek DEST |
           publish DEST BODY | purge DEST | consume DEST  [--admin URL] [--json] ...
                 (the operator's commands, clients of a node's admin API: admin_cmd.py)
    polymq check [--http URL] [--longpoll URL] [--avro URL] [--stomp HOST:PORT] [--amqp URL]
                 [--core HOST:PORT] [--timeout S]
                 (one message through each frontend given and back: check_cmd.py, helm test)
    polymq nats  [--peers HOST:PORT,...] [--node-id ID] [--cluster-port N] [--client-port N]
                 (a node's nats-server run apart, for a core given --nats: nats_cmd.py)

    polymq bridge --config LINKS.json [--rabbitmq-url URL] ...
                 (moves messages between polymq and an existing RabbitMQ, both ways)
    polymq spark-push --input FILE --destination KIND/NAME --url AVRO-URL ...
                 (a file into polymq through Spark's format("polymq"); needs the spark extra)

A port of 0 picks a free one; ``--ports-file`` receives ``{"core": N, "admin": N, ...}`` once
every listener is bound. When a port is left at its default and that port is taken, a free
one is picked instead (and said). SIGTERM and Ctrl-C stop gracefully: stop accepting on
every listener at once (lame duck), tell connected clients to go elsewhere once what they
sent is answered, finish in-flight writes, flush the store, exit 0.

``--tls-cert``/``--tls-key`` (or ``POLYMQ_TLS_CERT``/``POLYMQ_TLS_KEY``) put a frontend's
listeners on TLS: HTTPS on the ``http``, ``longpoll`` and ``avro`` ports, STOMP over TLS and
WSS on both STOMP ports, and AMQP's extra ``amqps`` listener. In ``run`` they apply to every
frontend at once; the core's wire and admin ports, AMQP's plain port and its admin port stay
plain. A certificate or key that is missing, unreadable or does not load is a configuration
error (exit 2).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import errno
import gc
import importlib
import json
import logging
import os
import secrets
import signal
import socket
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from prometheus_client import CollectorRegistry

from polymq_cli.admin_cmd import COMMANDS as ADMIN_COMMANDS
from polymq_core.config import CoreSettings
from polymq_core.endpoints import EndpointsError
from polymq_core.service import CoreService
from polymq_server.auth import WithServiceToken, load_provider
from polymq_server.config import ConfigError, from_env
from polymq_server.resources import raise_open_files

log = logging.getLogger("polymq")


class Service(Protocol):
    async def start(self) -> dict[str, int]: ...
    async def lame_duck(self) -> None: ...  # stop accepting (a stop's first step, on all)
    async def stop(self) -> None: ...


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


def _ports(args: argparse.Namespace, names: Sequence[str], defaults: Any) -> dict[str, int]:
    """Resolve each ``--NAME-port``: explicit values stand; a taken default becomes 0."""
    out = {}
    for name in names:
        value = getattr(args, f"{name}_port")
        if value is None:
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


def _core_settings(args: argparse.Namespace) -> CoreSettings:
    base = from_env(CoreSettings)
    changes: dict[str, Any] = {"host": args.host or base.host}
    args.host = changes["host"]
    changes.update(_ports(args, ("core", "admin"), base))
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
        host, _, port = args.core.rpartition(":")
        try:
            changes["core_host"], changes["core_port"] = host or "127.0.0.1", int(port)
        except ValueError:
            raise ConfigError(f"--core {args.core!r}: expected HOST:PORT") from None
    if args.auth is not None:
        changes["auth"] = args.auth
    for name in ("tls_cert", "tls_key"):
        if getattr(args, name, None) is not None:
            changes[name] = getattr(args, name)
    return changes


# The frontends, in the order `polymq run` starts them: the command, its settings and service
# classes ("module:class", imported when used), the ports its flags set, and the listener
# that serves https:// with TLS (the AMQP frontend names its TLS port apart: amqp_tls).
# seconds a service may take to stop: a frontend; the core (it answers what it read for up to
# 10 s, then flushes its stores)
_STOP_TIMEOUT: Final = 12.0
_CORE_STOP_TIMEOUT: Final = 60.0
_FRONTENDS: Final = (
    ("http", "polymq_http.config:HttpSettings", "polymq_http.service:HttpService",
     ("http",), "http"),
    ("stomp", "polymq_stomp.config:StompSettings", "polymq_stomp.service:StompService",
     ("stomp", "stomp_ws"), "stomp_ws"),
    ("longpoll", "polymq_longpoll.config:LongpollSettings",
     "polymq_longpoll.service:LongpollService", ("longpoll",), "longpoll"),
    ("avro", "polymq_avro.config:AvroSettings", "polymq_avro.service:AvroService",
     ("avro",), "avro"),
    ("amqp", "polymq_amqp.config:AmqpSettings", "polymq_amqp.service:AmqpService",
     ("amqp", "amqp_admin", "amqp_tls"), None),
)  # fmt: skip


def _load(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _frontend_settings(
    args: argparse.Namespace,
    core: tuple[str, int] | None,
    settings_ref: str,
    ports: Sequence[str],
    token: str | None,
) -> Any:
    """A frontend's settings: the environment's, changed by the flags (and, in `polymq
    run`, the one-off token its in-process core gave it)."""
    base = from_env(_load(settings_ref))
    changes = _frontend_changes(args, core, base, ports)
    if token is not None:
        changes["core_token"] = token
    return dataclasses.replace(base, **changes)


def _write_ports(path: str, ports: dict[str, int], pids: list[int]) -> None:
    """Atomically, so a reader never sees half a file. ``pids``: every process of this
    node (polymq, and in a cluster its nats-server), for tests that kill or freeze it."""
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps({**ports, "pids": pids}))
    os.replace(tmp, path)


def _tune_gc() -> None:
    """Keep the cyclic garbage collector off the message path. A broker holds many long-lived
    objects (queued messages, subscriptions): with the default thresholds every full
    collection walks all of them, which was ~half the CPU per record of Avro ingest into a
    growing stream (bench `avro`: 4.4 of 9.2 us/record). Objects made at start-up are moved
    out of the collector's view, and collections run less often; reference counting still
    frees everything without cycles at once."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 10)


async def _serve(args: argparse.Namespace) -> int:
    registry = CollectorRegistry()
    services: list[Service] = []
    ports: dict[str, int] = {}
    secure: set[str] = set()  # the listeners that speak TLS (https:// in the list below)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        core_addr: tuple[str, int] | None = None
        core: CoreService | None = None
        service_token: str | None = None
        if args.command in ("run", "core"):
            settings = _core_settings(args)
            auth = load_provider(settings.auth)
            if args.command == "run":  # in-process frontends log in with a one-off token
                service_token = secrets.token_urlsafe(32)
                auth = WithServiceToken(auth, service_token)
            # polymq run: its frontends reach the core without a socket
            core = CoreService(settings, registry, auth, in_process=args.command == "run")
            services.append(core)
            ports.update(await _starting(core.start(), stop))
            core_addr = (settings.host, ports["core"])
            if args.command == "run" and settings.auth in ("", "anonymous"):
                log.warning("%s (set --auth file:users.json to require logins)", auth.describe())
        for command, settings_ref, service_ref, port_names, secure_port in _FRONTENDS:
            if args.command not in ("run", command):
                continue
            fe_settings = _frontend_settings(
                args, core_addr, settings_ref, port_names, service_token
            )
            service = _load(service_ref)(fe_settings, registry)
            services.append(service)
            ports.update(await _starting(service.start(), stop))
            if secure_port is not None and fe_settings.tls_cert:
                secure.add(secure_port)
        _tune_gc()
        if core is not None and core.cluster is not None:
            core.cluster.add_listeners({k: v for k, v in ports.items() if k not in core.ports})
        if args.ports_file:
            pids = core.pids if core is not None else [os.getpid()]
            _write_ports(args.ports_file, ports, pids)
        host = args.host
        schemes = {
            "admin": "http://",
            "http": "http://",
            "stomp_ws": "http://",
            "longpoll": "http://",
            "avro": "http://",
            "amqp": "amqp://",
            "amqp_tls": "amqps://",
            "amqp_admin": "http://",
        }
        schemes.update(dict.fromkeys(secure, "https://"))
        for name, port in ports.items():
            scheme = schemes.get(name, "")
            print(f"polymq {name:<10} listening on {scheme}{host}:{port}", flush=True)
        print("polymq ready (Ctrl-C to stop)", flush=True)
        await stop.wait()
        log.info("shutting down")
    finally:
        # lame duck first, every listener at once: no new connection anywhere while the
        # services stop one by one (each then tells its clients to go elsewhere)
        for svc in services:
            try:
                await asyncio.wait_for(svc.lame_duck(), _STOP_TIMEOUT)
            except Exception:
                log.exception("error while %s stopped accepting", type(svc).__name__)
        for svc in reversed(services):
            try:
                limit = _CORE_STOP_TIMEOUT if isinstance(svc, CoreService) else _STOP_TIMEOUT
                await asyncio.wait_for(svc.stop(), limit)
            except TimeoutError:
                log.error(
                    "%s did not stop within %.0f s; going on without it. Tasks:\n%s",
                    type(svc).__name__,
                    limit,
                    _task_dump(),
                )
            except Exception:
                log.exception("error while stopping %s", type(svc).__name__)
    return 0


class _Interrupted(Exception):
    """SIGTERM or Ctrl-C came while a service was still starting."""


async def _starting(
    start: Coroutine[Any, Any, dict[str, int]], stop: asyncio.Event
) -> dict[str, int]:
    """A service's start, given up when the process is told to stop meanwhile (a cluster
    node waiting for its peers must not ignore SIGTERM)."""
    task = asyncio.ensure_future(start)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((task, stopping), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise _Interrupted
    return task.result()


def _task_dump() -> str:
    """Where each task of the loop waits (a line of its innermost frame each)."""
    lines = []
    for task in asyncio.all_tasks():
        frames = task.get_stack(limit=None)
        where = (
            f"{frames[-1].f_code.co_filename}:{frames[-1].f_lineno} {frames[-1].f_code.co_name}"
            if frames
            else "(not started)"
        )
        lines.append(f"  {task.get_name()}: {task.get_coro()!r} at {where}")
    return "\n".join(sorted(lines)[:200])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="polymq", description="polymq multi-protocol message gateway")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
        sp.add_argument("--ports-file", default=None, help="write the bound ports here as JSON")
        sp.add_argument("--auth", default=None, help="'anonymous' or 'file:/path/users.json'")
        sp.add_argument("--log-level", default=os.environ.get("POLYMQ_LOG_LEVEL", "INFO"))

    def core_flags(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--core-port", type=int, default=None, help="wire protocol (7400; 0=any)")
        sp.add_argument("--admin-port", type=int, default=None, help="admin HTTP (7401; 0=any)")
        sp.add_argument("--data-dir", default=None, help="where the store lives")
        sp.add_argument("--shards", type=int, default=None, help="number of shards (4)")
        sp.add_argument(
            "--node-id", default=None, help="this node's id in a cluster (POLYMQ_NODE_ID)"
        )
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

    def http_flags(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--http-port", type=int, default=None, help="JSON over HTTP (7480; 0=any)")

    def stomp_flags(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--stomp-port", type=int, default=None, help="STOMP over TCP (61613; 0=any)"
        )
        sp.add_argument(
            "--stomp-ws-port",
            type=int,
            default=None,
            help="STOMP over WebSocket at /ws, and a page at / (15674; 0=any)",
        )

    def tls_flags(sp: argparse.ArgumentParser, what: str) -> None:
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

    def longpoll_flags(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--longpoll-port",
            type=int,
            default=None,
            help="long polling and SSE, a JS client and a demo page (7490; 0=any)",
        )

    def avro_flags(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--avro-port",
            type=int,
            default=None,
            help="Avro over HTTP and the schema registry (7470; 0=any)",
        )

    def amqp_flags(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--amqp-port", type=int, default=None, help="AMQP 0-9-1 (5672; 0=any)")
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

    run = sub.add_parser("run", help="the core and every frontend in one process")
    common(run)
    core_flags(run)
    http_flags(run)
    stomp_flags(run)
    longpoll_flags(run)
    avro_flags(run)
    amqp_flags(run)
    tls_flags(
        run,
        "TLS on every frontend listener: HTTPS on the http, longpoll and avro ports, STOMP "
        "over TLS and WSS, and AMQP's amqps port; the core's wire and admin ports, plain "
        "AMQP and AMQP's admin port stay plain",
    )
    core = sub.add_parser("core", help="the core broker")
    common(core)
    core_flags(core)
    http = sub.add_parser("http", help="the JSON over HTTP frontend")
    common(http)
    http_flags(http)
    tls_flags(http, "HTTPS on --http-port (one listener, TLS only)")
    http.add_argument("--core", default=None, help="the core's HOST:PORT (127.0.0.1:7400)")
    stomp = sub.add_parser("stomp", help="the STOMP frontend (TCP and WebSocket)")
    common(stomp)
    stomp_flags(stomp)
    tls_flags(stomp, "STOMP over TLS on both listeners (WSS on --stomp-ws-port)")
    stomp.add_argument("--core", default=None, help="the core's HOST:PORT (127.0.0.1:7400)")
    longpoll = sub.add_parser("longpoll", help="the long-polling and SSE frontend for browsers")
    common(longpoll)
    longpoll_flags(longpoll)
    tls_flags(longpoll, "HTTPS on --longpoll-port (one listener, TLS only)")
    longpoll.add_argument("--core", default=None, help="the core's HOST:PORT (127.0.0.1:7400)")
    avro = sub.add_parser("avro", help="the Avro over HTTP frontend and schema registry")
    common(avro)
    avro_flags(avro)
    tls_flags(avro, "HTTPS on --avro-port (one listener, TLS only)")
    avro.add_argument("--core", default=None, help="the core's HOST:PORT (127.0.0.1:7400)")
    amqp = sub.add_parser("amqp", help="the AMQP 0-9-1 frontend")
    common(amqp)
    amqp_flags(amqp)
    tls_flags(amqp, "AMQP over TLS on --amqp-tls-port, besides plain AMQP")
    amqp.add_argument("--core", default=None, help="the core's HOST:PORT (127.0.0.1:7400)")
    from polymq_cli.cluster_cmd import add_arguments as cluster_arguments

    cluster_arguments(sub)
    from polymq_cli.admin_cmd import add_arguments as admin_arguments

    admin_arguments(sub)
    from polymq_cli.check_cmd import add_arguments as check_arguments

    check_arguments(sub)
    from polymq_cli.nats_cmd import add_arguments as nats_arguments

    nats_arguments(sub)
    bridge = sub.add_parser("bridge", help="move messages between polymq and a RabbitMQ")
    common(bridge)
    from polymq_bridge.main import add_arguments as bridge_arguments

    bridge_arguments(bridge, common=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["spark-push"]:  # its own options; pyspark is imported only here
        from polymq_spark.cli import main as spark_push

        return spark_push(argv[1:], prog="polymq spark-push")
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.command == "cluster":  # a client of a node's admin API
        from polymq_cli.cluster_cmd import run as run_cluster

        return run_cluster(args)
    if args.command in ADMIN_COMMANDS:  # clients of a node's admin API
        from polymq_cli.admin_cmd import run as run_admin

        return run_admin(args)
    if args.command == "check":  # a client of the frontends
        from polymq_cli.check_cmd import run as run_check

        return run_check(args)
    if args.command == "nats":  # becomes nats-server (exec)
        from polymq_cli.nats_cmd import run as run_nats

        return run_nats(args)
    if args.command == "bridge":  # its own service loop, settings and exit codes
        from polymq_bridge.main import run as run_bridge

        return run_bridge(args)
    raise_open_files()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        return asyncio.run(_serve(args))
    except ConfigError as exc:
        print(f"polymq: configuration error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # e.g. a malformed auth file
        print(f"polymq: {exc}", file=sys.stderr)
        return 2
    except (OSError, EndpointsError) as exc:  # (EndpointsError: no Kubernetes API, no peer)
        print(f"polymq: cannot start: {exc}", file=sys.stderr)
        return 1
    except _Interrupted:
        print("polymq: stopped while starting", file=sys.stderr)
        return 0


if __name__ == "__main__":
    sys.exit(main())
