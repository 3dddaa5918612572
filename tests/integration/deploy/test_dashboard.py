"""The Grafana dashboard of the chart (charts/polymq/dashboards/polymq.json): every query
parses as PromQL, and every metric it selects is one that a running ``polymq run`` serves
once traffic went through every protocol with per-destination metrics on; each protocol's
open connections show in ``polymq_client_connections``; the dashboard is well formed (its
data source a variable, panel ids unique, the grid 24 wide); and the chart ships it in a
ConfigMap for Grafana's sidecar only when asked (metrics.grafanaDashboard)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pika
import promql_parser
import pytest
import requests
import stomp
from pika.exceptions import ChannelClosedByBroker
from prometheus_client.parser import text_string_to_metric_families

from polymq import Client, Message, NotFound

from ...procs import WAIT, PolymqProcess, serving
from ..avro.conftest import USER, container, users
from .chart import CHART, NAMESPACE, ci_values, render

DASHBOARD = CHART / "dashboards" / "polymq.json"
# Grafana's variables, as it puts them in a query before sending it to Prometheus
VARIABLES = {
    "$__rate_interval": "1m",
    "$__range": "1h",
    '"$namespace"': '".*"',
    '"$destination"': '".*"',
}
# the labels Prometheus gives every series of a target (a ServiceMonitor's, or a pod's)
TARGET_LABELS = {"namespace", "instance", "job", "pod", "service", "container", "endpoint"}
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+), *(?P<label>\w+)\)$")
# the listeners that serve /metrics in `polymq run` (one registry behind them all)
METRICS_LISTENERS = ("admin", "http", "stomp_ws", "longpoll", "avro", "amqp_admin")
PROTOCOLS = {
    ("native", "core"),
    ("http", "http"),
    ("longpoll", "longpoll"),
    ("avro", "avro"),
    ("stomp", "stomp"),
    ("stomp", "stomp_ws"),
    ("amqp", "amqp"),
}


def _dashboard() -> dict[str, Any]:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return board


def _queries(board: dict[str, Any]) -> list[str]:
    """Every PromQL text of the dashboard, its variables given values: its panels' targets,
    and the series selectors of its variables' ``label_values(selector, label)``."""
    out = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            match = LABEL_VALUES.match(var["query"]["query"])
            assert match, var["query"]
            out.append(match["selector"])
    for name, value in VARIABLES.items():
        out = [q.replace(name, value) for q in out]
    return out


def _metrics(query: str) -> dict[str, set[str]]:
    """The metric names ``query`` selects, each with the labels it asks of that metric: in
    its matchers, and in the ``by (...)`` of the aggregations around it (a ValueError if the
    query is not PromQL)."""
    needs: dict[str, set[str]] = {}
    by: list[set[str]] = []

    def pre(node: Any) -> None:
        if isinstance(node, promql_parser.AggregateExpr):
            modifier = node.modifier
            grouped = modifier is not None and modifier.type == promql_parser.AggModifierType.By
            by.append(set(modifier.labels) if grouped else set())
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            matched = {m.name for m in node.matchers.matchers}
            needs.setdefault(node.name, set()).update(matched, *by)

    def post(node: Any) -> None:
        if isinstance(node, promql_parser.AggregateExpr):
            by.pop()

    promql_parser.walk(promql_parser.parse(query), pre, post)
    return needs


def _uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# ---- traffic through every protocol, one connection of each left open -----------------------
async def _native(client: Client) -> None:
    q = f"queue/{_uid('native')}"
    await client.publish(q, [Message(b"m", persistent=True) for _ in range(3)])
    sub = await client.subscribe(q, ack_mode="client-individual")
    first = await sub.get(WAIT)
    first.nack(requeue=True)  # a redelivery
    for _ in range(3):
        (await sub.get(WAIT)).ack()
    await client.publish(f"stream/{_uid('native')}", b"entry")
    with pytest.raises(NotFound):  # a request the core refuses
        await client.stats(f"queue/{_uid('never')}")


