"""What the core's request handlers answer (see :mod:`polymq_core.broker`): a plain result
(sent as ``Ok``), an ``Event``, or an awaitable of either, which the session sends once it
resolves (a persistent publish waits for its commit; a pull may wait for messages).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any


async def then(fut: Awaitable[Any], result: Any) -> Any:
    """``result``, once ``fut`` (a durable change, usually) has resolved."""
    await fut
    return result
