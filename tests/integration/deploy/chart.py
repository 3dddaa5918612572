"""The Helm chart as the tests see it: rendered with Helm's own Go SDK (helm-python-sdk, no
cluster, no ``helm`` binary), parsed into objects, and the pieces of them the tests ask about
(workloads, their containers, Services, probes)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "polymq"
CI_FILES = sorted((CHART / "ci").glob("*-values.yaml"))
RELEASE = "polymq-test"
NAMESPACE = "messaging"
WORKLOADS = ("StatefulSet", "Deployment")


@functools.cache
def chart() -> helm.Chart:
    return helm.Chart.load(CHART)


def ci_values(path: Path) -> dict[str, Any]:
    values = yaml.safe_load(path.read_text()) or {}
    assert isinstance(values, dict), f"{path.name} is not a mapping"
    return values


@dataclass
class Rendered:
    objects: list[dict[str, Any]]
    notes: str
    values: dict[str, Any] = field(default_factory=dict)
    release: str = RELEASE

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
        return found[0]

    def workloads(self) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] in WORKLOADS]

    def workload(self, component: str) -> dict[str, Any]:
        found = [w for w in self.workloads() if component_of(w) == component]
        assert len(found) == 1, f"{component}: {len(found)} workloads"
        return found[0]

    def components(self) -> set[str]:
        return {component_of(w) for w in self.workloads()}

    def services_selecting(self, workload: dict[str, Any]) -> list[dict[str, Any]]:
        labels = pod_labels(workload)
        return [
            s
            for s in self.of_kind("Service")
            if s["spec"].get("selector")
            and all(labels.get(k) == v for k, v in s["spec"]["selector"].items())
        ]


def render(values: dict[str, Any] | None = None, release: str = RELEASE) -> Rendered:
    """Render the chart as ``helm install`` would; raises HelmValuesError / HelmRenderError."""
    manifests = chart().render(values or {}, name=release, namespace=NAMESPACE, is_install=True)
    objects: list[dict[str, Any]] = []
    notes = ""
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return Rendered(objects, notes, values or {}, release)


def component_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["labels"]["app.kubernetes.io/component"])


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = pod_spec(workload)["containers"]
    assert len(containers) == 1, "one container per polymq pod"
    c: dict[str, Any] = containers[0]
    return c


def sidecars(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pod's native sidecars (init containers that keep running) by name."""
    return {
        c["name"]: c
        for c in pod_spec(workload).get("initContainers", [])
        if c.get("restartPolicy") == "Always"
    }


def container_port(c: dict[str, Any], name_or_number: str | int) -> int:
    """A probe's or Service's port (a name, or a number) as the container port number."""
    for p in c.get("ports", []):
        if name_or_number in (p["name"], p["containerPort"]):
            return int(p["containerPort"])
    raise AssertionError(f"container {c['name']} has no port {name_or_number!r}")


def probes(c: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        if kind in c:
            yield kind, c[kind]


def service_target(rendered: Rendered, service: str, port: int) -> tuple[dict[str, Any], int]:
    """The workload behind ``service:port`` and the container port it reaches."""
    svc = rendered.get("Service", service)
    [sp] = [p for p in svc["spec"]["ports"] if p["port"] == port]
    backends = [
        w
        for w in rendered.workloads()
        if all(pod_labels(w).get(k) == v for k, v in svc["spec"]["selector"].items())
    ]
    assert len(backends) == 1, f"Service {service} selects {len(backends)} workloads"
    target = sp["targetPort"]
    if isinstance(target, int):  # a number may be a sidecar's port (the NATS routes)
        for sidecar in sidecars(backends[0]).values():
            if any(p["containerPort"] == target for p in sidecar.get("ports", [])):
                return backends[0], target
    return backends[0], container_port(container(backends[0]), target)


def scrape_targets(rendered: Rendered) -> list[tuple[dict[str, Any], int, str, str]]:
    """What Prometheus would scrape: (workload, container port, path, scheme), from the
    ServiceMonitor when there is one, else from the pods' prometheus.io/* annotations."""
    out = []
    monitors = rendered.of_kind("ServiceMonitor")
    if monitors:
        [sm] = monitors
        spec = sm["spec"]
        assert NAMESPACE in spec["namespaceSelector"]["matchNames"]
        wanted = spec["selector"]["matchLabels"]
        services = [
            s
            for s in rendered.of_kind("Service")
            if all(s["metadata"]["labels"].get(k) == v for k, v in wanted.items())
        ]
        for endpoint in spec["endpoints"]:
            for svc in services:
                for sp in svc["spec"]["ports"]:
                    if sp["name"] == endpoint["port"]:
                        workload, port = service_target(
                            rendered, svc["metadata"]["name"], sp["port"]
                        )
                        out.append((workload, port, endpoint["path"], endpoint["scheme"]))
        return out
    for workload in rendered.workloads():
        annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
        if annotations.get("prometheus.io/scrape") == "true":
            port = container_port(container(workload), int(annotations["prometheus.io/port"]))
            out.append(
                (
                    workload,
                    port,
                    annotations["prometheus.io/path"],
                    annotations["prometheus.io/scheme"],
                )
            )
    return out
