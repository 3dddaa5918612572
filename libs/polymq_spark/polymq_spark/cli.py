"""``polymq spark-push``: push a Parquet, CSV or JSON file to a polymq destination through a
local Spark (``local[*]``) and format ``"polymq"``; prints a JSON summary on stdout.

::

    python -m polymq_spark.cli --input data.parquet --destination stream/x \\
        --url http://127.0.0.1:8083 [--batch-size N] [--format parquet|csv|json]

CSV is read with a header line and inferred column types; JSON as JSON lines. Exit status:
0 when every row was accepted, 1 when the write failed (the reason on stderr), 2 for a usage
error (bad arguments or options, found before Spark starts).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import OptionError
from .options import CODECS, parse_options

__all__ = ["build_parser", "main"]

FORMATS = ("parquet", "csv", "json")
_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".json": "json"}
_SUFFIXES |= {".jsonl": "json", ".ndjson": "json"}


def build_parser(prog: str = "polymq spark-push") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("--input", required=True, help="a file, a directory of files or a glob")
    p.add_argument(
        "--destination", required=True, help="queue/<name>, topic/<name> or stream/<name>"
    )
    p.add_argument("--url", required=True, help="the Avro frontend, e.g. http://127.0.0.1:8083")
    p.add_argument(
        "--format", choices=FORMATS, help="the input's format (default: from its suffix)"
    )
    p.add_argument("--batch-size", type=int, help="rows per POST (default 5000)")
    p.add_argument("--codec", choices=CODECS, help="Avro container codec (default deflate)")
    persistence = p.add_mutually_exclusive_group()
    persistence.add_argument("--persistent", dest="persistent", action="store_const", const="true")
    persistence.add_argument("--transient", dest="persistent", action="store_const", const="false")
    p.add_argument("--subject", help="schema registry subject")
    p.add_argument(
        "--token",
        default=os.environ.get("POLYMQ_SPARK_TOKEN"),
        help="Bearer token (default: $POLYMQ_SPARK_TOKEN)",
    )
    p.add_argument("--user", help="HTTP Basic user")
    p.add_argument(
        "--password",
        default=os.environ.get("POLYMQ_SPARK_PASSWORD"),
        help="HTTP Basic password (default: $POLYMQ_SPARK_PASSWORD)",
    )
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other write option of format polymq (repeatable)",
    )
    return p


def _options(args: argparse.Namespace) -> dict[str, str]:
    opts: dict[str, str] = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise OptionError(item, "--option takes KEY=VALUE")
        opts[key] = value
    given = {
        "url": args.url,
        "destination": args.destination,
        "batchSize": None if args.batch_size is None else str(args.batch_size),
        "codec": args.codec,
        "persistent": args.persistent,
        "subject": args.subject,
        "token": args.token,
        "user": args.user,
        "password": args.password if args.user is not None else None,
    }
    opts.update({k: v for k, v in given.items() if v is not None})
    return opts


def _format(args: argparse.Namespace) -> str:
    if args.format:
        return str(args.format)
    found = _SUFFIXES.get(Path(args.input.rstrip("/")).suffix.lower())
    if found is None:
        raise OptionError("format", f"cannot tell the format of {args.input!r}: give --format")
    return found


def _error_line(exc: BaseException) -> str:
    """Our own error's message out of Spark's wrapping (a Python traceback in a Java one)."""
    text = str(exc)
    for line in text.splitlines():
        if "polymq_spark.errors." in line:
            return line.strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def main(argv: Sequence[str] | None = None, prog: str = "polymq spark-push") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        fmt = _format(args)
        options = _options(args)
        parse_options(options)  # bad options fail here, before Spark's ~7 s start-up
    except OptionError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    has_glob = any(c in args.input for c in "*?[")
    if "://" not in args.input and not has_glob and not Path(args.input).exists():
        print(f"{prog}: error: {args.input}: no such file or directory", file=sys.stderr)
        return 2

    from .session import local_session  # Spark only from here on

    with tempfile.TemporaryDirectory(prefix="polymq-spark-push-") as tmp:
        summary_file = Path(tmp) / "summary.jsonl"
        options["summaryFile"] = str(summary_file)
        t0 = time.monotonic()
        spark = local_session(args.master, app_name="polymq spark-push")
        try:
            reader = spark.read.format(fmt)
            if fmt == "csv":
                reader = reader.option("header", "true").option("inferSchema", "true")
            df = reader.load(args.input)
            t1 = time.monotonic()
            df.write.format("polymq").options(**options).mode("append").save()
            t2 = time.monotonic()
        except Exception as exc:
            print(f"{prog}: error: {_error_line(exc)}", file=sys.stderr)
            return 1
        finally:
            spark.stop()
        events = [json.loads(ln) for ln in summary_file.read_text().splitlines() if ln]
    commit = next((e for e in reversed(events) if e.get("event") == "commit"), None)
    if commit is None:
        print(f"{prog}: error: the write finished without a commit", file=sys.stderr)
        return 1
    write_seconds = t2 - t1
    out: dict[str, Any] = {
        "input": args.input,
        "format": fmt,
        "url": args.url,
        "destination": commit["destination"],
        "rows": commit["rows"],
        "batches": commit["batches"],
        "duplicates": commit["duplicates"],
        "retries": commit["retries"],
        "bytes": commit["bytes"],
        "tasks": commit["tasks"],
        "write_id": commit["write_id"],
        "schema_ids": commit["schema_ids"],
        "write_seconds": round(write_seconds, 3),
        "total_seconds": round(time.monotonic() - t0, 3),
        "rows_per_second": round(commit["rows"] / write_seconds, 1) if write_seconds else None,
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m polymq_spark.cli"))
