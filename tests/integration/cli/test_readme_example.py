"""The README's Python example runs as written (a complete script that ends), against a
``polymq run`` whose core port stands in for the README's 7400."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ...procs import PolymqProcess

pytestmark = pytest.mark.timeout(60)

README = Path(__file__).resolve().parents[3] / "README.md"


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
