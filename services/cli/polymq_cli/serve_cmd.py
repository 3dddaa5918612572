"""``polymq run``, ``core``, ``http``, ``stomp``, ``longpoll``, ``avro`` and ``amqp``: start the
services, print where they listen, and stop them gracefully.

``run`` starts the core and every frontend in one process (the frontends reach the core
without a socket, logging in with a one-off token), and with ``--workers N`` the STOMP and
AMQP frontends again in N - 1 worker processes on the same ports
(:mod:`polymq_cli.workers`); the others start one service each. Their
flags and settings are :mod:`polymq_cli.serve_flags`'s. A stop (SIGTERM, Ctrl-C) puts every
listener in lame duck at once, then stops the services one by one, the core last.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import secrets
import signal
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, Final

from prometheus_client import CollectorRegistry

from polymq_core.cluster.endpoints import EndpointsError
from polymq_core.service import CoreService
from polymq_server.auth.provider import WithServiceToken, load_provider
from polymq_server.config import ConfigError
from polymq_server.resources import raise_open_files
from polymq_server.sessions.frontend import Listening

from .process import STOP_TIMEOUT, Service, stop_services, tune_gc
from .serve_flags import core_settings, frontend_settings, load_ref
from .workers import WorkerRegistry, Workers, worker_count

__all__ = ["Service", "run"]

log = logging.getLogger("polymq")


# The frontends, in the order `polymq run` starts them: the command, its settings and service
# classes ("module:class", imported when used), the ports its flags set, and the listener
# that serves https:// with TLS (the AMQP frontend names its TLS port apart: amqp_tls), and
# whether `polymq run --workers N` serves it in its workers too (connection protocols over
# TCP: a client's requests all go to the process that accepted its connection).
_FRONTENDS: Final = (
    ("http", "polymq_http.config:HttpSettings", "polymq_http.service:HttpService",
     ("http",), "http", False),
    ("stomp", "polymq_stomp.config:StompSettings", "polymq_stomp.service:StompService",
     ("stomp", "stomp_ws"), "stomp_ws", True),
    ("longpoll", "polymq_longpoll.config:LongpollSettings",
     "polymq_longpoll.service:LongpollService", ("longpoll",), "longpoll", False),
    ("avro", "polymq_avro.config:AvroSettings", "polymq_avro.service:AvroService",
     ("avro",), "avro", False),
    ("amqp", "polymq_amqp.config:AmqpSettings", "polymq_amqp.service:AmqpService",
     ("amqp", "amqp_admin", "amqp_tls"), None, True),
)  # fmt: skip


# seconds the core may take to stop (it answers what it read for up to 10 s, then flushes its
# stores); a frontend: process.STOP_TIMEOUT
_CORE_STOP_TIMEOUT: Final = 60.0


def _write_ports(path: str, ports: dict[str, int], pids: list[int]) -> None:
    """Atomically, so a reader never sees half a file. ``pids``: every process of this
    node (polymq, and in a cluster its nats-server), for tests that kill or freeze it."""
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps({**ports, "pids": pids}))
    os.replace(tmp, path)


def _for_worker(settings: Any, ports: dict[str, int], names: Sequence[str], workers: int) -> Any:
    """A frontend's settings in a worker of ``polymq run --workers``: the first process's
    ports (shared), the core over the loopback, and each connection limit divided among the
    processes (the kernel spreads connections evenly: a node takes about what one process
    would; a per-user limit below the number of processes becomes a per-process one)."""
    changes: dict[str, Any] = {f"{n}_port": ports[n] for n in names if n in ports}
    if settings.core_host in ("0.0.0.0", "::", ""):
        changes["core_host"] = "127.0.0.1"
    for limit in ("max_connections", "max_connections_per_user"):
        if getattr(settings, limit, 0):
            changes[limit] = math.ceil(getattr(settings, limit) / workers)
    return dataclasses.replace(settings, **changes)


async def _serve(args: argparse.Namespace) -> int:
    workers = worker_count(args.workers) if args.command == "run" else 1
    registry = WorkerRegistry() if workers > 1 else CollectorRegistry()
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
            settings = core_settings(args)
            if workers > 1 and settings.core_tls:
                raise ConfigError(
                    "--workers: the workers reach the core over its wire port on this "
                    "machine, which speaks TLS only here (--core-tls-cert); run one process "
                    "(--workers 1), or the frontends apart (polymq stomp/amqp --core-tls-ca)"
                )
            auth = load_provider(settings.auth)
            if args.command == "run":  # in-process frontends log in with a one-off token
                service_token = secrets.token_urlsafe(32)
                auth = WithServiceToken(auth, service_token)
            # polymq run: its frontends reach the core without a socket
            core = CoreService(settings, registry, auth, in_process=args.command == "run")
            services.append(core)
            ports.update(await _starting(core.start(), stop))
            core_addr = (settings.host, ports["core"])
            if settings.core_tls:
                secure.add("admin")
            if args.command == "run" and settings.auth in ("", "anonymous"):
                log.warning("%s (set --auth file:users.json to require logins)", auth.describe())
        shared: list[tuple[str, Any]] = []  # what the workers serve, and their settings
        for command, settings_ref, service_ref, port_names, secure_port, shares in _FRONTENDS:
            if args.command not in ("run", command):
                continue
            fe_settings = frontend_settings(
                args, core_addr, settings_ref, port_names, service_token
            )
            extra = {"listening": Listening(reuse_port=True)} if workers > 1 and shares else {}
            service = load_ref(service_ref)(fe_settings, registry, **extra)
            services.append(service)
            got = await _starting(service.start(), stop)
            ports.update(got)
            if secure_port is not None and fe_settings.tls_cert:
                secure.add(secure_port)
            if extra:
                shared.append((service_ref, _for_worker(fe_settings, got, port_names, workers)))
        pool: Workers | None = None
        if shared:
            assert isinstance(registry, WorkerRegistry)
            pool = Workers(workers, tuple(shared), registry, args.log_level)
            services.append(pool)
            await _starting(pool.start(), stop)
        tune_gc()
        if core is not None and core.cluster is not None:
            core.cluster.add_listeners({k: v for k, v in ports.items() if k not in core.ports})
        if args.ports_file:
            pids = core.pids if core is not None else [os.getpid()]
            if pool is not None:
                pids = [*pids, *pool.pids]
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
        await stop_services(
            services,
            lambda svc: _CORE_STOP_TIMEOUT if isinstance(svc, CoreService) else STOP_TIMEOUT,
        )
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


def run(args: argparse.Namespace) -> int:
    """Run the service command ``args`` until SIGTERM or Ctrl-C; the exit code (2 for a
    configuration error, 1 when a service cannot start)."""
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
