"""The Helm chart, rendered offline with Helm's Go SDK for every ci/*-values.yaml: each object
valid against Kubernetes' schemas (strict: unknown fields are errors) for 1.30 and the newest
version kubernetes-validate bundles; `helm lint --strict` silent; bad values refused with a
hint; every container's arguments and POLYMQ_* variables accepted by the real CLI; the pieces
wired to each other (Services, Ingresses, autoscalers, budgets, RBAC, the NetworkPolicy)."""

from __future__ import annotations

import argparse
import base64
import copy
import dataclasses
import re
import shutil
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError, latest_version

from polymq_amqp.config import AmqpSettings
from polymq_avro.config import AvroSettings
from polymq_bridge.config import BridgeSettings, InboundLink, OutboundLink, load_links
from polymq_bridge.main import settings_from
from polymq_cli.admin_cmd import COMMANDS as ADMIN_COMMANDS
from polymq_cli.main import _parser
from polymq_core.config import CoreSettings
from polymq_http.config import HttpSettings
from polymq_longpoll.config import LongpollSettings
from polymq_stomp.config import StompSettings

from .chart import (
    CHART,
    CI_FILES,
    NAMESPACE,
    RELEASE,
    Rendered,
    chart,
    ci_values,
    component_of,
    container,
    container_port,
    pod_labels,
    pod_spec,
    probes,
    render,
    scrape_targets,
    service_target,
    sidecars,
)

KUBE_VERSIONS = ("1.30", latest_version())
FRONTENDS = ("http", "longpoll", "stomp", "avro", "amqp")
# The settings each service reads from POLYMQ_* variables (polymq_server.config.from_env)
SETTINGS: dict[str, type] = {
    "core": CoreSettings,
    "http": HttpSettings,
    "longpoll": LongpollSettings,
    "stomp": StompSettings,
    "avro": AvroSettings,
    "amqp": AmqpSettings,
    "bridge": BridgeSettings,
}
CLI_ENV = {"POLYMQ_LOG_LEVEL"}  # read by the CLI itself
# Services the CLI offers that the defaults leave out (the bridge: ci/bridge-values.yaml)
OPTIONAL_SERVICES = {"bridge"}
BRIDGE_CI = CHART / "ci" / "bridge-values.yaml"
# The replicated core of three nodes, in anonymous mode (which it must ask for)
THREE_ANONYMOUS: dict[str, Any] = {
    "core": {"replicaCount": 3},
    "auth": {"allowAnonymousCluster": True},
}


@pytest.fixture(scope="module", params=CI_FILES, ids=lambda p: p.name)
def rendered(request: pytest.FixtureRequest) -> Rendered:
    return render(ci_values(request.param))


def test_the_ci_files_cover_the_features() -> None:
    names = {p.name for p in CI_FILES}
    assert {
        "default-values.yaml",
        "five-core-values.yaml",
        "full-tls-ingress-values.yaml",
        "ha-values.yaml",
        "http-stomp-only-values.yaml",
        "nats-child-values.yaml",
        "single-node-values.yaml",
        "cluster-tls-values.yaml",
        "five-core-cluster-tls-values.yaml",
        "single-node-cluster-tls-values.yaml",
        "bridge-values.yaml",
        "grafana-values.yaml",
    } <= names


# ---- Kubernetes' schemas ---------------------------------------------------------------------
# ServiceMonitor is a CustomResourceDefinition of the Prometheus Operator: kubernetes-validate
# has no schema for it (only for built-in kinds), so it alone skips that validation and is
# checked against this structural subset of the CRD's schema instead (every field we render,
# unknown fields refused, durations in the CRD's own pattern).
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
SERVICE_MONITOR = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "namespace"],
            "properties": {
                "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
                "namespace": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "labels": STRING_MAP,
                "annotations": STRING_MAP,
            },
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "jobLabel": {"type": "string"},
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": STRING_MAP,
                        "matchExpressions": {"type": "array"},
                    },
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["port", "path", "scheme"],
                        "properties": {
                            "port": {"type": "string", "minLength": 1},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": DURATION},
                            "honorLabels": {"type": "boolean"},
                            "tlsConfig": {"type": "object"},
                            "relabelings": {"type": "array", "items": {"type": "object"}},
                            "metricRelabelings": {"type": "array", "items": {"type": "object"}},
                        },
                    },
                },
            },
        },
    },
}


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", duration))


def test_every_object_is_valid_kubernetes(rendered: Rendered) -> None:
    crds = []
    for obj in rendered.objects:
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except SchemaNotFoundError:
                assert (obj["apiVersion"], obj["kind"]) in CRD_KINDS, obj["kind"]
                crds.append(obj)
            except kubernetes_validate.ValidationError as exc:
                where = "/".join(str(p) for p in exc.absolute_path)
                pytest.fail(
                    f"{obj['kind']}/{obj['metadata']['name']} on {version}: {where}: {exc.message}"
                )
    for sm in crds:
        jsonschema.validate(sm, SERVICE_MONITOR)
        for endpoint in sm["spec"]["endpoints"]:
            assert _seconds(endpoint["scrapeTimeout"]) <= _seconds(endpoint["interval"])


def test_the_kubernetes_validation_is_not_vacuous() -> None:
    sts = copy.deepcopy(render().workload("core"))
    kubernetes_validate.validate(sts, "1.30", strict=True)
    container(sts)["probe"] = {"path": "/healthz"}  # a misspelt field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, "1.30", strict=True)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
                             "metadata": {"name": "x", "namespace": "y"},
                             "spec": {"selector": {}, "endpoints": [{"port": "a", "path": "/m",
                                      "scheme": "http", "intervall": "1s"}]}},
                            SERVICE_MONITOR)  # fmt: skip


@pytest.mark.parametrize("values_file", CI_FILES, ids=lambda p: p.name)
def test_helm_lint_strict_finds_nothing(values_file: Any) -> None:
    for version in ("v1.30.0", f"v{latest_version()}"):
        report = helm.lint(
            CHART, ci_values(values_file), strict=True, namespace=NAMESPACE, kube_version=version
        )
        assert report["errors"] == [] and report["messages"] == [], report


def test_names_fit_kubernetes_limits_with_the_longest_release_name() -> None:
    long = "r" * 53  # the longest release name Helm accepts
    helm.validate_release_name(long)
    out = render(ci_values(CHART / "ci" / "full-tls-ingress-values.yaml"), release=long)
    for obj in out.objects:
        assert len(obj["metadata"]["name"]) <= 63, obj["metadata"]["name"]
        for value in obj["metadata"]["labels"].values():
            assert len(value) <= 63 and re.fullmatch(
                r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", value
            )
        if (obj["apiVersion"], obj["kind"]) not in CRD_KINDS:
            kubernetes_validate.validate(obj, "1.30", strict=True)
    for sts in out.of_kind("StatefulSet"):  # pods <name>-N and controller-revision-hash labels
        assert len(sts["metadata"]["name"]) <= 52


# ---- values: refused, documented, strict -----------------------------------------------------
_LINK = {"name": "out", "direction": "polymq-to-rabbitmq", "source": "queue/orders"}


def _bridge(**changes: Any) -> dict[str, Any]:
    """Values with the bridge on: one link, a RabbitMQ URL, then ``changes``."""
    bridge = {"enabled": True, "links": [_LINK], "rabbitmq": {"url": "amqp://r/"}}
    return {"bridge": {**bridge, **changes}}


