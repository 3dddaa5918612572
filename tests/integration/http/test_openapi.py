"""The OpenAPI document, checked against the running service with schemathesis: every
operation fuzzed (valid and invalid input) with its stateless checks, a bounded number of
examples each."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ...procs import PolymqProcess, serving
from .conftest import Api

CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
    "negative_data_rejection",
    "positive_data_acceptance",
    "missing_required_header",
    "unsupported_method",
]
EXAMPLES = 50


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    # Small limits so that generated long polls and batches stay quick; the document states
    # the service's own limits, so the fuzzer stays within them.
    env = {"POLYMQ_MAX_WAIT": "1", "POLYMQ_MAX_BATCH": "20", "POLYMQ_MAX_PULL": "20"}
    with serving("run", tmp_path_factory.mktemp("http-openapi"), env=env) as proc:
        yield proc


def test_document_is_served(api: Api) -> None:
    doc = api.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    pull = doc["paths"]["/v1/queue/{name}/pull"]["post"]
    wait = next(p for p in pull["parameters"] if p.get("name") == "wait")
    assert wait["schema"]["maximum"] == 1  # the running service's own limit
    assert {
        "/v1/{kind}/{name}/messages",
        "/v1/ack",
        "/v1/nack",
        "/v1/{kind}/{name}",
        "/v1/{kind}/{name}/purge",
        "/v1/{kind}/{name}/metadata",
    } <= set(doc["paths"])


def test_schemathesis(server: PolymqProcess, tmp_path: Path) -> None:
    cli = Path(sys.executable).with_name("schemathesis")
    argv = [
        str(cli),
        "run",
        f"{server.url('http')}/openapi.json",
        "--checks",
        ",".join(CHECKS),
        "--phases",
        "examples,coverage,fuzzing",  # the stateless ones
        "--max-examples",
        str(EXAMPLES),
        "--request-timeout",
        "10",
        "--workers",  # one: hypothesis' lambda introspection is not thread-safe
        "1",
        "--report-dir",
        str(tmp_path),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=110, cwd=tmp_path)
    report = done.stdout[-20000:] + done.stderr[-5000:]
    assert done.returncode == 0, report
    assert "13 selected / 13 total" in done.stdout, report
    assert " passed" in done.stdout and "failed" not in done.stdout, report
