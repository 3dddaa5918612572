"""``/metrics``: Prometheus text with the HTTP frontend's metrics, moving with requests."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from .conftest import Api, unique

PUBLISH_ROUTE = "/v1/{kind}/{name}/messages"


def scrape(api: Api) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    r = api.get("/metrics")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_move_with_requests(api: Api) -> None:
    before = scrape(api)
    assert value(before, "polymq_http_core_connected") == 1.0
    q = unique()
    for _ in range(3):
        api.publish(f"queue/{q}", {"body": "m"})
    assert api.get("/v1/no/such/route").status_code == 404
    after = scrape(api)

    ok = {"method": "POST", "route": PUBLISH_ROUTE, "status": "200"}
    assert (
        value(after, "polymq_http_requests_total", **ok)
        - value(before, "polymq_http_requests_total", **ok)
        == 3
    )
    timed = {"method": "POST", "route": PUBLISH_ROUTE}
    assert (
        value(after, "polymq_http_request_duration_seconds_count", **timed)
        - value(before, "polymq_http_request_duration_seconds_count", **timed)
        == 3
    )
    assert value(after, "polymq_http_request_duration_seconds_sum", **timed) > 0
    assert value(after, "polymq_http_messages_total", operation="publish") >= 3
    # unknown paths share one label instead of one series per path
    missing = {"method": "GET", "route": "unmatched", "status": "404"}
    assert value(after, "polymq_http_requests_total", **missing) >= 1
    assert not any(q in str(labels) for _, labels in after)
    # the core counts what arrived through this frontend under protocol="http"
    assert value(after, "polymq_published_messages_total", protocol="http", kind="queue") >= 3