REFUSED = [
    pytest.param(
        {"core": {"replicaCount": "three"}},
        ["core/replicaCount", "want integer"],
        id="wrong-type",
    ),
    pytest.param(
        {"core": {"replicas": 3}},
        ["'replicas' not allowed"],
        id="unknown-key",
    ),
    pytest.param(
        {"stomp": {"tsl": {"enabled": True}}},
        ["'tsl' not allowed"],
        id="misspelt-block",
    ),
    pytest.param(
        {"core": {"replicaCount": 2}},
        ["core.replicaCount", "no majority", "core.replicaCount=3"],
        id="core-2",
    ),
    pytest.param(
        {"stomp": {"tls": {"enabled": True}}},
        ["stomp.tls.existingSecret", "kubectl create secret tls"],
        id="tls-no-secret",
    ),
    pytest.param(
        {"tls": {"cluster": {"enabled": True}}},
        ["tls.cluster.existingSecret", "ca.crt", "tls.cluster.existingSecret=polymq-cluster-tls"],
        id="cluster-tls-no-secret",
    ),
    pytest.param(
        {"tls": {"cluster": {"enabled": True, "existingSecret": "s", "caFile": "x"}}},
        ["'caFile' not allowed"],
        id="cluster-tls-unknown-key",
    ),
    pytest.param(
        {"avro": {"tls": {"enabled": True}}},
        ["avro.tls.existingSecret", "kubectl create secret tls polymq-avro-tls"],
        id="avro-tls-no-secret",
    ),
    pytest.param(
        {"tls": {"enabled": True}, "amqp": {"tls": {"enabled": False, "existingSecret": "a"}}},
        ["tls.existingSecret", "the certificate from: avro, http, longpoll, stomp.", "polymq-tls"],
        id="global-tls-no-secret",
    ),
    pytest.param(
        {
            "tls": {"enabled": True, "existingSecret": "polymq-tls"},
            "metrics": {"serviceMonitor": {"enabled": True}},
        },
        [
            "metrics.serviceMonitor.tlsConfig",
            "over https (on their TLS listener): avro, http, longpoll, stomp.",
            "insecureSkipVerify",
        ],
        id="servicemonitor-https-no-tlsconfig",
    ),
    pytest.param(
        {"core": {"enabled": False}},
        ["http, longpoll, stomp", "core.enabled=true", "externalCore.host"],
        id="frontends-no-core",
    ),
    pytest.param(
        {"core": {"enabled": False}, **{f: {"enabled": False} for f in FRONTENDS}},
        ["Nothing to deploy"],
        id="nothing",
    ),
    pytest.param(
        {"externalCore": {"host": "elsewhere"}},
        ["externalCore.host", "core.enabled=false"],
        id="two-cores",
    ),
    pytest.param(
        {"auth": {"enabled": True}},
        ["auth.existingSecret", "hash-password"],
        id="auth-no-secret",
    ),
    pytest.param(
        {"auth": {"enabled": True, "existingSecret": "u"}},
        ["auth.frontendLogin.existingSecret", "--from-literal=user="],
        id="auth-no-frontend-login",
    ),
    pytest.param(
        {"http": {"ingress": {"enabled": True}}},
        ["http.ingress.hosts", "--set http.ingress.hosts[0].host="],
        id="ingress-no-host",
    ),
    pytest.param(
        {
            "avro": {
                "ingress": {
                    "enabled": True,
                    "hosts": [
                        {"host": "a.example", "paths": [{"path": "/", "pathType": "Prefix"}]}
                    ],
                    "tls": [{"hosts": ["a.example"]}],
                }
            }
        },
        ["avro.ingress.tls[0].secretName", "a.example"],
        id="ingress-tls-no-secret",
    ),
    pytest.param(
        {"http": {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}},
        ["http.autoscaling.minReplicas", "maxReplicas=2"],
        id="hpa-min-above-max",
    ),
    pytest.param(
        {"stomp": {"autoscaling": {"enabled": True, "targetCPUUtilizationPercentage": 0}}},
        ["nothing to scale on"],
        id="hpa-no-target",
    ),
    pytest.param(
        {"core": {"pdb": {"minAvailable": 3, "maxUnavailable": ""}}},
        ["core.pdb.minAvailable", "node drains"],
        id="pdb-blocks-drains",
    ),
    pytest.param(
        {"core": {"terminationGracePeriodSeconds": 30}},
        ["core.terminationGracePeriodSeconds", "hand its shards", "=65"],
        id="grace-too-short",
    ),
    pytest.param(
        {"core": {"podAntiAffinityPreset": "sometimes"}},
        ["podAntiAffinityPreset"],
        id="anti-affinity-preset",
    ),
    pytest.param(
        {"tests": {"timeoutSeconds": 0}},
        ["tests/timeoutSeconds", "minimum"],
        id="test-timeout",
    ),
    pytest.param(
        {"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}},
        ["metrics.enabled=true"],
        id="servicemonitor-without-metrics",
    ),
    pytest.param(
        {"core": {"replicaCount": 5}},
        ["polymq: auth.enabled", "--set auth.allowAnonymousCluster=true"],
        id="anonymous-cluster",
    ),
    pytest.param(
        {"core": {"replicaCount": 0}},
        ["core/replicaCount", "minimum"],
        id="core-0",
    ),
    pytest.param(
        {"http": {"containerPorts": {"http": 70000}}},
        ["containerPorts/http", "maximum"],
        id="port-range",
    ),
    pytest.param(
        {"logLevel": "LOUD"},
        ["logLevel"],
        id="log-level",
    ),
    pytest.param(
        _bridge(links=[]),
        ["bridge.links", "direction: polymq-to-rabbitmq", "bridge.existingConfigMap="],
        id="bridge-no-links",
    ),
    pytest.param(
        _bridge(existingConfigMap="links"),
        ["bridge.existingConfigMap", "one links file"],
        id="bridge-two-links-files",
    ),
    pytest.param(
        _bridge(links=[_LINK, _LINK]),
        ["Two links are named out", "Rename one"],
        id="bridge-same-link-name",
    ),
    pytest.param(
        _bridge(rabbitmq={}),
        ["bridge.rabbitmq.url", "kubectl create secret generic polymq-bridge-rabbitmq"],
        id="bridge-no-rabbitmq",
    ),
    pytest.param(
        _bridge(rabbitmq={"url": "http://r:15672/"}),
        ["bridge.rabbitmq.url", "amqp://user:password@host:5672/vhost"],
        id="bridge-not-amqp",
    ),
    pytest.param(
        _bridge(rabbitmq={"url": "amqp://u:p@/"}),
        ["bridge.rabbitmq.url", "names no host"],
        id="bridge-no-host",
    ),
    pytest.param(
        {"core": {"replicaCount": 3, "nats": {"resources": {"limits": {"memory": "1.5Gi"}}}}},
        ["core.nats.memoryLimit", "1536Mi, not 1.5Gi"],
        id="nats-memory-unreadable",
    ),
    pytest.param(
        {"core": {"replicaCount": 3, "nats": {"resources": {"limits": {"memory": "64Mi"}}}}},
        ["core.nats.memoryLimit", "under 64 Mi"],
        id="nats-memory-too-small",
    ),
    pytest.param(
        _bridge(rabbitmq={"url": "amqp://r/", "existingSecret": "rabbit"}),
        ["bridge.rabbitmq.url", "would ignore this one"],
        id="bridge-two-urls",
    ),
    pytest.param(
        _bridge(links=[{**_LINK, "queue": "jobs"}]),
        ["bridge/links/0", "'queue' not allowed"],
        id="bridge-link-mixes-directions",
    ),
    pytest.param(
        _bridge(links=[{"name": "in", "direction": "rabbitmq-to-polymq", "queue": "jobs"}]),
        ["bridge/links/0", "destination"],
        id="bridge-link-incomplete",
    ),
    pytest.param(
        {"core": {"enabled": False}, **{f: {"enabled": False} for f in FRONTENDS}, **_bridge()},
        ["enabled without a core: bridge.", "externalCore.host"],
        id="bridge-no-core",
    ),
    pytest.param(
        {"auth": {"enabled": True, "existingSecret": "u"}, **_bridge()},
        ["auth.frontendLogin.existingSecret", "(and the bridge)"],
        id="bridge-auth-no-login",
    ),
]


@pytest.mark.parametrize(("values", "hints"), REFUSED)
def test_bad_values_are_refused_with_a_hint(values: dict[str, Any], hints: list[str]) -> None:
    with pytest.raises((helm.HelmValuesError, helm.HelmRenderError)) as caught:
        render(values)
    for hint in hints:
        assert hint in str(caught.value), str(caught.value)


def _schema_at(schema: dict[str, Any], path: list[str]) -> dict[str, Any] | None:
    root = schema
    node: dict[str, Any] | None = schema
    for key in path:
        while node is not None and "$ref" in node:
            node = root["$defs"][node["$ref"].rsplit("/", 1)[1]]
        node = (node or {}).get("properties", {}).get(key)
    while node is not None and "$ref" in node:
        node = root["$defs"][node["$ref"].rsplit("/", 1)[1]]
    return node


def test_every_value_has_a_param_comment() -> None:
    text = (CHART / "values.yaml").read_text()
    params = set(re.findall(r"^\s*## @param (\S+)", text, re.M))
    schema = chart().schema
    assert schema is not None
    missing, stale = [], sorted(params)

    def walk(node: Any, path: list[str]) -> None:
        dotted = ".".join(path)
        if path and dotted in stale:
            stale.remove(dotted)
        if isinstance(node, dict) and node and (not path or dotted not in params):
            for key, value in node.items():
                walk(value, [*path, key])
            return
        if dotted in params:
            return
        # a pass-through Kubernetes object is documented at its root
        for i in range(len(path) - 1, 0, -1):
            ancestor = _schema_at(schema, path[:i])
            if (
                ".".join(path[:i]) in params
                and ancestor is not None
                and "properties" not in ancestor
            ):
                return
        missing.append(dotted)

    walk(yaml.safe_load(text), [])
    assert missing == [], f"values without a ## @param line: {missing}"
    assert stale == [], f"## @param lines naming no value: {stale}"


def test_the_values_schema_is_strict() -> None:
    schema = chart().schema
    assert schema is not None
    loose = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if "properties" in node and node.get("additionalProperties") is not False:
                loose.append(where)
            for key, value in node.items():
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}/{i}")

    walk(schema, "#")
    assert loose == []
    # and the defaults satisfy it
    chart().validate_schema(chart().values)


