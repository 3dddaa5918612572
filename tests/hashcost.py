"""One fixture: tests' own password hashes at a cheaper scrypt cost."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from polymq_server.auth import passwords


@pytest.fixture(scope="module", autouse=True)
def cheap_password_hashes() -> Iterator[None]:
    """The users files that tests write hash their passwords at scrypt's N=2^14 instead of
    the shipped N=2^17 (OWASP's): a server checks a hash at the cost it names, so every
    password login of a test then costs an eighth. Imported, as an autouse fixture, by the
    conftest of the folders whose tests start servers; the shipped cost is tested where
    hashes are made by the CLI (tests/integration/cross/test_login_guards.py) and in
    tests/unit/polymq_server/test_auth.py, which this does not reach."""
    shipped = passwords.DEFAULT_COST
    passwords.DEFAULT_COST = 2**14
    try:
        yield
    finally:
        passwords.DEFAULT_COST = shipped
