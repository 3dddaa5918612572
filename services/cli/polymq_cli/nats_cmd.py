"""``polymq nats``: one core node's nats-server in the foreground, run apart from the core.

::

    polymq nats [--peers HOST:PORT,...] [--node-id ID] [--cluster-port N] [--client-port N]
                [--admin-port N] [--host H] [--data-dir DIR]

The replicated core (docs/cluster.md) normally starts its nats-server as a child. A pod may
run it as a container of its own instead (the chart's ``core.nats.sidecar``): this command
reads the settings the core reads (``POLYMQ_NODE_ID``/``POLYMQ_NODE_NAME``, ``POLYMQ_PEERS``,
``POLYMQ_CLUSTER_PORT``, ``POLYMQ_DATA_DIR``, ``POLYMQ_HOST``, ``POLYMQ_MAX_FRAME``,
``POLYMQ_CLUSTER_SECRET``, ``POLYMQ_NATS_MEMORY_LIMIT`` and
``POLYMQ_K8S_SERVICE``/``_NAMESPACE``/``POLYMQ_KUBECONFIG``, or the same flags), writes the
config the core would have written
(:func:`polymq_core.cluster.node.nats_config`: server name, JetStream store under the data dir
with ``sync_interval: always``, routes to the other peers (a node given only itself, a
seed, is routed to itself so that it listens for the others), route, client and system
account logins derived from the cluster secret) with a fixed client port, and runs
nats-server with the core's Go memory limit (GOMEMLIMIT). The core is then
started with ``--nats nats://127.0.0.1:<client port>`` and the same secret; it logs in with
the derived client password.

It stays nats-server's parent, as the core does for its own child:

- with ``POLYMQ_K8S_SERVICE`` its routes follow the Service's endpoints too
  (:mod:`polymq_core.cluster.natsroutes`: without ``--peers`` it waits for the endpoints to name
  another
  pod first): it writes the config again and has nats-server reload it (SIGHUP) when the
  routes change;
- a node cut off from most of its peers stops its nats-server until a majority answers
  again (:mod:`polymq_core.cluster.isolation`, the core's own watch), so that its Raft groups
  do not raise their terms alone and depose the majority's leaders at the heal. It probes
  what a core probes, the other nodes' admin ports: the port their endpoints name
  ``admin``, else ``--admin-port`` (``POLYMQ_ADMIN_PORT``, 7401; every node's the same,
  as a StatefulSet's), at the hosts of ``--peers`` and the endpoints' addresses. Not their
  NATS ports: nats-server logs every connection to its route port, at once closed, as a
  route (``Route connection created``, ``Router connection closed``), four times a second
  from every peer (docs/cluster.md, "Partitions"). It does so only once a majority has
  answered (at a cluster's first start, a pod's peers may have no address yet). The core
  beside it sees its NATS connection refused meanwhile, and fails its writes
  ``unavailable`` as a core whose own child is stopped does;
- it passes the core's Go memory limit on (the child's environment);
- SIGTERM and SIGINT are a clean stop (exit 0); when nats-server exits by itself (not
  stopped for a cut), so does this, with its code.

Exit 2 on a configuration error, 1 when nats-server cannot be run (or, waiting for its
first route, the Kubernetes API named none in time).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polymq_core.cluster.endpoints import EndpointsError
from polymq_core.cluster.natsd import NatsError, NatsServer, find_binary, hostport, write_config
from polymq_core.config import CoreSettings
from polymq_server.config import ConfigError, from_env

if TYPE_CHECKING:
    from polymq_core.cluster.natsroutes import Routes

__all__ = ["CLIENT_PORT", "add_arguments", "prepare", "run"]

log = logging.getLogger(__name__)

CLIENT_PORT = 4222  # NATS' usual client port; the core's --nats names it
_FIRST_ROUTE_FOR = 90.0  # seconds to wait for the endpoints to name another pod (the core's)
_STOP_FOR = 30.0  # seconds nats-server may take to stop on SIGTERM before it is killed
_PAUSED_LOOK = 0.5  # seconds between two looks at a server stopped for a cut


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``nats`` to ``polymq``'s sub-commands."""
    p = sub.add_parser(
        "nats",
        help="a core node's nats-server in the foreground (for a core given --nats)",
        description="Run the nats-server of one replicated core node apart from the core, "
        "configured from the core's settings.",
    )
    p.add_argument("--host", default=None, help="address to listen on (POLYMQ_HOST)")
    p.add_argument("--data-dir", default=None, help="the node's data dir (POLYMQ_DATA_DIR)")
    p.add_argument("--node-id", default=None, help="the core node's id (POLYMQ_NODE_ID)")
    p.add_argument(
        "--peers",
        default=None,
        metavar="HOST:PORT,...",
        help="the nodes' cluster addresses, as given to the core (POLYMQ_PEERS); with "
        "POLYMQ_K8S_SERVICE, its endpoints are routes too",
    )
    p.add_argument(
        "--cluster-port", type=int, default=None, help="the route port (7422; POLYMQ_CLUSTER_PORT)"
    )
    p.add_argument(
        "--client-port",
        type=int,
        default=CLIENT_PORT,
        help=f"the client port the core's --nats names ({CLIENT_PORT})",
    )
    p.add_argument(
        "--admin-port",
        type=int,
        default=None,
        help="the cores' admin port, every node's the same (7401; POLYMQ_ADMIN_PORT): the "
        "partition watch probes the other nodes' there (where the endpoints name a port "
        "'admin', that one; 0: only those)",
    )
    p.add_argument("--log-level", default=os.environ.get("POLYMQ_LOG_LEVEL", "INFO"))