# ---- the containers ask only what the CLI accepts ---------------------------------------------
def _cli_commands() -> set[str]:
    [sub] = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


def test_the_chart_deploys_every_service_the_cli_offers() -> None:
    out = render(THREE_ANONYMOUS)
    deployed = out.components()
    # run: everything in one process; cluster and the operator's commands (destinations,
    # connections, peek, ...): clients of a node's admin API; nats: the core pods' sidecar,
    # and check: the helm test Pod (both checked below)
    offered = _cli_commands() - {"run", "cluster", "nats", "check", *ADMIN_COMMANDS}
    assert _parser().parse_args(sidecars(out.workload("core"))["nats"]["args"]).command == "nats"
    [test_pod] = out.of_kind("Pod")
    assert _parser().parse_args(test_pod["spec"]["containers"][0]["args"]).command == "check"
    missing = offered - deployed - OPTIONAL_SERVICES
    assert not missing, (
        f"the CLI offers `polymq {' / '.join(sorted(missing))}` but the chart deploys no such "
        "component: add a values block (values.yaml, values.schema.json) and an entry in "
        "polymq.frontendTable (templates/_helpers.tpl)"
    )
    assert deployed <= offered, deployed - offered


def test_every_container_runs_a_cli_command_with_accepted_flags_and_settings(
    rendered: Rendered,
) -> None:
    parser = _parser()
    runs = [(component_of(w), container(w), component_of(w)) for w in rendered.workloads()]
    runs += [  # the core's NATS sidecar reads the core's settings
        (f"{component_of(w)}/{n}", c, "core")
        for w in rendered.workloads()
        for n, c in sidecars(w).items()
    ]
    for name, c, settings in runs:
        assert c["command"] == ["polymq"]
        try:
            args = parser.parse_args(c["args"])
        except SystemExit:
            pytest.fail(f"{name}: `polymq {' '.join(c['args'])}` is refused by the CLI")
        assert args.command == name.rpartition("/")[2]
        fields = {f.name for f in dataclasses.fields(SETTINGS[settings])}
        for var in c.get("env", []):
            if var["name"].startswith("POLYMQ_") and var["name"] not in CLI_ENV:
                assert var["name"].removeprefix("POLYMQ_").lower() in fields, (name, var["name"])


# ---- security ---------------------------------------------------------------------------------
def _locked_down(sc: dict[str, Any]) -> None:
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_pods_are_locked_down(rendered: Rendered) -> None:
    for pod in rendered.of_kind("Pod"):  # the helm test's
        spec = pod["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["automountServiceAccountToken"] is False
        assert spec["enableServiceLinks"] is False
        for c in spec["containers"]:
            _locked_down(c["securityContext"])
    for workload in rendered.workloads():
        for sidecar in sidecars(workload).values():
            _locked_down(sidecar["securityContext"])
        name = component_of(workload)
        spec, c = pod_spec(workload), container(workload)
        pod_sc, sc = spec["securityContext"], c["securityContext"]
        assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] != 0
        assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        # a writable /tmp on an emptyDir, as the root filesystem is read-only
        [tmp] = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
        [volume] = [v for v in spec["volumes"] if v["name"] == tmp["name"]]
        assert "emptyDir" in volume
        # A release named "polymq" has a Service polymq-core, and service links would set
        # POLYMQ_CORE_PORT=tcp://...: a malformed setting for every polymq service.
        assert spec["enableServiceLinks"] is False
        # only the core talks to the API server (peer discovery)
        assert spec["automountServiceAccountToken"] is (name == "core"), name
        # every secret is mounted read-only, never world-readable
        for volume in spec["volumes"]:
            if "secret" in volume:
                assert volume["secret"]["defaultMode"] & 0o007 == 0, volume
                [mount] = [m for m in c["volumeMounts"] if m["name"] == volume["name"]]
                assert mount["readOnly"] is True


def _tls_volume(workload: dict[str, Any]) -> dict[str, Any] | None:
    """The Secret volume behind ``--tls-cert``/``--tls-key`` (checked: both files in it,
    mounted read-only), or None without TLS."""
    c, spec = container(workload), pod_spec(workload)
    if "--tls-cert" not in c["args"]:
        assert "--tls-key" not in c["args"]
        return None
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    found = []
    for flag, path_in_volume in (("--tls-cert", "tls.crt"), ("--tls-key", "tls.key")):
        path = c["args"][c["args"].index(flag) + 1]
        directory, _, filename = path.rpartition("/")
        mount = mounts[directory]
        assert mount["readOnly"] is True and filename == path_in_volume
        found.append(volumes[mount["name"]]["secret"])
    assert found[0] is found[1]
    secret: dict[str, Any] = found[0]
    return secret


def _items(secret: dict[str, Any]) -> dict[str, str]:
    """Secret key -> file name in the volume."""
    return {i["key"]: i["path"] for i in secret["items"]}


def test_logins_and_tls_come_from_the_existing_secrets() -> None:
    out = render(ci_values(CHART / "ci" / "full-tls-ingress-values.yaml"))
    for workload in out.workloads():
        name, c, spec = component_of(workload), container(workload), pod_spec(workload)
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        auth = c["args"][c["args"].index("--auth") + 1]
        assert auth.startswith("file:/")
        users = auth.removeprefix("file:")
        volume = volumes[mounts[users.rsplit("/", 1)[0]]]
        assert volume["secret"]["secretName"] == "polymq-users"
        assert {"key": "users.json", "path": users.rsplit("/", 1)[1]} in volume["secret"]["items"]
        env = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in c.get("env", [])}
        if name != "core":
            assert env["POLYMQ_CORE_USER"] == {"name": "polymq-frontend-login", "key": "user"}
            assert env["POLYMQ_CORE_PASSWORD"] == {
                "name": "polymq-frontend-login",
                "key": "password",
            }
        tls = _tls_volume(workload)
        if name == "core":  # the wire and admin ports stay plain
            assert tls is None
            continue
        # STOMP and AMQP from their own Secrets, the HTTP frontends from the global one
        assert tls is not None
        own = name in ("stomp", "amqp")
        assert tls["secretName"] == (f"polymq-{name}-tls" if own else "polymq-tls")
        assert _items(tls) == {"tls.crt": "tls.crt", "tls.key": "tls.key"}
        # the probed listener speaks TLS everywhere but on AMQP's admin port
        scheme = "HTTP" if name == "amqp" else "HTTPS"
        assert {p["httpGet"]["scheme"] for _, p in probes(c)} == {scheme}, name
    token = render({"auth": {"enabled": True, "existingSecret": "u", "frontendLogin": {
        "type": "token", "existingSecret": "t", "tokenKey": "tok"}}})  # fmt: skip
    env = container(token.workload("http"))["env"]
    assert env == [{"name": "POLYMQ_CORE_TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": "t", "key": "tok"}}}]  # fmt: skip


def test_global_tls_covers_every_frontend_and_a_frontend_may_bring_its_own_secret() -> None:
    out = render({
        "tls": {"enabled": True, "existingSecret": "all", "certKey": "c.pem", "keyKey": "k.pem"},
        "stomp": {"tls": {"enabled": False, "existingSecret": "own", "keyKey": "key"}},
    })  # fmt: skip
    assert _tls_volume(out.workload("core")) is None
    for name in FRONTENDS:
        tls = _tls_volume(out.workload(name))
        assert tls is not None, name
        if name == "stomp":  # its own Secret and keys, though its own switch is off
            assert tls["secretName"] == "own"
            assert _items(tls) == {"tls.crt": "tls.crt", "key": "tls.key"}
        else:
            assert tls["secretName"] == "all"
            assert _items(tls) == {"c.pem": "tls.crt", "k.pem": "tls.key"}
    amqp = container(out.workload("amqp"))
    assert "amqps" in {p["name"] for p in amqp["ports"]}  # AMQP over TLS besides plain AMQP


