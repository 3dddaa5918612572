"""Every module of polymq_server says what it exports (``__all__``), as the client's do
(``tests/unit/polymq/test_exports.py``)."""

from __future__ import annotations

import pkgutil

import pytest

import polymq_server

from ..polymq.test_exports import check_all_is_accurate, unlisted

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(polymq_server.__path__, "polymq_server.")
    if not m.ispkg  # a folder's __init__ is its docstring
)

# Public-looking functions a module defines but leaves out of its ``__all__``, each pinned so
# that a new one is a decision, not an accident.
KNOWN_UNLISTED: dict[str, set[str]] = {
    "polymq_server.auth.provider": {"main"},  # ``python -m polymq_server.auth.provider``
}


@pytest.mark.parametrize("module_name", MODULES)
def test_module_all_is_accurate(module_name: str) -> None:
    check_all_is_accurate(module_name)


@pytest.mark.parametrize("module_name", MODULES)
def test_module_defines_what_it_exports_or_imports_it_on_purpose(module_name: str) -> None:
    assert unlisted(module_name) == KNOWN_UNLISTED.get(module_name, set())
