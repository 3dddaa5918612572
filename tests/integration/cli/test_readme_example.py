"""The README's examples run as written.

- The Python example (a complete script that ends), against a ``polymq run`` whose core
  port stands in for the README's 7400.
- The shell blocks a reader runs on one machine: "Try it" (curl against ``make run``'s HTTP
  listener), the operator's commands of "The admin API", and the three-node cluster of
  "A replicated core", each command by command in one bash, as typed. Nothing is substituted
  but what the README tells the reader to choose: where ``make run`` said it listens
  (``HTTP=``, ``POLYMQ_ADMIN_URL=``), the receipt the pull answered, and the cluster's port
  hundreds (``A= B= C=``), which the test picks where those ports are free. Meanwhile the
  README's default ports (7400, 7401, 7480) are held by the test, so a block that works only
  where the defaults are free fails here.

Not run: ``make run``/``make test`` (``test_make_run.py`` runs the first; the second is the
whole suite), fragments that are not programs (the failover client, ``polymq http --core``,
the Spark writer, the Avro curl, which reads the reader's ``events.avro``), and the
Kubernetes blocks (docker, helm: ``tests/integration/deploy``)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from ...procs import PolymqProcess

pytestmark = pytest.mark.timeout(240)

README = Path(__file__).resolve().parents[3] / "README.md"
DEFAULT_PORTS = (7400, 7401, 7480)  # the README's: make run's core, admin and HTTP


def python_example() -> str:
    text = README.read_text()
    after = text.split("From Python", 1)[1]
    match = re.search(r"```python\n(.*?)```", after, re.S)
    assert match, "the README has no Python example after 'From Python'"
    return match.group(1)


def test_the_readme_python_example_runs_as_written(tmp_path: Path) -> None:
    code = python_example()
    assert code.count("7400") == 1
    with PolymqProcess("run", tmp_path / "run") as run:
        script = tmp_path / "example.py"
        script.write_text(code.replace("7400", str(run.ports["core"])))
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=30
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["b'hello'"]


# ---- the shell blocks -----------------------------------------------------------------------
def shell_block(after: str) -> str:
    """The first ``sh`` block after the text ``after``."""
    text = README.read_text()
    assert after in text, f"the README no longer says {after!r}"
    match = re.search(r"```sh\n(.*?)```", text.split(after, 1)[1], re.S)
    assert match, f"the README has no shell block after {after!r}"
    return match.group(1)


def choose(block: str, **values: str) -> str:
    """``block`` with the values the reader chooses: each ``NAME=`` assignment it has
    (exactly one of each) set to ``values[NAME]``."""
    for name, value in values.items():
        pattern = rf"(?m)(^|\s){re.escape(name)}=\S+"
        assert len(re.findall(pattern, block)) == 1, f"{name}= is not chosen once in\n{block}"
        block = re.sub(pattern, rf"\g<1>{name}={value}", block)
    return block


def commands(block: str) -> list[str]:
    """The block's commands, as a reader would type them: lines joined until bash takes
    them as a whole (a backslash continuation, a loop)."""
    out: list[str] = []
    chunk: list[str] = []
    for line in block.splitlines():
        if not chunk and not line.strip():
            continue
        chunk.append(line)
        text = "\n".join(chunk)
        if line.endswith("\\"):
            continue
        if subprocess.run(["bash", "-n", "-c", text], capture_output=True).returncode == 0:
            out.append(text)
            chunk = []
    assert not chunk, f"an unfinished command in the README:\n{chunk}"
    return out


class Shell:
    """One bash that runs commands one at a time, as a reader types them (exports and
    background jobs carry over); each command's output goes to files of its own."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.count = 0
        env = dict(os.environ)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env.pop("POLYMQ_CLUSTER_SECRET", None)
        env.pop("POLYMQ_ADMIN_URL", None)
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=cwd,
            env=env,
            text=True,
        )

    def run(self, command: str, timeout: float = 60.0) -> tuple[int, str]:
        """Its exit status and output (stdout)."""
        self.count += 1
        n = self.count
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{{\n{command}\n}} > .{n}.out 2> .{n}.err; echo $? > .{n}.rc\n")
        self.proc.stdin.flush()
        rc = self.cwd / f".{n}.rc"
        deadline = time.monotonic() + timeout
        while not rc.exists() or not rc.read_text().endswith("\n"):
            assert time.monotonic() < deadline, f"{command!r} did not end in {timeout} s"
            time.sleep(0.1)
        return int(rc.read_text()), (self.cwd / f".{n}.out").read_text()

    def stderr(self, n: int) -> str:
        return (self.cwd / f".{n}.err").read_text(errors="replace")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def defaults_taken() -> Iterator[None]:
    """The README's default ports held (those nobody else holds already)."""
    held = []
    for port in DEFAULT_PORTS:
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
            held.append(s)
        except OSError:
            s.close()
    try:
        yield
    finally:
        for s in held:
            s.close()


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    """The first port of the kernel's range for ephemeral ports (32768 if unknown)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_hundreds(n: int) -> list[int]:
    """``n`` numbers H whose ports H00, H01, H22 and H80 are free now, all below the
    kernel's ephemeral range: there any connection made meanwhile (the suite's other
    process opens thousands) may take a port between this look and the node's bind, and a
    taken explicit port makes ``polymq run`` exit (seen: node a on 54200 never started)."""
    top = min(600, (_ephemeral_low() - 81) // 100 + 1)
    out: list[int] = []
    while len(out) < n:
        h = random.randrange(200, top)
        if h not in out and all(_free(int(f"{h}{s}")) for s in ("00", "01", "22", "80")):
            out.append(h)
    return out


def test_the_readme_single_node_blocks_run_as_written(tmp_path: Path, defaults_taken: None) -> None:
    try_it = commands(shell_block("Try it"))
    admin = commands(shell_block("See [docs/admin-api.md]"))
    with PolymqProcess("run", tmp_path / "run") as run:
        shell = Shell(tmp_path)
        try:
            ran = []
            http = f"localhost:{run.ports['http']}"
            for command in commands(choose("\n".join(try_it), HTTP=http)):
                if "<receipt>" in command:  # the reader puts there what the pull answered
                    receipt = json.loads(ran[-1][1])["messages"][0]["receipt"]
                    command = command.replace("<receipt>", receipt)
                ran.append(shell.run(command))
            assert [rc for rc, _ in ran] == [0] * len(ran), ran
            pulled = json.loads(ran[-2][1])["messages"]
            assert [m["body"] for m in pulled] == ["hi"]
            assert json.loads(ran[-1][1]) == {"settled": 1, "missing": []}, ran[-1]

            admin_url = run.url("admin")
            out = [
                shell.run(c) for c in commands(choose("\n".join(admin), POLYMQ_ADMIN_URL=admin_url))
            ]
            assert [rc for rc, _ in out] == [0] * len(out), [
                shell.stderr(n) for n in range(1, shell.count + 1)
            ]
            published, peeked, connections, destinations = (o for _, o in out[1:])
            assert published.startswith("published ")
            assert peeked.splitlines()[1].endswith('{"id": 1}')
            assert connections.splitlines()[0].split()[:3] == ["ID", "PROTOCOL", "PEER"]
            assert destinations.splitlines()[1].split()[:2] == ["queue/orders", "1"]
        finally:
            shell.close()


def test_the_readme_three_node_cluster_runs_as_written(
    tmp_path: Path, defaults_taken: None
) -> None:
    a, b, c = port_hundreds(3)
    block = choose(shell_block("Three nodes on one machine"), A=str(a), B=str(b), C=str(c))
    shell = Shell(tmp_path)
    try:
        ran = []
        for command in commands(block):
            ran.append((command, *shell.run(command, timeout=120)))
        failed = [(cmd, shell.stderr(n)[-3000:]) for n, (cmd, rc, _) in enumerate(ran, 1) if rc]
        # (a message, not the list: pytest cuts a long repr, and the nodes' words are the end)
        assert not failed, "\n\n".join(f"$ {cmd}\n{err}" for cmd, err in failed)
        first_list, published, _, second_list, pulled, reloaded = [out for *_, out in ran][-6:]
        assert _states(first_list) == {"a": "ready", "b": "ready", "c": "ready"}, first_list
        assert json.loads(published)["count"] == 1, published
        assert _states(second_list) == {"a": "ready", "b": "unreachable", "c": "ready"}
        assert [m["body"] for m in json.loads(pulled)["messages"]] == ["kept"], pulled
        assert re.fullmatch(r"configuration \d+ sent to every node\n", reloaded), reloaded
    finally:
        shell.close()
        for name in "abc":
            _stop_node(tmp_path / f"{name}.json")


def _states(table: str) -> dict[str, str]:
    """Node id -> state, from ``polymq cluster list``'s table (this node marked ``*``)."""
    rows = [line.replace(" *", "").split() for line in table.splitlines()[1:]]
    return {row[0]: row[1] for row in rows}


def _stop_node(ports_file: Path) -> None:
    """SIGTERM to a node's processes (those still there), SIGKILL after 20 s."""
    if not ports_file.exists():
        return
    procs = []
    for pid in json.loads(ports_file.read_text()).get("pids", []):
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            proc.send_signal(signal.SIGTERM)
            procs.append(proc)
    _, alive = psutil.wait_procs(procs, timeout=20)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