def test_one_frontend_alone_may_have_tls_from_the_global_secret() -> None:
    out = render({"tls": {"existingSecret": "all"}, "http": {"tls": {"enabled": True}}})
    for name in FRONTENDS:
        tls = _tls_volume(out.workload(name))
        assert (tls is not None) is (name == "http"), name
    http_tls = _tls_volume(out.workload("http"))
    assert http_tls is not None and http_tls["secretName"] == "all"


def test_an_http_listener_with_tls_is_the_https_port_everywhere() -> None:
    """Once it speaks TLS the HTTP frontends' port is named https in the pod, the Service,
    the probes and the Ingress, and the ServiceMonitor scrapes https ports with TLS and http
    ones without, whichever frontends have TLS."""
    ingress = {"enabled": True, "hosts": [{"host": "h.example", "paths": [{"path": "/",
                                           "pathType": "Prefix"}]}]}  # fmt: skip
    values = {
        "http": {"tls": {"enabled": True, "existingSecret": "s"}, "ingress": ingress},
        "longpoll": {"ingress": ingress},
        "metrics": {"serviceMonitor": {"enabled": True, "tlsConfig": {"insecureSkipVerify": True}}},
    }
    out = render(values)
    http, longpoll = out.workload("http"), out.workload("longpoll")
    assert [p["name"] for p in container(http)["ports"]] == ["https"]
    assert [p["name"] for p in container(longpoll)["ports"]] == ["http"]
    for workload, port, scheme in ((http, "https", "HTTPS"), (longpoll, "http", "HTTP")):
        for _, probe in probes(container(workload)):
            assert probe["httpGet"]["port"] == port and probe["httpGet"]["scheme"] == scheme
        [svc] = out.services_selecting(workload)
        assert [p["name"] for p in svc["spec"]["ports"]] == [port]
        assert [p["targetPort"] for p in svc["spec"]["ports"]] == [port]
        [ing] = [i for i in out.of_kind("Ingress") if component_of(i) == component_of(workload)]
        backend = ing["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
        assert backend["port"] == {"name": port}
    [sm] = out.of_kind("ServiceMonitor")
    schemes = {e["port"]: e["scheme"] for e in sm["spec"]["endpoints"]}
    assert schemes == {"admin": "http", "http": "http", "https": "https", "ws": "http"}
    [https] = [e for e in sm["spec"]["endpoints"] if e["scheme"] == "https"]
    assert https["tlsConfig"] == {"insecureSkipVerify": True}
    assert all("tlsConfig" not in e for e in sm["spec"]["endpoints"] if e["scheme"] == "http")
    for workload, _, _, scheme in scrape_targets(out):
        readiness = container(workload)["readinessProbe"]["httpGet"]
        assert scheme == readiness["scheme"].lower(), component_of(workload)
    # without the ServiceMonitor, the pod annotations say https
    annotated = render({**values, "metrics": {"serviceMonitor": {"enabled": False}}})
    meta = annotated.workload("http")["spec"]["template"]["metadata"]["annotations"]
    assert meta["prometheus.io/scheme"] == "https"


# ---- the core: StatefulSet, headless Service, storage, RBAC, NetworkPolicy ----------------------
def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        if expr["operator"] != "In":
            raise AssertionError(f"unexpected operator {expr}")
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def test_the_core_is_a_statefulset_with_a_headless_service_and_a_volume_per_pod() -> None:
    out = render(ci_values(CHART / "ci" / "ha-values.yaml"))
    sts = out.workload("core")
    assert sts["kind"] == "StatefulSet" and sts["spec"]["replicas"] == 3
    headless = out.get("Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True  # peers find starting nodes
    assert _selects({"matchLabels": headless["spec"]["selector"]}, pod_labels(sts))
    c = container(sts)
    # the core's ports by name, NATS' route port (on its sidecar) by number
    nats = sidecars(sts)["nats"]
    routes = {p["containerPort"] for p in nats["ports"] if p["name"] == "cluster"}
    targets = {p["targetPort"] for p in headless["spec"]["ports"]}
    assert targets == {p["name"] for p in c["ports"]} | routes
    [claim] = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    data_dir = c["args"][c["args"].index("--data-dir") + 1]
    assert {"name": claim["metadata"]["name"], "mountPath": data_dir} in c["volumeMounts"]
    [pdb] = [p for p in out.of_kind("PodDisruptionBudget") if component_of(p) == "core"]
    assert pdb["spec"]["maxUnavailable"] == 1  # 2 of 3 stay: a majority
    assert "a replicated core" in out.notes and "polymq cluster list" in out.notes
    single = render({"core": {"replicaCount": 1}})
    assert "replicated" not in single.notes
    ephemeral = render({"core": {"persistence": {"enabled": False}}}).workload("core")
    assert "volumeClaimTemplates" not in ephemeral["spec"]
    assert {"name": "data", "emptyDir": {}} in pod_spec(ephemeral)["volumes"]


def test_three_core_pods_form_one_replicated_cluster() -> None:
    """Every pod names all three by their stable DNS names (the same list everywhere; each
    skips itself), logs in with one generated cluster secret, watches the headless Service,
    and the cluster port is open between core pods only."""
    out = render(ci_values(CHART / "ci" / "ha-values.yaml"))
    sts = out.workload("core")
    c = container(sts)
    args = _parser().parse_args(c["args"])
    headless = sts["spec"]["serviceName"]
    name = sts["metadata"]["name"]
    assert args.peers == ",".join(f"{name}-{i}.{headless}:7422" for i in range(3))
    assert args.cluster_port == 7422
    # the routes' port is NATS', in its sidecar (the core reaches it over the loopback)
    assert {"name": "cluster", "containerPort": 7422, "protocol": "TCP"} in sidecars(sts)["nats"][
        "ports"
    ]
    assert args.nats_url == "nats://127.0.0.1:4222"
    env = {e["name"]: e for e in c["env"]}
    assert env["POLYMQ_K8S_SERVICE"]["value"] == headless
    ref = env["POLYMQ_CLUSTER_SECRET"]["valueFrom"]["secretKeyRef"]
    secret = out.get("Secret", ref["name"])
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    value = base64.b64decode(secret["data"][ref["key"]]).decode()
    assert len(value) >= 32  # what the core requires of POLYMQ_CLUSTER_SECRET
    ports = {p["name"]: p for p in out.get("Service", headless)["spec"]["ports"]}
    assert ports["cluster"]["targetPort"] == 7422
    [policy] = out.of_kind("NetworkPolicy")
    [rule] = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == 7422]
    [source] = rule["from"]
    assert _selects(source["podSelector"], pod_labels(sts))
    assert not any(
        _selects(source["podSelector"], pod_labels(w)) for w in out.workloads() if w is not sts
    )
    # the sidecars' partition watch probes the other pods' admin ports: it is told the
    # core's, the endpoints name it `admin`, and the policy lets the core pods reach it
    nats = _parser().parse_args(sidecars(sts)["nats"]["args"])
    assert nats.admin_port == args.admin_port == container_port(c, "admin")
    assert ports["admin"]["targetPort"] == "admin"
    [rule] = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "admin"]
    assert any(_selects(s["podSelector"], pod_labels(sts)) for s in rule["from"])
    # a Secret of one's own instead; one node alone has none of this
    own = render(
        {
            "core": {"replicaCount": 3, "clusterSecret": {"existingSecret": "mine", "key": "k"}},
            "auth": {"allowAnonymousCluster": True},
        }
    )
    ref = {e["name"]: e for e in container(own.workload("core"))["env"]}["POLYMQ_CLUSTER_SECRET"][
        "valueFrom"
    ]["secretKeyRef"]
    assert ref == {"name": "mine", "key": "k"} and not own.of_kind("Secret")
    five = render(ci_values(CHART / "ci" / "five-core-values.yaml")).workload("core")
    peers = _parser().parse_args(container(five)["args"]).peers.split(",")
    assert [p.partition(".")[0] for p in peers] == [f"{name}-{i}" for i in range(5)]
    single = container(render({"core": {"replicaCount": 1}}).workload("core"))
    assert "--peers" not in single["args"] and "cluster" not in {p["name"] for p in single["ports"]}
    assert "POLYMQ_CLUSTER_SECRET" not in {e["name"] for e in single.get("env", [])}


