"""``polymq cluster list``: the nodes of a cluster, as one node's admin API sees them;
``polymq cluster reload``: a configuration change applied on every node without a restart.

::

    polymq cluster list [--admin URL] [--timeout S] [--json]
    polymq cluster reload [--admin URL] [--level LEVEL] [--users] [--limit NAME=VALUE ...]
                          [--secret S]

``list`` asks ``GET {admin}/api/cluster`` (``{"nodes": [...]}``, one object per node as
``Membership.describe`` gives them; with the cluster secret, ``POLYMQ_CLUSTER_SECRET``, as
bearer token when the environment has it: a core run with ``--auth`` asks for a login) and
prints a table (with the configuration version each node applied last), or the JSON with
``--json``. ``reload`` posts
``{"log_level"?, "users"?, "limits"?}`` to ``{admin}/api/config/reload`` (with the
cluster secret, ``POLYMQ_CLUSTER_SECRET``, as bearer token) and prints the reload's version;
every core node applies it, and every frontend connected to one (:mod:`polymq_server.reload`).
Exit 1 when the admin API cannot be reached or does not answer 200 with that JSON, or the
node at ``--admin`` could not apply all of it; 2 for arguments that say nothing to change.
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

from polymq_server.reload import LEVELS, LIMITS

__all__ = ["add_arguments", "fetch_nodes", "format_table", "run", "send_reload"]

DEFAULT_ADMIN = "http://127.0.0.1:7401"
_COLUMNS = ("ID", "STATE", "SHARDS LED", "LAST HEARD", "CONFIG", "ADMIN URL", "CORE")


class ClusterCommandError(Exception):
    """What to tell the user before exiting 1."""


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``cluster`` (with its ``list`` and ``reload`` sub-commands) to ``polymq``'s."""
    cluster = sub.add_parser("cluster", help="look at the nodes of a replicated core")
    commands = cluster.add_subparsers(dest="cluster_command", required=True)
    ls = commands.add_parser(
        "list",
        help="the nodes, their state and the shards each leads",
        description="List the nodes of the cluster as the node at --admin sees them.",
    )
    _common(ls)
    ls.add_argument("--json", action="store_true", help="print the JSON the node answers")
    _secret(ls)
    rl = commands.add_parser(
        "reload",
        help="apply a configuration change on every node, without a restart",
        description="Broadcast a reload through the node at --admin: every node applies it.",
    )
    _common(rl)
    rl.add_argument("--level", choices=LEVELS, help="the nodes' new log level")
    rl.add_argument(
        "--users",
        action="store_true",
        help="re-read the users file (POLYMQ_AUTH) on every node and frontend",
    )
    rl.add_argument(
        "--limit",
        action="append",
        default=[],
        type=_limit,
        metavar="NAME=VALUE",
        help=f"a core limit to set ({', '.join(LIMITS)}); repeat for more",
    )
    _secret(rl)


def _secret(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--secret",
        default=os.environ.get("POLYMQ_CLUSTER_SECRET", ""),
        help="the cluster secret (POLYMQ_CLUSTER_SECRET)",
    )


def _limit(text: str) -> tuple[str, int | float]:
    """``NAME=VALUE`` of ``--limit``, with the value as a number."""
    name, _, value = text.partition("=")
    if name not in LIMITS or not value:
        raise argparse.ArgumentTypeError(f"NAME=VALUE, NAME one of {', '.join(LIMITS)}")
    try:
        return name, int(value)
    except ValueError:
        pass
    try:
        return name, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name}: {value!r} is not a number") from None


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--admin",
        default=os.environ.get("POLYMQ_ADMIN_URL", DEFAULT_ADMIN),
        metavar="URL",
        help=f"a node's admin URL (POLYMQ_ADMIN_URL; default {DEFAULT_ADMIN})",
    )
    parser.add_argument(
        "--timeout", type=float, default=5.0, metavar="S", help="seconds to wait (5)"
    )
    parser.add_argument("--log-level", default=os.environ.get("POLYMQ_LOG_LEVEL", "WARNING"))


def _admin_url(text: str) -> str:
    url = text.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url


def fetch_nodes(admin: str, timeout: float, secret: str = "") -> dict[str, Any]:
    """``GET {admin}/api/cluster`` (``secret``: the cluster secret, sent as bearer token
    when given); ``ClusterCommandError`` saying what went wrong."""
    url = _admin_url(admin) + "/api/cluster"
    headers = {"Accept": "application/json"}
    if secret:
        headers["Authorization"] = f"Bearer {secret}"
    answer = _call(urllib.request.Request(url, headers=headers), timeout)
    if not isinstance(answer.get("nodes"), list):
        raise ClusterCommandError(f"{url} did not answer a list of nodes")
    return answer


def send_reload(admin: str, change: dict[str, Any], secret: str, timeout: float) -> dict[str, Any]:
    """``POST {admin}/api/config/reload``: the answer (``version``, ``error``)."""
    url = _admin_url(admin) + "/api/config/reload"
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if secret:
        headers["Authorization"] = f"Bearer {secret}"
    data = json.dumps(change).encode()
    return _call(urllib.request.Request(url, data=data, headers=headers), timeout)


def _call(request: urllib.request.Request, timeout: float) -> dict[str, Any]:
    url = request.full_url
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
    if not isinstance(answer, dict):
        raise ClusterCommandError(f"{url} did not answer a JSON object")
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
    if column == "CONFIG":
        version = node.get("config_version")
        return str(version) if isinstance(version, int) and version else "-"
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
    if args.cluster_command == "reload":
        return _reload(args, out, err)
    if args.cluster_command != "list":  # argparse allows only "list" and "reload"
        print(f"polymq cluster: unknown command {args.cluster_command!r}", file=err)
        return 2
    try:
        answer = fetch_nodes(args.admin, args.timeout, args.secret)
    except ClusterCommandError as exc:
        print(f"polymq cluster list: {exc}", file=err)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2, sort_keys=True), file=out)
    else:
        nodes = [n for n in answer["nodes"] if isinstance(n, dict)]
        print(format_table(nodes), file=out)
    return 0


def _reload(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    change: dict[str, Any] = {}
    if args.level:
        change["log_level"] = args.level
    if args.users:
        change["users"] = True
    if args.limit:
        change["limits"] = dict(args.limit)
    if not change:
        print("polymq cluster reload: nothing to change (--level, --users, --limit)", file=err)
        return 2
    try:
        answer = send_reload(args.admin, change, args.secret, args.timeout)
    except ClusterCommandError as exc:
        print(f"polymq cluster reload: {exc}", file=err)
        return 1
    print(f"configuration {answer.get('version')} sent to every node", file=out)
    if answer.get("error"):
        print(f"polymq cluster reload: on {args.admin}: {answer['error']}", file=err)
        return 1
    return 0
