"""The client distribution (``libs/polymq/pyproject.toml``, ``polymq-client``) declares every
third-party module its package imports, and that is only what the wire needs."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import polymq

PACKAGE = Path(polymq.__file__).parent
PROJECT = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text("utf-8"))["project"]


def third_party_imports() -> dict[str, set[str]]:
    """Top-level modules outside the standard library that the package imports (anywhere in
    a module, under ``TYPE_CHECKING`` too), each with the modules that import it."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                if top not in sys.stdlib_module_names and top != "polymq":
                    found.setdefault(top, set()).add(path.name)
    return found


def test_every_third_party_import_is_a_declared_dependency() -> None:
    declared = {re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0] for req in PROJECT["dependencies"]}
    assert set(third_party_imports()) == declared == {"msgpack"}


def test_the_distribution_is_the_client() -> None:
    assert PROJECT["name"] == "polymq-client"
    assert PROJECT["version"] == polymq.__version__