CLUSTER_TLS = "/etc/polymq/cluster-tls"


@pytest.mark.parametrize("ci", ["cluster-tls-values.yaml", "five-core-cluster-tls-values.yaml"])
def test_cluster_tls_gives_every_core_container_the_certificate(ci: str) -> None:
    """tls.cluster.enabled: the Secret's certificate, key and CA are mounted in the core and
    in its NATS sidecar (when there is one), POLYMQ_CLUSTER_TLS_* name them there, the TLS
    ports the pods serve each other are the core's --peer-*-port and container ports, and
    the NetworkPolicy opens them to core pods alone. Without it (or with one pod) none of
    this."""
    values = ci_values(CHART / "ci" / ci)
    tls = values["tls"]["cluster"]
    out = render(values)
    sts = out.workload("core")
    c = container(sts)
    [volume] = [v for v in pod_spec(sts)["volumes"] if v["name"] == "cluster-tls"]
    assert volume["secret"]["secretName"] == tls["existingSecret"]
    items = {i["path"]: i["key"] for i in volume["secret"]["items"]}
    assert items == {
        "tls.crt": tls.get("certKey", "tls.crt"),
        "tls.key": tls.get("keyKey", "tls.key"),
        "ca.crt": tls.get("caKey", "ca.crt"),
    }
    nats = sidecars(sts).get("nats")
    assert (nats is not None) == values.get("core", {}).get("nats", {}).get("sidecar", True)
    for each in [c] if nats is None else [c, nats]:
        assert {"name": "cluster-tls", "mountPath": CLUSTER_TLS, "readOnly": True} in each[
            "volumeMounts"
        ]
        env = {e["name"]: e.get("value") for e in each["env"]}
        assert env["POLYMQ_CLUSTER_TLS_CERT"] == f"{CLUSTER_TLS}/tls.crt"
        assert env["POLYMQ_CLUSTER_TLS_KEY"] == f"{CLUSTER_TLS}/tls.key"
        assert env["POLYMQ_CLUSTER_TLS_CA"] == f"{CLUSTER_TLS}/ca.crt"
    ports = values.get("core", {}).get("containerPorts", {})
    wire, admin = ports.get("peerWire", 7423), ports.get("peerAdmin", 7424)
    args = _parser().parse_args(c["args"])
    assert (args.peer_wire_port, args.peer_admin_port) == (wire, admin)
    assert (container_port(c, "peer-wire"), container_port(c, "peer-admin")) == (wire, admin)
    [policy] = out.of_kind("NetworkPolicy")
    [rule] = [
        r for r in policy["spec"]["ingress"] if {"port": wire, "protocol": "TCP"} in r["ports"]
    ]
    assert {"port": admin, "protocol": "TCP"} in rule["ports"]
    [source] = rule["from"]
    assert _selects(source["podSelector"], pod_labels(sts))
    assert not any(
        _selects(source["podSelector"], pod_labels(w)) for w in out.workloads() if w is not sts
    )
    for plain in (
        render(),
        render(ci_values(CHART / "ci" / "single-node-cluster-tls-values.yaml")),
    ):
        core = plain.workload("core")
        pc = container(core)
        assert "--peer-wire-port" not in pc["args"]
        assert not any(e["name"].startswith("POLYMQ_CLUSTER_TLS_") for e in pc.get("env", []))
        assert "cluster-tls" not in {v["name"] for v in pod_spec(core).get("volumes", [])}


def test_the_core_may_read_its_endpoints_and_its_statefulset_and_nothing_else() -> None:
    out = render()
    sts = out.workload("core")
    [role] = out.of_kind("Role")
    rules = sorted(
        (
            tuple(r["apiGroups"]),
            tuple(r["resources"]),
            tuple(sorted(r["verbs"])),
            tuple(r.get("resourceNames", ())),
        )
        for r in role["rules"]
    )
    assert rules == [
        (("",), ("endpoints",), ("get", "list", "watch"), ()),
        (("apps",), ("statefulsets",), ("get",), (sts["metadata"]["name"],)),
        (("discovery.k8s.io",), ("endpointslices",), ("get", "list", "watch"), ()),
    ]
    [binding] = out.of_kind("RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}  # fmt: skip
    [account] = out.of_kind("ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": NAMESPACE}]  # fmt: skip
    assert pod_spec(sts)["serviceAccountName"] == account["metadata"]["name"]
    none = render({"rbac": {"create": False}, "serviceAccount": {"create": False}})
    assert not none.of_kind("Role") and not none.of_kind("ServiceAccount")
    assert pod_spec(none.workload("core"))["serviceAccountName"] == "default"


def test_the_network_policy_admits_only_frontends_and_peers_to_the_wire_port(
    rendered: Rendered,
) -> None:
    core = rendered.workload("core")
    [policy] = [p for p in rendered.of_kind("NetworkPolicy") if component_of(p) == "core"]
    assert _selects(policy["spec"]["podSelector"], pod_labels(core))
    assert not any(
        _selects(policy["spec"]["podSelector"], pod_labels(w))
        for w in rendered.workloads()
        if w is not core
    )
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    wire = [
        r for r in policy["spec"]["ingress"] if r["ports"] == [{"port": "wire", "protocol": "TCP"}]
    ]
    admin = [
        r for r in policy["spec"]["ingress"] if r["ports"] == [{"port": "admin", "protocol": "TCP"}]
    ]
    clustered = core["spec"]["replicas"] > 1
    assert len(wire) == 1 and len(admin) == 1
    assert len(policy["spec"]["ingress"]) == 2 + clustered  # (the cluster port: peers only)
    peers = [p["podSelector"] for p in wire[0]["from"] if set(p) == {"podSelector"}]
    for workload in rendered.workloads():  # every frontend and every core pod (the peers)
        assert any(_selects(s, pod_labels(workload)) for s in peers), component_of(workload)
    strangers = [
        {"app.kubernetes.io/name": "polymq", "app.kubernetes.io/instance": "other"},
        {"app.kubernetes.io/name": "polymq", "app.kubernetes.io/instance": RELEASE},
        {"app": "anything"},
    ]
    assert not any(_selects(s, labels) for s in peers for labels in strangers)
    extra = rendered.values.get("networkPolicy", {}).get("core", {})
    assert [p for p in wire[0]["from"] if set(p) != {"podSelector"}] == extra.get(
        "extraWireFrom", []
    )
    own, *others = admin[0]["from"]
    assert own == {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "polymq",
                "app.kubernetes.io/instance": RELEASE,
            }
        }
    }
    prometheus = extra.get("prometheus", {})
    if prometheus.get("enabled", True):
        namespace = prometheus.get("namespace", "monitoring") or NAMESPACE
        assert others.pop(0) == {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "podSelector": prometheus.get("podSelector", {}),
        }
    assert others == extra.get("adminFrom", [])
    assert not render({"networkPolicy": {"enabled": False}}).of_kind("NetworkPolicy")


def test_the_admin_port_admits_the_release_and_prometheus_by_default() -> None:
    """The defaults: the core's admin port (metrics, console, reloads, cluster moves) is
    open to this release's own pods and to the pods of namespace ``monitoring``; not to the
    release's neighbours, another release or another namespace."""
    out = render()
    [policy] = out.of_kind("NetworkPolicy")
    [admin] = [
        r for r in policy["spec"]["ingress"] if {"port": "admin", "protocol": "TCP"} in r["ports"]
    ]
    assert admin["ports"] == [{"port": "admin", "protocol": "TCP"}]

    def admitted(labels: dict[str, str], namespace: str) -> bool:
        for peer in admin["from"]:
            ns = peer.get("namespaceSelector")
            in_ns = (
                namespace == NAMESPACE
                if ns is None
                else _selects(ns, {"kubernetes.io/metadata.name": namespace})
            )
            if in_ns and _selects(peer.get("podSelector", {}), labels):
                return True
        return False

    for workload in out.workloads():
        assert admitted(pod_labels(workload), NAMESPACE), component_of(workload)
    assert admitted({"app.kubernetes.io/name": "prometheus"}, "monitoring")
    assert not admitted({"app": "anything"}, NAMESPACE)
    assert not admitted(
        {"app.kubernetes.io/name": "polymq", "app.kubernetes.io/instance": "other"}, NAMESPACE
    )
    assert not admitted({"app.kubernetes.io/name": "prometheus"}, "default")
    # Prometheus elsewhere, or told apart by its labels; or not admitted at all
    moved = render(
        {
            "networkPolicy": {
                "core": {
                    "prometheus": {
                        "namespace": "observability",
                        "podSelector": {"matchLabels": {"app": "prom"}},
                    }
                }
            }
        }
    )
    [policy] = moved.of_kind("NetworkPolicy")
    [admin] = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "admin"]
    assert admitted({"app": "prom"}, "observability")
    assert not admitted({"app": "grafana"}, "observability")
    assert not admitted({"app": "prom"}, "monitoring")
    off = render({"networkPolicy": {"core": {"prometheus": {"enabled": False}}}})
    [policy] = off.of_kind("NetworkPolicy")
    [admin] = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "admin"]
    assert not admitted({}, "monitoring") and len(admin["from"]) == 1


