"""A private RabbitMQ node for tests: its own name, ports, data and cookie, on 127.0.0.1.

A RabbitMQ already running on the machine (the Debian service on :5672, node
``rabbit@localhost``) is left alone: this node has its own node name
(``polymq-test-<uid>-<n>@localhost``), its own free AMQP port (``RABBITMQ_NODE_PORT``) and
distribution port (``RABBITMQ_DIST_PORT``), and keeps everything under one temporary
directory: the Mnesia database (``RABBITMQ_MNESIA_BASE``), logs (``RABBITMQ_LOG_BASE``), its
own plugin list (``RABBITMQ_ENABLED_PLUGINS_FILE``: empty unless ``plugins`` are asked for;
``rabbitmq_stomp`` and ``rabbitmq_web_stomp`` listen on ports of their own, ``stomp_port`` and
``web_stomp_port``), its own ``rabbitmq.conf``
(``RABBITMQ_CONFIG_FILE``: the listener, guest allowed from loopback, no disk alarm on a small
tmp), an ``advanced.config`` where one is given (``RABBITMQ_ADVANCED_CONFIG_FILE``: Erlang
terms, e.g. the OAuth 2 backend's signing keys) and an empty ``rabbitmq-env.conf``
(``RABBITMQ_CONF_ENV_FILE``), so Debian's ``/etc/rabbitmq/rabbitmq-env.conf``
(``NODENAME=rabbit@localhost``) and ``rabbitmq.conf`` (``listeners.tcp.local =
127.0.0.1:5672``) do not apply.

What running it as root takes: the Debian wrapper in ``/usr/sbin`` would ``su rabbitmq``
(and lose our environment), so the server script of the release
(``/usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin/rabbitmq-server``) is run directly; Erlang
wants ``HOME`` for its ``.erlang.cookie``, so ``HOME`` is the temporary directory (the cookie
is created there on first start). The node registers with the machine's epmd on 4369 (the
one the system RabbitMQ started, or one it starts), as any Erlang node does.

Readiness is an AMQP handshake (``connection.start`` from the broker, read on a raw socket),
which RabbitMQ only sends once it has booted. ``stop()`` sends SIGTERM to the Erlang VM (a
clean shutdown: durable queues and persistent messages stay in the data directory) and
``start()`` again reuses the same node name, port and directory.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

__all__ = ["RabbitNode", "find_server", "free_port", "has_plugin", "rabbit_node"]

_counter = itertools.count(1)
_AMQP_HEADER = b"AMQP\x00\x00\x09\x01"


def has_plugin(name: str) -> bool:
    """Does the installed release ship plugin ``name`` (e.g. ``rabbitmq_stomp``)?"""
    return bool(glob.glob(f"/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins/{name}-*"))


def find_server() -> str | None:
    """The release's own ``rabbitmq-server`` script (not Debian's su wrapper), if installed."""
    found = sorted(glob.glob("/usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin/rabbitmq-server"))
    if found:
        return found[-1]
    return shutil.which("rabbitmq-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _amqp_ready(port: int) -> bool:
    """True once the broker answers the protocol header with connection.start."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(_AMQP_HEADER)
            s.settimeout(2)
            head = s.recv(7)
            return len(head) == 7 and head[0] == 1  # a method frame on channel 0
    except OSError:
        return False


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class RabbitNode:
    """One private RabbitMQ node; ``url`` to reach it. ``start()``/``stop()``/``restart()``."""

    def __init__(
        self,
        workdir: Path | None = None,
        port: int | None = None,
        plugins: tuple[str, ...] = (),
        advanced: str = "",
    ) -> None:
        server = find_server()
        if server is None:
            raise RuntimeError("rabbitmq-server is not installed (apt-get install rabbitmq-server)")
        self.server = server
        self.dir = workdir or Path(tempfile.mkdtemp(prefix="polymq-rabbit-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self._own_dir = workdir is None
        self.port = port or free_port()
        self.dist_port = free_port()
        self.node = f"polymq-test-{os.getuid()}-{os.getpid()}-{next(_counter)}@localhost"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.dir / "server.out"
        self.stomp_port = free_port() if "rabbitmq_stomp" in plugins else 0
        self.web_stomp_port = free_port() if "rabbitmq_web_stomp" in plugins else 0
        (self.dir / "enabled_plugins").write_text(f"[{','.join(plugins)}].\n")
        (self.dir / "rabbitmq-env.conf").write_text("")
        conf = (
            f"listeners.tcp.1 = 127.0.0.1:{self.port}\n"
            "loopback_users = none\n"
            "disk_free_limit.absolute = 1MB\n"
            "log.console = false\n"
            "log.file.level = warning\n"
        )
        if self.stomp_port:
            conf += f"stomp.listeners.tcp.1 = 127.0.0.1:{self.stomp_port}\n"
        if self.web_stomp_port:
            conf += f"web_stomp.tcp.ip = 127.0.0.1\nweb_stomp.tcp.port = {self.web_stomp_port}\n"
        (self.dir / "rabbitmq.conf").write_text(conf)
        self.advanced = advanced
        if advanced:
            (self.dir / "advanced.config").write_text(advanced)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def env(self) -> dict[str, str]:
        d = self.dir
        env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "HOME": str(d),
            "LANG": "C.UTF-8",
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_PID_FILE": str(d / "node.pid"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }
        if self.advanced:
            env["RABBITMQ_ADVANCED_CONFIG_FILE"] = str(d / "advanced.config")
        return env

    # ---- life cycle -------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 60.0) -> RabbitNode:
        if self.alive:
            return self
        if _amqp_ready(self.port):
            raise RuntimeError(f"port {self.port} is already taken by another AMQP server")
        out = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.server],
            env=self.env(),
            cwd=self.dir,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: ours to signal, nobody else's
        )
        out.close()
        deadline = time.monotonic() + timeout
        while not (_amqp_ready(self.port) and all(map(_listening, self._plugin_ports()))):
            if self.proc.poll() is not None:
                raise RuntimeError(f"rabbitmq-server exited early:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"rabbitmq-server did not come up:\n{self.log_tail()}")
            time.sleep(0.2)
        return self

    def _plugin_ports(self) -> list[int]:
        return [p for p in (self.stomp_port, self.web_stomp_port) if p]

    def _group(self) -> list[psutil.Process]:
        """The shell script and the Erlang VM (and its helpers) started by ``start()``."""
        if self.proc is None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def beam(self) -> psutil.Process | None:
        for p in self._group():
            with contextlib.suppress(psutil.Error):
                if p.name() == "beam.smp":
                    return p
        return None

    def stop(self, timeout: float = 30.0) -> None:
        """A clean shutdown (SIGTERM to the VM); the data directory stays."""
        if self.proc is None:
            return
        beam = self.beam()
        if beam is not None:
            with contextlib.suppress(psutil.Error):
                beam.send_signal(signal.SIGTERM)
                beam.wait(timeout)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self._reap()

    def kill(self) -> None:
        """SIGKILL to every process this node started (by process group, which is ours)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self._reap()

    def _reap(self) -> None:
        # erl_child_setup and friends leave with the VM; wait until the port is free again
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", self.port))
                    break
                except OSError:
                    time.sleep(0.1)
        self.proc = None

    def restart(self) -> RabbitNode:
        self.stop()
        return self.start()

    def cleanup(self) -> None:
        self.kill()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, n: int = 40) -> str:
        parts = []
        for path in [self.log_path, *sorted((self.dir / "log").glob("*.log"))]:
            with contextlib.suppress(OSError):
                lines = path.read_text(errors="replace").splitlines()[-n:]
                parts.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)


@contextlib.contextmanager
def rabbit_node(
    workdir: Path | None = None, plugins: tuple[str, ...] = (), advanced: str = ""
) -> Iterator[RabbitNode]:
    """A started private node, killed and removed afterwards whatever happens."""
    node = RabbitNode(workdir, plugins=plugins, advanced=advanced)
    try:
        node.start()
        yield node
    finally:
        node.cleanup()
