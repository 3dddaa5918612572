"""``python -m`` on this folder (the command as it was before the folders): the users file's
command line, :func:`polymq_server.auth.provider.main` (``hash-password``, ``new-token``)."""

from __future__ import annotations

import sys

from .provider import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