def _settings(args: argparse.Namespace) -> CoreSettings:
    base = from_env(CoreSettings)
    changes: dict[str, Any] = {}
    if args.host is not None:
        changes["host"] = args.host
    if args.data_dir is not None:
        changes["data_dir"] = Path(args.data_dir)
    for flag in ("node_id", "peers", "cluster_port", "admin_port"):
        value = getattr(args, flag)
        if value is not None:
            changes[flag] = value
    settings: CoreSettings = dataclasses.replace(base, **changes)
    settings.check()
    if not settings.clustered:
        raise ConfigError(
            "polymq nats runs the nats-server of a replicated core node: give the nodes' "
            "cluster addresses with --peers (POLYMQ_PEERS), or their Kubernetes Service "
            "with POLYMQ_K8S_SERVICE, as to the core"
        )
    if not 1 <= args.client_port <= 65535:
        raise ConfigError(f"--client-port {args.client_port}: must be 1..65535")
    return settings


def prepare(args: argparse.Namespace) -> Path:
    """Write the nats-server config for these flags and environment (readable by its owner
    alone: it holds the derived passwords) and make the JetStream store; the config's path.
    ``ConfigError`` for bad settings."""
    return _prepared(args)[0]


def _prepared(args: argparse.Namespace) -> tuple[Path, dict[str, str]]:
    """:func:`prepare`, and the environment nats-server is to run in (its GOMEMLIMIT)."""
    settings = _settings(args)
    from polymq_core.cluster.node import nats_config  # (nats-py: the `cluster` extra)

    config = nats_config(settings, client_port=args.client_port)
    config.store_dir.mkdir(parents=True, exist_ok=True)
    work = _work_dir(settings)
    work.mkdir(parents=True, exist_ok=True)
    path = work / "nats.conf"
    write_config(path, config.render())
    return path, config.environment(os.environ)


def _work_dir(settings: CoreSettings) -> Path:
    return settings.data_dir / "nats-run"


async def _supervise(settings: CoreSettings, client_port: int) -> int:
    """Run nats-server as a child (its routes following the Kubernetes endpoints, if any;
    stopped while this node is cut off) until it exits by itself or SIGTERM/SIGINT stops
    it; its exit code."""
    from polymq_core.cluster.isolation import Isolation
    from polymq_core.cluster.natsroutes import Routes, watch_endpoints
    from polymq_core.cluster.node import nats_config

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    routes = Routes.of(settings)
    watcher = watch_endpoints(settings, routes.update, loop) if settings.k8s_service else None
    isolation: Isolation | None = None
    try:
        first = routes.current
        if watcher is not None:
            waiting = asyncio.ensure_future(routes.wait(watcher, _FIRST_ROUTE_FOR))
            if not await _until(waiting, stop):
                return 0  # told to stop while waiting
            first = waiting.result()
        config = nats_config(settings, routes=first, client_port=client_port)
        server = NatsServer(config, work_dir=_work_dir(settings), own_output=True)
        await server.start()
        routes.attach(server)
        isolation = Isolation(server, _admin_urls(routes, settings.admin_port), armed=False)
        isolation.start()
        while True:
            if server.paused:  # (cut off: stopped until a majority answers again)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), _PAUSED_LOOK)
                if stop.is_set():
                    break
                continue
            exited = asyncio.ensure_future(server.wait())
            if not await _until(exited, stop):
                break
            if server.paused:
                continue  # stopped by the partition watch, not by itself
            code = exited.result()
            print(f"polymq nats: nats-server exited with code {code}", file=sys.stderr)
            return code if code >= 0 else 128 - code  # (killed by a signal: as a shell says)
        await isolation.stop()
        isolation = None
        server.paused = False
        await server.stop(_STOP_FOR)
        return 0  # told to stop: a clean stop is a success
    finally:
        if isolation is not None:
            await isolation.stop()
        if watcher is not None:
            watcher.stop(timeout=0)


def _admin_urls(routes: Routes, admin_port: int) -> Callable[[], list[str]]:
    """What the partition watch probes: the other nodes' admin addresses
    (:meth:`~polymq_core.cluster.natsroutes.Routes.admin_addresses`), logged when they
    change."""
    shown: list[tuple[tuple[str, int], ...] | None] = [None]

    def urls() -> list[str]:
        found = routes.admin_addresses(admin_port)
        if found != shown[0]:
            shown[0] = found
            log.info(
                "partition watch: probing the other nodes' admin ports: %s",
                ", ".join(hostport(h, p) for h, p in found) or "(none known)",
            )
        return [f"tcp://{hostport(h, p)}" for h, p in found]

    return urls


async def _until(task: asyncio.Future[Any], stop: asyncio.Event) -> bool:
    """Wait for ``task`` or ``stop``, whichever first: whether ``task`` finished (if not,
    it is cancelled)."""
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait((task, stopping), return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if task.done():
        return True
    task.cancel()
    return False


def run(args: argparse.Namespace) -> int:
    """Write the config and run nats-server as a child until it exits or is stopped (its
    exit code, or 0 for a clean stop)."""
    try:
        settings = _settings(args)
        find_binary()
        return asyncio.run(_supervise(settings, args.client_port))
    except ConfigError as exc:
        print(f"polymq nats: configuration error: {exc}", file=sys.stderr)
        return 2
    except (NatsError, EndpointsError, OSError) as exc:
        print(f"polymq nats: {exc}", file=sys.stderr)
        return 1