def _ok(response: requests.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def _http(proc: PolymqProcess, held: contextlib.ExitStack) -> None:
    s = held.enter_context(requests.Session())
    base = f"{proc.url('http')}/v1/queue/{_uid('http')}"
    _ok(s.post(f"{base}/messages", json={"body": "hi"}, timeout=WAIT))
    assert _ok(s.post(f"{base}/pull", params={"wait": 5}, timeout=WAIT))["messages"]


def _longpoll(proc: PolymqProcess, held: contextlib.ExitStack) -> None:
    s = held.enter_context(requests.Session())
    base, q = f"{proc.url('longpoll')}/v1", f"queue/{_uid('lp')}"
    sub = _ok(s.post(f"{base}/subscriptions", json={"destination": q}, timeout=WAIT), 201)["id"]
    _ok(s.post(f"{base}/{q}/messages", json={"body": "hi"}, timeout=WAIT))
    poll = s.get(f"{base}/subscriptions/{sub}/poll", params={"wait": 5}, timeout=WAIT)
    assert _ok(poll)["messages"]


def _avro(proc: PolymqProcess, held: contextlib.ExitStack) -> None:
    s = held.enter_context(requests.Session())
    url = f"{proc.url('avro')}/v1/stream/{_uid('avro')}/records"
    body = container(users(5), USER)
    _ok(s.post(url, data=body, headers={"Content-Type": "avro/binary"}, timeout=WAIT))


def _stomp(proc: PolymqProcess, held: contextlib.ExitStack) -> None:
    tcp = stomp.Connection12([("127.0.0.1", proc.ports["stomp"])])
    ws = stomp.WSStompConnection([("127.0.0.1", proc.ports["stomp_ws"])], ws_path="/ws")
    for conn in (tcp, ws):
        conn.connect(wait=True)
        held.callback(conn.disconnect)
        receipt = _uid("r")
        listener = stomp.listener.WaitingListener(receipt)
        conn.set_listener("receipt", listener)
        conn.send(f"/queue/{_uid('stomp')}", "hi", headers={"receipt": receipt})
        listener.wait_on_receipt()


def _amqp(proc: PolymqProcess, held: contextlib.ExitStack) -> None:
    params = pika.ConnectionParameters("127.0.0.1", proc.ports["amqp"], socket_timeout=WAIT)
    conn = pika.BlockingConnection(params)
    held.callback(conn.close)
    ch = conn.channel()
    ch.confirm_delivery()
    q = _uid("amqp")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"hi")
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"hi", method
    with pytest.raises(ChannelClosedByBroker):  # an AMQP channel exception
        conn.channel().queue_declare(_uid("missing"), passive=True)


Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]  # name -> labels -> value


def _scrape(proc: PolymqProcess, listener: str) -> Samples:
    r = requests.get(f"{proc.url(listener)}/metrics", timeout=WAIT)
    assert r.status_code == 200, (listener, r.text)
    out: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _connections(samples: Samples) -> dict[tuple[str, str], float]:
    return {
        (dict(labels)["protocol"], dict(labels)["listener"]): value
        for labels, value in samples["polymq_client_connections"].items()
    }


