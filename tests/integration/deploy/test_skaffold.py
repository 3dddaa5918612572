"""skaffold.yaml: valid against skaffold's own JSON schema for v4beta13 (kept in ``schemas/``), and
consistent with the Dockerfile and the chart: the image it builds is the one the chart is told
to run, every port it forwards is a port of a Service the chart renders, and the single-node
profile renders a valid chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

from .chart import ROOT, component_of, container, render, sidecars

SKAFFOLD = ROOT / "skaffold.yaml"
SCHEMA = Path(__file__).with_name("schemas") / "skaffold-v4beta13.json"


def config() -> dict[str, Any]:
    data = yaml.safe_load(SKAFFOLD.read_text())
    assert isinstance(data, dict)
    return data


def validator() -> jsonschema.Draft7Validator:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def test_skaffold_yaml_is_valid_against_skaffolds_schema() -> None:
    v = validator()
    data = config()
    assert data["apiVersion"] == "skaffold/v4beta13" and data["kind"] == "Config"
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(data)]
    assert errors == []
    # the schema does refuse what skaffold would (so the check above is not vacuous)
    broken = json.loads(json.dumps(data))
    broken["deploy"]["helm"]["releases"][0]["valueFiles"] = ["typo.yaml"]
    assert list(v.iter_errors(broken))


def _set_values(release: dict[str, Any], image: dict[str, str]) -> dict[str, Any]:
    """The values skaffold passes to helm for ``release`` (--set for each entry)."""
    values: dict[str, Any] = {}
    sets = dict(release.get("setValues", {}))
    for key, template in release.get("setValueTemplates", {}).items():
        for name, value in image.items():
            template = template.replace("{{." + name + "}}", value)
        assert "{{" not in template, template
        sets[key] = template
    for key, value in sets.items():
        text = json.dumps(value) if not isinstance(value, str) else value
        parsed = helm.parse_set_string(f"{key}={text}")
        _merge(values, parsed)
    return values


def _merge(into: dict[str, Any], more: dict[str, Any]) -> None:
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


IMAGE = {
    "IMAGE_REPO_polymq": "localhost:5000/polymq",
    "IMAGE_TAG_polymq": "0f3c2ab",
    "IMAGE_DIGEST_polymq": "sha256:" + "ab" * 32,
}


def test_the_image_skaffold_builds_is_the_one_the_chart_runs() -> None:
    data = config()
    [artifact] = data["build"]["artifacts"]
    assert artifact["image"] == "polymq"
    assert (ROOT / artifact.get("context", ".") / artifact["docker"]["dockerfile"]).is_file()
    releases = [data["deploy"]["helm"]["releases"]]
    releases += [p["deploy"]["helm"]["releases"] for p in data["profiles"] if "deploy" in p]
    for [release] in releases:
        assert (ROOT / release["chartPath"] / "Chart.yaml").is_file()
        out = render(_set_values(release, IMAGE), release=release["name"])
        images = [container(w)["image"] for w in out.workloads()]
        images += [c["image"] for w in out.workloads() for c in sidecars(w).values()]
        images += [c["image"] for pod in out.of_kind("Pod") for c in pod["spec"]["containers"]]
        assert len(images) > len(out.workloads())  # NATS sidecars, the helm test Pod
        for image in images:
            assert image == "localhost:5000/polymq:0f3c2ab@sha256:" + "ab" * 32


def test_every_forwarded_port_is_a_listener_of_the_chart() -> None:
    data = config()
    [release] = data["deploy"]["helm"]["releases"]
    out = render(_set_values(release, IMAGE), release=release["name"])
    forwarded = set()
    for forward in data["portForward"]:
        assert forward["resourceType"] == "service"
        svc = out.get("Service", forward["resourceName"])
        assert forward["port"] in {p["port"] for p in svc["spec"]["ports"]}, forward
        forwarded.add((forward["resourceName"], forward["port"]))
    # every frontend listener, and the core's admin console
    for svc in out.of_kind("Service"):
        if component_of(svc) != "core":
            for port in svc["spec"]["ports"]:
                assert (svc["metadata"]["name"], port["port"]) in forwarded, port
    assert (f"{release['name']}-core", 7401) in forwarded
    assert len({f["localPort"] for f in data["portForward"]}) == len(data["portForward"])


def test_the_default_deploy_runs_the_three_node_core() -> None:
    [release] = config()["deploy"]["helm"]["releases"]
    out = render(_set_values(release, IMAGE), release=release["name"])
    core = out.workload("core")
    assert core["spec"]["replicas"] == 3 and "nats" in sidecars(core)
    assert "--peers" in container(core)["args"]


def test_the_single_node_profile_renders_a_small_valid_install() -> None:
    [profile] = [p for p in config()["profiles"] if p["name"] == "single-node"]
    [release] = profile["deploy"]["helm"]["releases"]
    out = render(_set_values(release, IMAGE), release=release["name"])
    for obj in out.objects:
        if obj["kind"] != "ServiceMonitor":
            kubernetes_validate.validate(obj, "1.30", strict=True)
    assert all(w["spec"]["replicas"] == 1 for w in out.workloads())
    assert not out.of_kind("PodDisruptionBudget")
    assert out.components() == render().components()  # every protocol, on one node
