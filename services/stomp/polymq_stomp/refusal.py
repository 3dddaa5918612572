"""The one error the session's handlers raise to refuse a frame.

:class:`Refused` is a :class:`~polymq_stomp.frames.RemoteStompError` (the client's frame is
at fault: answer with an ERROR frame carrying ``message`` and ``detail``, then close) that
also says why in one word, ``reason``, the label of ``polymq_stomp_errors_total``
(:data:`polymq_stomp.metrics.REASONS`).
"""

from __future__ import annotations

from .frames import RemoteStompError

__all__ = ["Refused"]


class Refused(RemoteStompError):
    def __init__(self, reason: str, message: str, detail: str = "") -> None:
        super().__init__(message, detail)
        self.reason = reason
