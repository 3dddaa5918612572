"""The admin API's OpenAPI document, checked against a running ``polymq run`` with
schemathesis as the HTTP frontend's is (tests/integration/http/test_openapi.py): every
operation fuzzed with valid and invalid input, its stateless checks, a bounded number of
examples each."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from polymq_core.admin.openapi import DOCUMENT

from ...procs import PolymqProcess, serving
from ..http.test_openapi import CHECKS

EXAMPLES = 30
# routes that never end (SSE), described but not fuzzed: a request would wait for its timeout
STREAMS = ["/api/overview/stream"]
DOCUMENT_OPERATIONS = [
    (path, method)
    for path, item in DOCUMENT["paths"].items()
    for method in item
    if method in ("get", "post", "put", "delete")
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolymqProcess]:
    with serving("run", tmp_path_factory.mktemp("admin-openapi")) as proc:
        yield proc


def test_every_route_is_described(server: PolymqProcess) -> None:
    """What the running core serves is the document, and it names every API route but the
    cluster's own (snapshot, leave, reload)."""
    served = requests.get(f"{server.url('admin')}/api/openapi.json", timeout=10).json()
    assert served == DOCUMENT
    assert len(DOCUMENT_OPERATIONS) == 16


@pytest.mark.timeout(300)
def test_schemathesis(server: PolymqProcess, tmp_path: Path) -> None:
    cli = Path(sys.executable).with_name("schemathesis")
    argv = [
        str(cli),
        "run",
        f"{server.url('admin')}/api/openapi.json",
        "--checks",
        ",".join(CHECKS),
        "--phases",
        "examples,coverage,fuzzing",
        "--max-examples",
        str(EXAMPLES),
        "--request-timeout",
        "10",
        "--workers",
        "1",
        "--report-dir",
        str(tmp_path),
    ]
    for path in STREAMS:
        argv += ["--exclude-path", path]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=280, cwd=tmp_path)
    report = done.stdout[-20000:] + done.stderr[-5000:]
    assert done.returncode == 0, report
    operations = len(DOCUMENT_OPERATIONS)
    assert f"Selected: {operations - len(STREAMS)}/{operations}" in done.stdout, report
    assert " passed" in done.stdout and "failed" not in done.stdout, report
