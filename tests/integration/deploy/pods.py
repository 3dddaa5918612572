"""Run a rendered pod's container on this machine, as close to the pod as a process gets.

The container's ``command`` and ``args`` run against the real CLI with this interpreter
(``sys.executable -m polymq_cli`` in place of the image's ``polymq`` entry point), changed only
where a pod and a test process must differ:

- every ``--<listener>-port N`` becomes 0 (a free port, no race), and the port the process
  reports for that listener in its ``--ports-file`` stands for container port N;
- ``--host`` becomes 127.0.0.1;
- ``--core HOST:PORT`` names a rendered Service: it becomes the local port of the container port
  that Service's port reaches (so the Service wiring is part of what is tested);
- paths under a volume mount move to a temporary directory standing for that volume; a Secret
  volume is filled with the test's data for its items;
- environment variables from ``secretKeyRef`` take the test's data, ``fieldRef`` the pod's name;
- flags in ``fixed`` take the value given there (a replicated core's ``--peers``,
  ``--cluster-port``, ``--nats`` and its sidecar's ``--client-port``: several pods' NATS on
  one machine need ports of their own, and their peers' addresses).

``--ports-file`` (a CLI flag) is added, so the test learns what the process really bound.
A pod's other containers (``container_name``: a native sidecar) run the same way, with the
same volumes (by pod name under ``workdir``); ``polymq nats`` writes no ports file.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from .chart import Rendered, container, pod_spec, sidecars

Secrets = dict[str, dict[str, str]]  # Secret name -> key -> value


class LocalPod:
    def __init__(
        self,
        rendered: Rendered,
        workload: dict[str, Any],
        workdir: Path,
        secrets: Secrets,
        resolve_service: Callable[[str, int], int],
        *,
        ordinal: int = 0,
        container_name: str | None = None,
        fixed: dict[str, str] | None = None,
    ) -> None:
        self.workload = workload
        self.name = f"{workload['metadata']['name']}-{ordinal}"
        if container_name is None:
            self.container = container(workload)
        else:
            self.container = sidecars(workload)[container_name]
        self.fixed = fixed or {}
        self.pod_dir = workdir / self.name  # the pod's volumes, shared by its containers
        self.workdir = self.pod_dir if container_name is None else self.pod_dir / container_name
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.listeners: dict[str, int] = {}  # ports-file key of a port flag -> container port
        self.ports: dict[int, int] = {}  # container port -> local port, once bound
        self.mounts = self._volumes(secrets)
        self.argv = self._argv(resolve_service)
        self.env = self._env(secrets)
        self.ports_file = self.workdir / "ports.json"
        self.log_path = self.workdir / "pod.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.bound: dict[str, int] = {}

    # ---- translation ---------------------------------------------------------------------
    def _volumes(self, secrets: Secrets) -> dict[str, Path]:
        """mountPath -> the directory standing for its volume."""
        spec = pod_spec(self.workload)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        claims = {
            t["metadata"]["name"] for t in self.workload["spec"].get("volumeClaimTemplates", [])
        }
        out: dict[str, Path] = {}
        for mount in self.container.get("volumeMounts", []):
            local = self.pod_dir / "volumes" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            volume = volumes.get(mount["name"])
            if volume is None:
                assert mount["name"] in claims, f"{self.name}: no volume {mount['name']}"
            elif "secret" in volume:
                secret = volume["secret"]
                data = secrets[secret["secretName"]]
                for item in secret.get("items") or [{"key": k, "path": k} for k in data]:
                    (local / item["path"]).write_text(data[item["key"]])
            else:
                assert "emptyDir" in volume, f"{self.name}: unexpected volume {volume}"
            out[mount["mountPath"]] = local
        return out

    def _local_path(self, value: str) -> str:
        """A path under a mount (alone or after a ``file:`` prefix) moved to its directory."""
        for mount_path, local in sorted(self.mounts.items(), key=lambda m: -len(m[0])):
            pattern = rf"(^|:){re.escape(mount_path)}(?=/|$)"
            found = re.search(pattern, value)
            if found:
                return value[: found.end(1)] + str(local) + value[found.end() :]
        return value

    def _argv(self, resolve_service: Callable[[str, int], int]) -> list[str]:
        command = self.container["command"]
        assert command == ["polymq"], f"{self.name}: command {command}"
        args = list(self.container["args"])
        out: list[str] = []
        i = 0
        while i < len(args):
            arg = args[i]
            if arg in self.fixed:
                out += [arg, self.fixed[arg]]
                i += 2
            elif arg == "--host":
                out += [arg, "127.0.0.1"]
                i += 2
            elif arg.startswith("--") and arg.endswith("-port"):
                # the CLI reports --stomp-ws-port's listener as "stomp_ws" (main._ports)
                self.listeners[arg[2:-5].replace("-", "_")] = int(args[i + 1])
                out += [arg, "0"]
                i += 2
            elif arg == "--core":
                host, _, port = args[i + 1].rpartition(":")
                out += [arg, f"127.0.0.1:{resolve_service(host, int(port))}"]
                i += 2
            else:
                out.append(self._local_path(arg))
                i += 1
        return [sys.executable, "-m", "polymq_cli", *out]

    def _env(self, secrets: Secrets) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("POLYMQ_")}
        for var in self.container.get("env", []):
            if "value" in var:
                env[var["name"]] = self._local_path(str(var["value"]))
                continue
            source = var["valueFrom"]
            if "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                env[var["name"]] = secrets[ref["name"]][ref["key"]]
            elif source.get("fieldRef", {}).get("fieldPath") == "metadata.name":
                env[var["name"]] = self.name
            else:
                raise AssertionError(f"{self.name}: cannot emulate {var}")
        return env

    # ---- running -------------------------------------------------------------------------
    def start(self) -> LocalPod:
        nats = self.container["args"][0] == "nats"  # no listeners to report: its port is fixed
        argv = self.argv if nats else [*self.argv, "--ports-file", str(self.ports_file)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        return self

    def wait_bound(self, timeout: float = 30.0) -> dict[str, int]:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while not self.ports_file.exists():
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} did not bind in {timeout}s:\n{self.log()}")
            time.sleep(0.02)
        self.bound = json.loads(self.ports_file.read_text())
        self.bound.pop("pids", None)  # the process ids, beside the listeners' ports
        for key, port in self.listeners.items():
            assert key in self.bound, f"{self.name}: no {key} listener in {self.bound}"
            self.ports[port] = self.bound[key]
        return self.bound

    def local(self, container_port: int) -> int:
        return self.ports[container_port]

    def get(
        self, scheme: str, container_port: int, path: str, verify: str | bool, timeout: float
    ) -> requests.Response:
        """GET until it answers 200 or ``timeout`` passes; the last answer either way."""
        url = f"{scheme.lower()}://127.0.0.1:{self.local(container_port)}{path}"
        deadline = time.monotonic() + timeout
        while True:
            try:
                answer = requests.get(url, timeout=5, verify=verify)
                if answer.status_code == 200 or time.monotonic() > deadline:
                    return answer
            except requests.ConnectionError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM, as the kubelet sends
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
