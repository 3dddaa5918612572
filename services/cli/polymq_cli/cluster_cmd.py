"""``polymq cluster list``: the nodes of a cluster, as one node's admin API sees them.

::

    polymq cluster list [--admin URL] [--timeout S] [--json]

It asks ``GET {admin}/api/cluster`` (``{"nodes": [...]}``, one object per node as
``Membership.describe`` gives them) and prints a table, or the JSON with ``--json``. Exit 1
when the admin API cannot be reached or does not answer 200 with that JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any, TextIO

__all__ = ["add_arguments", "fetch_nodes", "format_table", "run"]

DEFAULT_ADMIN = "http://127.0.0.1:7401"
_COLUMNS = ("ID", "STATE", "SHARDS LED", "LAST HEARD", "ADMIN URL", "CORE")


class ClusterCommandError(Exception):
    """What to tell the user before exiting 1."""


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``cluster`` (with its ``list`` sub-command) to ``polymq``'s sub-commands."""
    cluster = sub.add_parser("cluster", help="look at the nodes of a replicated core")
    commands = cluster.add_subparsers(dest="cluster_command", required=True)
    ls = commands.add_parser(
        "list",
        help="the nodes, their state and the shards each leads",
        description="List the nodes of the cluster as the node at --admin sees them.",
    )
    ls.add_argument(
        "--admin",
        default=os.environ.get("POLYMQ_ADMIN_URL", DEFAULT_ADMIN),
        metavar="URL",
        help=f"a node's admin URL (POLYMQ_ADMIN_URL; default {DEFAULT_ADMIN})",
    )
    ls.add_argument("--timeout", type=float, default=5.0, metavar="S", help="seconds to wait (5)")
    ls.add_argument("--json", action="store_true", help="print the JSON the node answers")
    ls.add_argument("--log-level", default=os.environ.get("POLYMQ_LOG_LEVEL", "WARNING"))


def _admin_url(text: str) -> str:
    url = text.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url


def fetch_nodes(admin: str, timeout: float) -> dict[str, Any]:
    """``GET {admin}/api/cluster``; ``ClusterCommandError`` saying what went wrong."""
    url = _admin_url(admin) + "/api/cluster"
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read(300).decode(errors="replace").strip()
        raise ClusterCommandError(
            f"{url} answered HTTP {exc.code} {exc.reason}" + (f": {detail}" if detail else "")
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise ClusterCommandError(
            f"cannot reach the admin API at {url}: {reason} (is the node running, and is"
            " --admin its admin port?)"
        ) from None
    if status != 200:
        raise ClusterCommandError(f"{url} answered HTTP {status}")
    try:
        answer = json.loads(body)
    except ValueError:
        raise ClusterCommandError(f"{url} did not answer JSON") from None
    if not isinstance(answer, dict) or not isinstance(answer.get("nodes"), list):
        raise ClusterCommandError(f"{url} did not answer a list of nodes")
    return answer


def _cell(node: dict[str, Any], column: str) -> str:
    if column == "ID":
        ident = str(node.get("id") or node.get("name") or "?")
        return ident + (" *" if node.get("self") else "")
    if column == "STATE":
        return str(node.get("state") or "-")
    if column == "SHARDS LED":
        shards = node.get("shards_led") or []
        return ",".join(str(s) for s in shards) if isinstance(shards, list) and shards else "-"
    if column == "LAST HEARD":
        ago = node.get("last_heard_seconds_ago")
        if isinstance(ago, int | float) and not isinstance(ago, bool):
            return f"{ago:.1f}s ago"
        return "-"
    if column == "ADMIN URL":
        return str(node.get("admin_url") or "-")
    addresses = node.get("addresses")
    core = addresses.get("core") if isinstance(addresses, dict) else None
    return str(core or "-")


def format_table(nodes: Sequence[dict[str, Any]]) -> str:
    """The nodes as aligned columns; this node is marked ``*``."""
    rows = [list(_COLUMNS)] + [[_cell(n, c) for c in _COLUMNS] for n in nodes]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``polymq cluster <command>``; the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    if args.cluster_command != "list":  # argparse allows only "list"
        print(f"polymq cluster: unknown command {args.cluster_command!r}", file=err)
        return 2
    try:
        answer = fetch_nodes(args.admin, args.timeout)
    except ClusterCommandError as exc:
        print(f"polymq cluster list: {exc}", file=err)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2, sort_keys=True), file=out)
    else:
        nodes = [n for n in answer["nodes"] if isinstance(n, dict)]
        print(format_table(nodes), file=out)
    return 0
