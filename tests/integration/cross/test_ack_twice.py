"""Acknowledging a receipt that was already acknowledged answers the same on every HTTP
frontend (the HTTP, long-polling and Avro frontends of one ``polymq run``), as the OpenAPI
document says: alone, 404 ``not-found``; beside a receipt still leased, 200 with it in
``missing`` and only the other settled."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from ...procs import PolymqProcess

pytestmark = pytest.mark.timeout(60)
WAIT = 10


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    workdir: Path = tmp_path_factory.mktemp("acktwice")
    with PolymqProcess("run", workdir) as proc:
        yield proc


def lease(run: PolymqProcess, listener: str) -> str:
    """A receipt of a message leased from a fresh queue through ``listener``."""
    q = f"acktwice{uuid.uuid4().hex[:10]}"
    r = requests.post(f"{run.url('http')}/v1/queue/{q}/messages", json={"body": "x"}, timeout=WAIT)
    assert r.status_code == 200, r.text
    if listener == "http":
        r = requests.post(f"{run.url('http')}/v1/queue/{q}/pull", timeout=WAIT)
        return str(r.json()["messages"][0]["receipt"])
    if listener == "avro":
        r = requests.get(
            f"{run.url('avro')}/v1/queue/{q}/records",
            headers={"Accept": "application/json"},
            timeout=WAIT,
        )
        return str(r.json()["records"][0]["receipt"])
    base = run.url("longpoll")
    sub = requests.post(
        f"{base}/v1/subscriptions", json={"destination": f"queue/{q}", "ack": "client"},
        timeout=WAIT,
    ).json()  # fmt: skip
    r = requests.get(f"{base}/v1/subscriptions/{sub['id']}/poll", params={"wait": 5}, timeout=WAIT)
    return str(r.json()["messages"][0]["receipt"])


@pytest.mark.parametrize("listener", ["http", "longpoll", "avro"])
def test_a_second_ack_of_a_receipt_answers_the_same_everywhere(
    run: PolymqProcess, listener: str
) -> None:
    receipt = lease(run, listener)
    url = f"{run.url(listener)}/v1/ack"
    first = requests.post(url, json={"receipts": [receipt]}, timeout=WAIT)
    assert (first.status_code, first.json()) == (200, {"settled": 1, "missing": []})
    again = requests.post(url, json={"receipts": [receipt]}, timeout=WAIT)
    assert again.status_code == 404 and again.json()["code"] == "not-found", again.text
    other = lease(run, listener)
    both = requests.post(url, json={"receipts": [receipt, other]}, timeout=WAIT)
    assert (both.status_code, both.json()) == (200, {"settled": 1, "missing": [receipt]})
