"""Profiles the process it is loaded into, when ``POLYMQ_BENCH_PROFILE`` names a file.

``bench`` puts this directory first on the broker's ``PYTHONPATH`` for ``--profile``, so
the unmodified ``polymq`` command runs under :mod:`cProfile` (main thread, i.e. the event
loop) and dumps pstats at a normal exit (the bench stops the broker with SIGTERM, which
polymq handles gracefully).
"""

from __future__ import annotations

import os

_path = os.environ.get("POLYMQ_BENCH_PROFILE")
if _path is not None:
    import atexit
    import cProfile

    _prof = cProfile.Profile()

    def _dump(path: str = _path) -> None:
        _prof.disable()
        _prof.dump_stats(path)

    atexit.register(_dump)
    _prof.enable()
