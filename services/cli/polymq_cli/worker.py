"""A worker process of ``polymq run --workers N`` (started by :mod:`polymq_cli.workers`,
never by hand): it reads its :class:`~polymq_cli.workers.Spec` from stdin, serves the STOMP
and AMQP frontends it names on the first process's ports (SO_REUSEPORT) without their HTTP
listeners, says ``ready``, sends its metrics every few seconds, and stops as ``polymq run``
does (lame duck, then each service) on SIGTERM or SIGINT, when stdin closes (the first
process is gone or done with it), or when the first process dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from typing import Any

from prometheus_client import CollectorRegistry

from polymq_server.resources import die_with_parent, raise_open_files
from polymq_server.sessions.frontend import Listening

from .process import Service, stop_services, tune_gc
from .serve_flags import load_ref
from .workers import METRICS_INTERVAL, families_to_json, read_spec, report

__all__ = ["main"]


async def _serve() -> int:
    loop = asyncio.get_running_loop()
    # the reports go on the pipe that was stdout; what is printed goes to stderr instead
    reports = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    out, _ = await loop.connect_write_pipe(asyncio.Protocol, reports)
    spec = await read_spec(stdin)
    if spec is None:
        print("polymq worker: started without a spec (polymq run starts workers)", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=spec.log_level.upper(),
        format=f"%(asctime)s %(levelname)s %(name)s [worker {spec.index}]: %(message)s",
        stream=sys.stderr,
    )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    registry = CollectorRegistry()
    services: list[Service] = []

    async def until_stdin_closes() -> None:
        await stdin.read()  # (nothing more comes: the pipe's end is the news)
        stop.set()

    async def send_metrics() -> None:
        while True:
            out.write(report("metrics", families_to_json(registry.collect())))
            await asyncio.sleep(METRICS_INTERVAL)

    watching = asyncio.create_task(until_stdin_closes())
    sending: asyncio.Task[None] | None = None
    try:
        shared = Listening(reuse_port=True, http=False)
        for ref, settings in spec.frontends:
            service: Any = load_ref(ref)(settings, registry, listening=shared)
            services.append(service)
            await service.start()
        tune_gc()
        out.write(report("ready", os.getpid()))
        sending = asyncio.create_task(send_metrics())
        await stop.wait()
    finally:
        for task in (watching, sending):
            if task is not None:
                task.cancel()
        await stop_services(services)
    return 0


def main() -> int:
    die_with_parent(os.getppid(), signal.SIGTERM)  # no worker outlives its node
    raise_open_files()
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    return asyncio.run(_serve())


if __name__ == "__main__":
    sys.exit(main())
