"""Profiles the process it is loaded into, when ``POLYMQ_BENCH_PROFILE`` names a file.

``bench`` puts this directory first on the broker's ``PYTHONPATH`` for ``--profile``, so
the unmodified ``polymq`` command runs under :mod:`cProfile` (main thread, i.e. the event
loop) and dumps pstats at a normal exit (the bench stops the broker with SIGTERM, which
polymq handles gracefully).

A scenario may narrow the profile to what it measures (:meth:`bench.harness.Broker.
profile_window`): SIGUSR1 forgets what was gathered so far (the set-up), SIGUSR2 stops
gathering (the tear-down is left out too) and writes the profile at once.
"""

from __future__ import annotations

import os

_path = os.environ.get("POLYMQ_BENCH_PROFILE")
if _path is not None:
    import atexit
    import cProfile
    import signal
    from typing import Any

    _prof = cProfile.Profile()

    def _dump(path: str = _path) -> None:
        _prof.disable()
        _prof.dump_stats(path)

    def _restart(_signo: int, _frame: Any) -> None:
        _prof.disable()
        _prof.clear()
        _prof.enable()

    def _halt(_signo: int, _frame: Any) -> None:
        _dump()  # now: a broker slow to stop is killed before its atexit

    signal.signal(signal.SIGUSR1, _restart)
    signal.signal(signal.SIGUSR2, _halt)
    atexit.register(_dump)
    _prof.enable()
