"""The bridge's command line: ``python -m polymq_bridge.main`` (``polymq bridge``).

::

    polymq bridge [--config FILE] [--rabbitmq-url URL] [--core HOST:PORT] [--host H]
                  [--bridge-port N] [--ports-file FILE] [--log-level LEVEL]

Flags override the ``POLYMQ_*`` environment (:class:`~.config.BridgeSettings`).
``--ports-file`` receives ``{"bridge": N}`` (the metrics/health port) once it is bound.
SIGTERM and Ctrl-C stop gracefully (in-flight messages get ``POLYMQ_BRIDGE_STOP_GRACE``
seconds to be confirmed). Exit codes: 0 after a stop, 2 for a configuration error (a bad
links file names the file, the link and the key), 1 when it cannot start.

The ``polymq`` CLI mounts it as ``polymq bridge``: ``add_arguments(sub_parser, common=False)``
(the CLI's own ``--host``/``--ports-file``/``--log-level`` serve) and ``run(args)``, which
returns the exit code (logging configured by the caller).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from polymq_server.config import ConfigError, core_flag, from_env

from .config import BridgeConfig, BridgeSettings

__all__ = ["add_arguments", "main", "run", "settings_from"]

log = logging.getLogger("polymq.bridge")


def add_arguments(p: argparse.ArgumentParser, *, common: bool = True) -> None:
    """The bridge's flags. ``common=False`` leaves out ``--host``, ``--ports-file`` and
    ``--log-level``, for a CLI that adds those to every sub-command itself."""
    p.add_argument("--config", default=None, help="the links file (POLYMQ_BRIDGE_CONFIG)")
    p.add_argument(
        "--rabbitmq-url",
        default=None,
        help="amqp://user:password@host:5672/vhost (POLYMQ_BRIDGE_RABBITMQ_URL)",
    )
    p.add_argument(
        "--core",
        default=os.environ.get("POLYMQ_CORE") or None,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="the core's address, or several, tried in turn (POLYMQ_CORE; 127.0.0.1:7400)",
    )
    p.add_argument(
        "--bridge-port", type=int, default=None, help="/metrics, /healthz, /readyz (7460; 0=any)"
    )
    if common:
        p.add_argument("--host", default=None, help="where /metrics listens (127.0.0.1)")
        p.add_argument("--ports-file", default=None, help="write the bound port here as JSON")
        p.add_argument("--log-level", default=os.environ.get("POLYMQ_LOG_LEVEL", "INFO"))


def settings_from(args: argparse.Namespace) -> BridgeSettings:
    base = from_env(BridgeSettings)
    changes: dict[str, Any] = {}
    if args.config is not None:
        changes["bridge_config"] = args.config
    if args.rabbitmq_url is not None:
        changes["bridge_rabbitmq_url"] = args.rabbitmq_url
    if getattr(args, "host", None) is not None:
        changes["host"] = args.host
    if args.bridge_port is not None:
        changes["bridge_port"] = args.bridge_port
    if args.core:
        changes["core_host"], changes["core_port"] = core_flag(args.core)
    settings: BridgeSettings = dataclasses.replace(base, **changes)
    settings.check()
    return settings


def _write_ports(path: str, ports: dict[str, int]) -> None:
    """Atomically, so a reader never sees half a file."""
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(ports))
    os.replace(tmp, path)


async def serve(
    settings: BridgeSettings, config: BridgeConfig, ports_file: str | None = None
) -> int:
    from .service import BridgeService

    service = BridgeService(settings, config=config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        ports = await service.start()
        if ports_file:
            _write_ports(ports_file, ports)
        print(
            f"polymq bridge listening on http://{settings.host}:{ports['bridge']} "
            f"({len(service.links)} link(s))",
            flush=True,
        )
        print("polymq ready (Ctrl-C to stop)", flush=True)
        await stop.wait()
        log.info("shutting down")
    finally:
        await service.stop()
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the bridge for parsed ``args`` (logging already configured); the exit code."""
    try:
        settings = settings_from(args)
        config = settings.links()  # before the heavy imports: a bad file fails fast
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        return asyncio.run(serve(settings, config, getattr(args, "ports_file", None)))
    except ConfigError as exc:
        print(f"polymq bridge: configuration error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"polymq bridge: cannot start: {exc}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="polymq bridge",
        description="move messages between polymq and RabbitMQ, at least once",
    )
    add_arguments(p)
    args = p.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