def test_anonymous_mode_warns_and_a_replicated_core_must_ask_for_it() -> None:
    """Anonymous mode (auth.enabled=false, the default) renders with one core node and
    NOTES.txt warns; with more core nodes it is refused, with the fix, unless
    auth.allowAnonymousCluster=true (then NOTES says so); with logins on, no warning."""
    single = render()
    assert single.workload("core")["spec"]["replicas"] == 1
    assert "WARNING: LOGINS ARE OFF" in single.notes
    assert "allowAnonymousCluster" not in single.notes
    with pytest.raises(helm.HelmRenderError) as caught:
        render({"core": {"replicaCount": 3}})
    for hint in (
        "polymq: auth.enabled",
        "core.replicaCount=3",
        "anonymous mode",
        "--set auth.enabled=true",
        "--set auth.allowAnonymousCluster=true",
    ):
        assert hint in str(caught.value), str(caught.value)
    meant = render({"core": {"replicaCount": 3}, "auth": {"allowAnonymousCluster": True}})
    assert meant.workload("core")["spec"]["replicas"] == 3
    assert "WARNING: LOGINS ARE OFF" in meant.notes
    assert "auth.allowAnonymousCluster=true" in meant.notes
    logins = render(
        {
            "core": {"replicaCount": 3},
            "auth": {
                "enabled": True,
                "existingSecret": "u",
                "frontendLogin": {"existingSecret": "f"},
            },
        }
    )
    assert "WARNING" not in logins.notes and "LOGINS: required" in logins.notes


# ---- wiring between objects -------------------------------------------------------------------
def test_objects_reach_each_other(rendered: Rendered) -> None:
    names = [(o["kind"], o["metadata"]["name"]) for o in rendered.objects]
    assert len(names) == len(set(names))
    for obj in rendered.objects:
        assert obj["metadata"]["namespace"] == NAMESPACE
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    for workload in rendered.workloads():
        assert _selects(workload["spec"]["selector"], pod_labels(workload))
    for svc in rendered.of_kind("Service"):
        for port in svc["spec"]["ports"]:
            service_target(
                rendered, svc["metadata"]["name"], port["port"]
            )  # one workload, a named port
    for ingress in rendered.of_kind("Ingress"):
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                svc = rendered.get("Service", backend["name"])
                [port] = [p for p in svc["spec"]["ports"] if p["name"] == backend["port"]["name"]]
                workload, target = service_target(rendered, svc["metadata"]["name"], port["port"])
                # an Ingress speaks HTTP: it must land on the listener that serves the probes
                readiness = container(workload)["readinessProbe"]["httpGet"]["port"]
                assert target == container_port(container(workload), readiness)
        hosts = {r["host"] for r in ingress["spec"]["rules"]}
        assert all(
            set(t["hosts"]) <= hosts and t["secretName"] for t in ingress["spec"].get("tls", [])
        )
    for hpa in rendered.of_kind("HorizontalPodAutoscaler"):
        target = rendered.get("Deployment", hpa["spec"]["scaleTargetRef"]["name"])
        assert "replicas" not in target["spec"]  # the autoscaler owns it
    for pdb in rendered.of_kind("PodDisruptionBudget"):
        selected = [
            w for w in rendered.workloads() if _selects(pdb["spec"]["selector"], pod_labels(w))
        ]
        assert len(selected) == 1
    if "core" in rendered.components():
        core = rendered.workload("core")
        wire = container_port(container(core), "wire")
        for workload in rendered.workloads():
            if workload is not core:
                args = container(workload)["args"]
                host, _, port = args[args.index("--core") + 1].rpartition(":")
                assert service_target(rendered, host, int(port)) == (core, wire)


def test_every_process_is_scraped_once_on_its_metrics_port(rendered: Rendered) -> None:
    targets = scrape_targets(rendered)
    assert sorted(component_of(w) for w, *_ in targets) == sorted(rendered.components())
    for workload, port, path, scheme in targets:
        c = container(workload)
        readiness = c["readinessProbe"]["httpGet"]
        # /metrics is served by the same listener as the probes, in the same scheme
        assert (port, path) == (container_port(c, readiness["port"]), "/metrics")
        assert scheme == readiness["scheme"].lower()
    monitored = bool(rendered.of_kind("ServiceMonitor"))
    for workload in rendered.workloads():
        annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
        assert ("prometheus.io/scrape" in annotations) is not monitored


def test_frontends_can_use_a_core_deployed_elsewhere() -> None:
    out = render(
        {"core": {"enabled": False}, "externalCore": {"host": "core.mq.svc", "port": 7500}}
    )
    assert "core" not in out.components() and not out.of_kind("Role")
    assert not out.of_kind("NetworkPolicy")
    for workload in out.workloads():
        args = container(workload)["args"]
        assert args[args.index("--core") + 1] == "core.mq.svc:7500"
    assert "external, at core.mq.svc:7500" in out.notes


def test_notes_say_how_to_reach_each_enabled_protocol(rendered: Rendered) -> None:
    for name in FRONTENDS:
        enabled = name in rendered.components()
        assert (f"\n{name.upper()}: " in rendered.notes) is enabled, name
        if enabled:
            [svc] = [s for s in rendered.of_kind("Service") if component_of(s) == name]
            assert f"port-forward svc/{svc['metadata']['name']} " in rendered.notes
    for ingress in rendered.of_kind("Ingress"):
        for rule in ingress["spec"]["rules"]:
            assert f"://{rule['host']}/" in rendered.notes
    auth = rendered.values.get("auth", {}).get("enabled", False)
    assert ("LOGINS: required" in rendered.notes) is auth


# ---- replicas, the NATS sidecar, spreading and stopping the core; helm test --------------------
def _valid(out: Rendered) -> None:
    for obj in out.objects:
        if (obj["apiVersion"], obj["kind"]) not in CRD_KINDS:
            for version in KUBE_VERSIONS:
                kubernetes_validate.validate(obj, version, strict=True)


def _mount_of(c: dict[str, Any], path: str) -> str:
    [mount] = [m["name"] for m in c["volumeMounts"] if m["mountPath"] == path]
    return str(mount)


@pytest.mark.parametrize("replicas", [1, 3, 5])
@pytest.mark.parametrize("sidecar", [True, False], ids=["sidecar", "child"])
def test_core_replicas_with_nats_in_a_sidecar_or_a_child(replicas: int, sidecar: bool) -> None:
    """1 node: no NATS at all. 3 or 5: every pod's NATS either in a native sidecar that runs
    `polymq nats` with the core's own peers, Service, cluster port, data volume and secret
    (the core is told --nats on the loopback), or a child of the core (its route port on the
    core)."""
    out = render(
        {
            "core": {"replicaCount": replicas, "nats": {"sidecar": sidecar}},
            "auth": {"allowAnonymousCluster": True},
        }
    )
    _valid(out)
    sts = out.workload("core")
    assert sts["spec"]["replicas"] == replicas
    c = container(sts)
    core = _parser().parse_args(c["args"])
    ports = {p["name"] for p in c["ports"]}
    found = sidecars(sts)
    if replicas == 1:
        assert core.peers is None and core.nats_url is None and not found
        # (the Service would turn cluster mode on: one node runs alone, on SQLite)
        assert "POLYMQ_K8S_SERVICE" not in {e["name"] for e in c.get("env", [])}
        assert "initContainers" not in pod_spec(sts) and "cluster" not in ports
        return
    assert len(core.peers.split(",")) == replicas
    if not sidecar:
        assert core.nats_url is None and not found and "cluster" in ports
        return
    assert "cluster" not in ports and set(found) == {"nats"}
    nats = found["nats"]
    assert nats["restartPolicy"] == "Always"  # a native sidecar: up first, stopped last
    assert nats["image"] == c["image"] and nats["command"] == ["polymq"]
    args = _parser().parse_args(nats["args"])
    assert args.command == "nats"
    assert (args.peers, args.cluster_port) == (core.peers, core.cluster_port)
    assert core.nats_url == f"nats://127.0.0.1:{args.client_port}"
    assert nats["startupProbe"]["tcpSocket"]["port"] == "nats"
    assert {"name": "nats", "containerPort": args.client_port, "protocol": "TCP"} in nats["ports"]
    assert {"name": "cluster", "containerPort": args.cluster_port, "protocol": "TCP"} in nats[
        "ports"
    ]
    # the same node name and secret as the core, the JetStream store on the same volume
    env = {e["name"]: e for e in nats["env"]}
    core_env = {e["name"]: e for e in c["env"]}
    for name in ("POLYMQ_NODE_NAME", "POLYMQ_CLUSTER_SECRET", "POLYMQ_K8S_SERVICE"):
        assert env[name] == core_env[name]  # (the endpoints are routes for its NATS too)
    assert args.data_dir == core.data_dir
    assert _mount_of(nats, args.data_dir) == _mount_of(c, core.data_dir) == "data"