@dataclass
class Scrapes:
    during: dict[str, Samples]  # by listener: while one client of each protocol is connected
    after: Samples  # the admin port's, once every client left


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scrapes]:
    """Scrapes of a `polymq run` with per-destination metrics on: of every /metrics listener
    while one client of each protocol is connected, after traffic through each; then of the
    core's admin port once they all left. (The admin port's own connections are not client
    connections: its scrape sees the clients alone, where an HTTP frontend's would count the
    scrape's connection too.)"""

    async def run(proc: PolymqProcess) -> Scrapes:
        native = await Client.connect("127.0.0.1", proc.ports["core"])
        try:
            await _native(native)
            with contextlib.ExitStack() as held:
                for traffic in (_http, _longpoll, _avro, _stomp, _amqp):
                    traffic(proc, held)
                during = {listener: _scrape(proc, listener) for listener in METRICS_LISTENERS}
        finally:
            await native.close()
        deadline = time.monotonic() + WAIT
        after = _scrape(proc, "admin")
        while any(_connections(after).values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # (the servers see the clients' goodbyes a moment later)
            after = _scrape(proc, "admin")
        return Scrapes(during, after)

    env = {"POLYMQ_METRICS_PER_DESTINATION": "true"}
    with serving("run", tmp_path_factory.mktemp("dashboard"), env=env) as proc:
        yield asyncio.run(run(proc))


def test_every_metric_the_dashboard_queries_is_served(scraped: Scrapes) -> None:
    served: dict[str, set[str]] = {}  # every metric of every listener, with its labels
    for samples in scraped.during.values():
        for name, series in samples.items():
            served.setdefault(name, set()).update(label for s in series for label, _ in s)
    needs: dict[str, set[str]] = {}
    for query in _queries(_dashboard()):
        for name, labels in _metrics(query).items():
            needs.setdefault(name, set()).update(labels)
    assert len(needs) > 30  # not vacuous: the panels query the core and every frontend
    missing = sorted(needs.keys() - served.keys())
    assert missing == [], f"the dashboard queries metrics `polymq run` does not serve: {missing}"
    # and asks them only for labels they have (or that Prometheus adds to every target)
    wrong = {
        name: sorted(labels - served[name] - TARGET_LABELS)
        for name, labels in needs.items()
        if labels - served[name] - TARGET_LABELS
    }
    assert wrong == {}, f"labels the dashboard asks of metrics that do not have them: {wrong}"


def test_each_protocol_shows_its_open_connections(scraped: Scrapes) -> None:
    during = _connections(scraped.during["admin"])
    assert during.keys() == PROTOCOLS
    assert {key for key, value in during.items() if value >= 1} == PROTOCOLS, during
    assert _connections(scraped.after) == dict.fromkeys(PROTOCOLS, 0.0)


def test_every_query_is_promql_that_selects_only_polymq_metrics() -> None:
    queries = _queries(_dashboard())
    assert len(queries) > 40
    for query in queries:
        names = _metrics(query)  # parses, or raises saying where it does not
        assert names and all(n.startswith("polymq_") for n in names), query
    with pytest.raises(ValueError):  # the parser refuses what Prometheus would
        _metrics("sum by (le (rate(polymq_acked_messages_total[1m]))")


def test_the_dashboard_is_well_formed() -> None:
    board = _dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"namespace", "destination"} <= variables.keys()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert 'namespace=~"$namespace"' in target["expr"], panel["title"]
    per_destination = [
        t["expr"]
        for p in board["panels"]
        for t in p.get("targets", [])
        if "polymq_destination_" in t["expr"] and "omitted" not in t["expr"]
    ]
    assert per_destination
    assert all('destination=~"$destination"' in e for e in per_destination)


# ---- the chart -------------------------------------------------------------------------------
def _configmaps(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        o for o in render(values).of_kind("ConfigMap") if "polymq.json" in (o.get("data") or {})
    ]


def test_the_chart_ships_the_dashboard_only_when_asked() -> None:
    assert _configmaps({}) == []
    assert "Grafana dashboard" not in render().notes
    out = render(ci_values(CHART / "ci" / "grafana-values.yaml"))
    [cm] = [o for o in out.of_kind("ConfigMap") if "polymq.json" in o.get("data", {})]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == NAMESPACE
    assert json.loads(cm["data"]["polymq.json"]) == _dashboard()
    name = cm["metadata"]["name"]
    assert f"ConfigMap {name} in namespace {NAMESPACE}" in out.notes  # where to find it
    assert "at most 500 destinations" in out.notes


def test_the_dashboards_label_namespace_and_annotations_are_the_values() -> None:
    values = {
        "metrics": {
            "grafanaDashboard": {
                "enabled": True,
                "namespace": "monitoring",
                "label": "grafana-dashboards",
                "labelValue": "polymq",
                "annotations": {"grafana_folder": "Messaging"},
            }
        }
    }
    [cm] = _configmaps(values)
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana-dashboards"] == "polymq"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["annotations"]["grafana_folder"] == "Messaging"


def _core_env(values: dict[str, Any]) -> dict[str, str]:
    core = render(values).workload("core")
    [c] = [c for c in core["spec"]["template"]["spec"]["containers"] if c["name"] == "core"]
    return {e["name"]: e.get("value", "") for e in c.get("env", [])}


def test_per_destination_metrics_are_off_unless_asked() -> None:
    assert "POLYMQ_METRICS_PER_DESTINATION" not in _core_env({})
    env = _core_env(ci_values(CHART / "ci" / "grafana-values.yaml"))
    assert env["POLYMQ_METRICS_PER_DESTINATION"] == "true"
    assert env["POLYMQ_METRICS_MAX_DESTINATIONS"] == "500"
