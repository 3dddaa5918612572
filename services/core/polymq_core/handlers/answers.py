"""What the core's request handlers answer (see :mod:`polymq_core.broker`): a plain result
(sent as ``Ok``), an ``Event``, or an awaitable of either, which the session sends once it
resolves (a persistent publish waits for its commit; a pull may wait for messages).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


async def then(fut: Awaitable[Any], result: Any) -> Any:
    """``result``, once ``fut`` (a durable change, usually) has resolved.

    Shielded: the session cancels what it still waits to answer when its connection closes,
    and that must stop only the waiting. Others act on ``fut`` too (a queue enqueues a
    publish once its write is done, and takes a cancelled write for a failed one)."""
    await asyncio.shield(fut)
    return result