def _nats_memory(nats: dict[str, Any], sidecar: bool = True) -> str | None:
    """POLYMQ_NATS_MEMORY_LIMIT of the pod's nats-server: its sidecar's, or the core's."""
    out = render(
        {
            "core": {"replicaCount": 3, "nats": {"sidecar": sidecar, **nats}},
            "auth": {"allowAnonymousCluster": True},
        }
    )
    _valid(out)
    sts = out.workload("core")
    c = sidecars(sts)["nats"] if sidecar else container(sts)
    values = [e["value"] for e in c.get("env", []) if e["name"] == "POLYMQ_NATS_MEMORY_LIMIT"]
    assert len(values) <= 1, values
    return values[0] if values else None


def test_nats_servers_soft_memory_limit_stays_under_its_containers_limit() -> None:
    """GOMEMLIMIT (POLYMQ_NATS_MEMORY_LIMIT) was polymq's 512 MiB default whatever the NATS
    container's limit (512Mi by default: Go's soft limit at the kill line); now 90% of that
    limit, or what core.nats.memoryLimit says. Without the sidecar the container's limit is
    the core's too: only an explicit value is given."""
    mi = 1024 * 1024
    assert _nats_memory({}) == str(512 * mi * 9 // 10)
    assert _nats_memory({"resources": {"limits": {"memory": "2Gi"}}}) == str(2048 * mi * 9 // 10)
    assert _nats_memory({"resources": {"limits": {"memory": "1G"}}}) == str(900_000_000)
    assert _nats_memory({"resources": {"limits": None}}) is None  # no limit: polymq's default
    assert _nats_memory({"memoryLimit": "1536Mi"}) == str(1536 * mi)
    assert _nats_memory({"memoryLimit": 100_000_000}) == "100000000"
    assert _nats_memory({"memoryLimit": 0}) == "0"  # none
    assert _nats_memory({}, sidecar=False) is None
    assert _nats_memory({"memoryLimit": "1Gi"}, sidecar=False) == str(1024 * mi)


def test_the_sidecar_needs_a_kubernetes_with_native_sidecars(tmp_path: Path) -> None:
    """The check behind validateValues, asked about another Kubernetes version (the SDK
    renders for its own, and `helm lint` does not fail on `fail`): a copy of the chart with
    one more template that calls it with that version."""
    copy = tmp_path / "polymq"
    shutil.copytree(CHART, copy)

    def refusal(kube: str, core: dict[str, Any]) -> str:
        (copy / "templates" / "kube-version.txt").write_text(
            '{{ include "polymq.validateValues.natsSidecar" (dict "Values" .Values'
            f' "Capabilities" (dict "KubeVersion" (dict "Version" "{kube}"))) }}}}'
        )
        values = {"core": {"replicaCount": 3, **core}, "auth": {"allowAnonymousCluster": True}}
        out = helm.Chart.load(copy).render(
            values, name=RELEASE, namespace=NAMESPACE, is_install=True
        )
        return out["polymq/templates/kube-version.txt"]

    old = refusal("v1.28.9", {})
    assert "core.nats.sidecar" in old and "--set core.nats.sidecar=false" in old, old
    assert refusal("v1.29.0", {}) == refusal("v1.36.0", {}) == ""
    assert refusal("v1.28.9", {"nats": {"sidecar": False}}) == ""
    assert refusal("v1.28.9", {"replicaCount": 1}) == ""


def test_core_pods_spread_over_hosts_unless_told_otherwise() -> None:
    def affinity(values: dict[str, Any]) -> Any:
        return pod_spec(render({"core": values}).workload("core")).get("affinity")

    out = render()
    sts = out.workload("core")
    [term] = affinity({})["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["weight"] == 100
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    selector = term["podAffinityTerm"]["labelSelector"]
    assert _selects(selector, pod_labels(sts))  # keeps core pods apart from each other...
    others = [w for w in out.workloads() if w is not sts]
    assert others and not any(_selects(selector, pod_labels(w)) for w in others)  # ...only
    [required] = affinity({"podAntiAffinityPreset": "hard"})["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert required == term["podAffinityTerm"]
    assert affinity({"podAntiAffinityPreset": "none"}) is None
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "disk", "operator": "In", "values": ["ssd"]}]}]}}}  # fmt: skip
    assert affinity({"affinity": own}) == own  # core.affinity replaces the preset


def test_a_core_pod_leaves_the_endpoints_before_it_is_told_to_stop() -> None:
    """preStop pauses (the pod is already out of the Services' endpoints) before SIGTERM,
    and the grace period leaves the handover time after that pause."""
    c = container(render().workload("core"))
    assert c["lifecycle"]["preStop"] == {"exec": {"command": ["/bin/sleep", "5"]}}
    grace = pod_spec(render().workload("core"))["terminationGracePeriodSeconds"]
    assert grace >= 5 + 60  # the CLI gives the core 60 s to stop
    for name in FRONTENDS:  # the frontends have no such hook
        assert "lifecycle" not in container(render().workload(name))
    none = render({"core": {"preStopSleepSeconds": 0}}).workload("core")
    assert "lifecycle" not in container(none)
    single = render({"core": {"replicaCount": 1}}).workload("core")
    assert container(single)["lifecycle"]["preStop"]["exec"]["command"] == ["/bin/sleep", "5"]


def _check_pod(out: Rendered) -> dict[str, Any] | None:
    pods = out.of_kind("Pod")
    assert len(pods) <= 1
    return pods[0] if pods else None


def test_helm_test_checks_every_enabled_frontend_through_its_service(rendered: Rendered) -> None:
    pod = _check_pod(rendered)
    enabled = sorted(rendered.components() - {"core", "bridge"})  # the frontends
    if not rendered.values.get("tests", {}).get("enabled", True) or not enabled:
        assert pod is None
        return
    assert pod is not None
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    [c] = pod["spec"]["containers"]
    assert c["command"] == ["polymq"] and c["image"] == container(rendered.workloads()[0])["image"]
    args = _parser().parse_args(c["args"])
    assert args.command == "check" and args.timeout > 0
    given = sorted(k for k in ("http", "longpoll", "avro", "stomp", "amqp") if getattr(args, k))
    assert given == enabled and args.core is None
    secure = False
    for name in enabled:
        address = getattr(args, name)
        scheme, _, rest = address.rpartition("://")
        hostport = rest.rstrip("/")
        host, _, port = hostport.rpartition(":")
        service, _, domain = host.partition(".")
        assert domain == f"{NAMESPACE}.svc", address
        workload, target = service_target(rendered, service, int(port))
        assert component_of(workload) == name
        listener = {p["containerPort"]: p["name"] for p in container(workload)["ports"]}[target]
        # STOMP over TCP, plain AMQP, the HTTP frontends' one listener (http or https)
        wanted = {"stomp": ("stomp",), "amqp": ("amqp",)}.get(name, ("http", "https"))
        assert listener in wanted, (name, listener)
        tls = listener == "https" or (name == "stomp" and scheme == "stomp+ssl")
        secure = secure or tls
        if name in ("http", "longpoll", "avro"):
            assert scheme == ("https" if tls else "http"), address
        elif name == "amqp":
            assert scheme == "amqp", address
    assert args.insecure is secure
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c.get("env", [])}
    if rendered.values.get("auth", {}).get("enabled"):
        login = rendered.values["auth"]["frontendLogin"]["existingSecret"]
        assert env["POLYMQ_CHECK_USER"]["name"] == env["POLYMQ_CHECK_PASSWORD"]["name"] == login
    else:
        assert env == {}


