"""Decode throughput of the STOMP codec: ``python -m tests.unit.stomp.bench_codec``.

100k SEND frames (4 headers, a 32-byte body), as stomp.py writes them, fed to a server
connection in 64 KiB chunks; prints frames/s (best of a few runs). Not a test: performance is
read from runs, never asserted by a timed test.
"""

from __future__ import annotations

import argparse
import time

from polymq_stomp.codec import NEED_DATA, Role, StompConnection
from polymq_stomp.frames import Command, Frame


def open_server(version: str) -> StompConnection:
    conn = StompConnection(Role.SERVER)
    conn.receive_data(b"CONNECT\naccept-version:%s\nhost:/\n\n\0" % version.encode())
    conn.next_event()
    conn.send(Frame(Command.CONNECTED, (("version", version),)))
    conn.negotiate(version)
    return conn


def stream(frames: int, escaped: bool) -> bytes:
    dest = "/queue/bench\\cq" if escaped else "/queue/bench"
    one = (
        f"SEND\ndestination:{dest}\ncontent-type:text/plain\ncontent-length:32\n"
        "receipt:r-1\n\n".encode()
        + b"x" * 32
        + b"\0"
    )
    return one * frames


def run(data: bytes, chunk: int, version: str) -> tuple[int, float]:
    conn = open_server(version)
    n = 0
    t0 = time.perf_counter()
    for i in range(0, len(data), chunk):
        conn.receive_data(data[i : i + chunk])
        while conn.next_event() is not NEED_DATA:
            n += 1
    return n, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--frames", type=int, default=100_000)
    ap.add_argument("--chunk", type=int, default=64 * 1024)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--version", default="1.2")
    ap.add_argument("--escaped", action="store_true", help="a header needing unescaping")
    args = ap.parse_args()
    data = stream(args.frames, args.escaped)
    best = min(run(data, args.chunk, args.version)[1] for _ in range(args.runs))
    n, _ = run(data, args.chunk, args.version)
    assert n == args.frames, n
    print(
        f"{n} SEND frames ({len(data) // n} bytes each, STOMP {args.version}, "
        f"{'escaped' if args.escaped else 'plain'}) in {args.chunk}-byte chunks: "
        f"{best:.3f} s, {n / best:,.0f} frames/s, {len(data) / best / 1e6:.1f} MB/s"
    )


if __name__ == "__main__":
    main()