def test_helm_test_can_be_left_out_and_follows_the_frontends() -> None:
    assert _check_pod(render({"tests": {"enabled": False}})) is None
    pod = _check_pod(render({f: {"enabled": False} for f in ("longpoll", "avro", "amqp")}))
    assert pod is not None
    args = _parser().parse_args(pod["spec"]["containers"][0]["args"])
    assert (args.http, args.stomp, args.avro, args.amqp, args.longpoll)[2:] == (None,) * 3
    token = render({"auth": {"enabled": True, "existingSecret": "u", "frontendLogin": {
        "type": "token", "existingSecret": "t", "tokenKey": "tok"}}})  # fmt: skip
    pod = _check_pod(token)
    assert pod is not None
    assert pod["spec"]["containers"][0]["env"] == [
        {"name": "POLYMQ_CHECK_TOKEN", "valueFrom": {"secretKeyRef": {"name": "t", "key": "tok"}}}
    ]


# ---- the RabbitMQ bridge ------------------------------------------------------------------------
def test_the_defaults_render_no_bridge() -> None:
    out = render()
    bridge = [o for o in out.objects if component_of(o) == "bridge"]
    assert bridge == []
    assert "BRIDGE" not in out.notes
    # the core's NetworkPolicy admits it all the same, so enabling it later needs nothing more
    [policy] = out.of_kind("NetworkPolicy")
    [wire] = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "wire"]
    bridge_pod = {
        "app.kubernetes.io/name": "polymq",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": "bridge",
    }
    assert any(_selects(p["podSelector"], bridge_pod) for p in wire["from"])


def test_the_bridge_runs_the_links_of_its_configmap_with_the_url_from_its_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = ci_values(BRIDGE_CI)
    out = render(values)
    deployment = out.workload("bridge")
    assert deployment["kind"] == "Deployment" and deployment["spec"]["replicas"] == 1
    # a new pod starts once the old one is gone: never two bridges on the same links
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    c, spec = container(deployment), pod_spec(deployment)

    # the command line, as the real CLI parses it
    args = _parser().parse_args(c["args"])
    assert args.command == "bridge"
    assert args.bridge_port == container_port(c, "http") == 7460
    host, _, port = args.core.rpartition(":")
    core = out.workload("core")
    assert service_target(out, host, int(port)) == (core, container_port(container(core), "wire"))

    # the links file: mounted from the chart's ConfigMap, loadable by the bridge itself
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    directory, _, filename = args.config.rpartition("/")
    mount = mounts[directory]
    assert mount["readOnly"] is True
    [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    [item] = [i for i in volume["configMap"]["items"] if i["path"] == filename]
    configmap = out.get("ConfigMap", volume["configMap"]["name"])
    links_file = tmp_path / filename
    links_file.write_text(configmap["data"][item["key"]])
    links = load_links(links_file).links
    assert [link.name for link in links] == [link["name"] for link in values["bridge"]["links"]]
    assert [type(link) for link in links] == [OutboundLink, InboundLink]

    # the RabbitMQ URL: from the chart's Secret by secretKeyRef, in no plain value or argument
    env = {var["name"]: var for var in c["env"]}
    ref = env["POLYMQ_BRIDGE_RABBITMQ_URL"]["valueFrom"]["secretKeyRef"]
    secret = out.get("Secret", ref["name"])
    url = base64.b64decode(secret["data"][ref["key"]]).decode()
    assert url == values["bridge"]["rabbitmq"]["url"]
    assert all("value" not in var for var in c["env"])
    assert not any(url in arg or "bridge-secret" in arg for arg in c["args"])
    assert "bridge-secret" not in yaml.safe_dump(deployment)
    # ... and the settings the bridge makes of the pod's command line and environment pass
    monkeypatch.setenv("POLYMQ_BRIDGE_RABBITMQ_URL", url)
    settings = settings_from(args)
    assert settings.bridge_config == args.config
    # (the core's headless Service: its name resolves to every core pod)
    assert (settings.core_host, settings.core_port) == ("polymq-test-core-headless", 7400)

    # the probes: /healthz and /readyz on the bridge's port
    found = dict(probes(c))
    assert found["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert found["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in found.values():
        assert container_port(c, probe["httpGet"]["port"]) == args.bridge_port

    # the pod rolls when the links change
    changed = copy.deepcopy(values)
    changed["bridge"]["links"][0]["prefetch"] = 7
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["example.com/team"] == "messaging"
    other = render(changed).workload("bridge")["spec"]["template"]["metadata"]["annotations"]
    assert other["checksum/links"] != annotations["checksum/links"]

    # scraped on that port through the ServiceMonitor's Service (and NOTES say where it is)
    assert [(port, scheme) for w, port, _, scheme in scrape_targets(out) if w is deployment] == [
        (args.bridge_port, "http")
    ]
    assert "\nBRIDGE: " in out.notes and "2 link(s)" in out.notes


def test_the_bridge_may_take_its_links_and_url_from_existing_objects() -> None:
    values = ci_values(BRIDGE_CI)
    values["bridge"]["links"] = []
    values["bridge"]["existingConfigMap"] = "my-links"
    values["bridge"]["linksKey"] = "bridge.json"
    values["bridge"]["rabbitmq"] = {"existingSecret": "my-rabbitmq", "key": "amqp-url"}
    out = render(values)
    assert not [o for o in out.of_kind("ConfigMap") + out.of_kind("Secret")
                if component_of(o) == "bridge"]  # fmt: skip
    c = container(out.workload("bridge"))
    [var] = [v for v in c["env"] if v["name"] == "POLYMQ_BRIDGE_RABBITMQ_URL"]
    assert var["valueFrom"]["secretKeyRef"] == {"name": "my-rabbitmq", "key": "amqp-url"}
    [volume] = [v for v in pod_spec(out.workload("bridge"))["volumes"] if "configMap" in v]
    assert volume["configMap"] == {
        "name": "my-links",
        "items": [{"key": "bridge.json", "path": "links.json"}],
    }
    assert "checksum/links" not in out.workload("bridge")["spec"]["template"]["metadata"].get(
        "annotations", {}
    )
    assert "ConfigMap my-links, key bridge.json" in out.notes
    _valid(out)


def test_the_bridge_alone_may_run_against_a_core_deployed_elsewhere() -> None:
    values = ci_values(BRIDGE_CI)
    values.update({f: {"enabled": False} for f in FRONTENDS})
    values["core"] = {"enabled": False}
    values["externalCore"] = {"host": "core.mq.svc"}
    out = render(values)
    assert out.components() == {"bridge"}
    args = _parser().parse_args(container(out.workload("bridge"))["args"])
    assert args.core == "core.mq.svc:7400"
    assert not out.of_kind("Pod")  # helm test checks frontends: there are none
    _valid(out)


def test_the_bridge_logs_in_to_the_core_as_the_frontends_do() -> None:
    values = ci_values(BRIDGE_CI)
    values["auth"] = {
        "enabled": True,
        "existingSecret": "polymq-users",
        "frontendLogin": {"existingSecret": "polymq-frontend-login"},
    }
    out = render(values)
    env = {v["name"]: v for v in container(out.workload("bridge"))["env"]}
    http = {v["name"]: v for v in container(out.workload("http"))["env"]}
    assert {"POLYMQ_CORE_USER", "POLYMQ_CORE_PASSWORD"} <= set(env)
    for name in ("POLYMQ_CORE_USER", "POLYMQ_CORE_PASSWORD"):
        assert env[name] == http[name]


def test_the_bridge_admits_connections_to_its_metrics_port_alone() -> None:
    values = ci_values(BRIDGE_CI)
    peer = {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}
    values["networkPolicy"] = {"bridge": {"metricsFrom": [peer]}}
    out = render(values)
    deployment = out.workload("bridge")
    [policy] = [p for p in out.of_kind("NetworkPolicy") if component_of(p) == "bridge"]
    assert _selects(policy["spec"]["podSelector"], pod_labels(deployment))
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress: RabbitMQ, the core, DNS
    [rule] = policy["spec"]["ingress"]
    [port] = rule["ports"]
    assert container_port(container(deployment), port["port"]) == 7460
    assert rule["from"] == [peer]
    _valid(out)


def test_a_refused_rabbitmq_url_is_not_repeated_in_the_error() -> None:
    with pytest.raises(helm.HelmRenderError) as caught:
        render(_bridge(rabbitmq={"url": "amqp:/user:hunter2@rabbitmq/"}))
    assert "bridge.rabbitmq.url" in str(caught.value)
    assert "hunter2" not in str(caught.value)
