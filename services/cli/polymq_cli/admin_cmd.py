"""The operator's commands, clients of a core node's admin API (docs/admin-api.md)::

    polymq destinations list [--kind K] [--q TEXT] [--sort FIELD [--desc]] [--limit N] [--json]
    polymq connections list [--all] [--json]
    polymq connections close ID
    polymq peek DESTINATION [--count N] [--json]
    polymq publish DESTINATION BODY|- [--content-type T] [--header K=V ...] [--priority P]
                   [--persistent] [--json]
    polymq purge DESTINATION
    polymq consume DESTINATION [--count N] [--core HOST:PORT] [--json]

Each takes ``--admin URL`` (``POLYMQ_ADMIN_URL``, default the local node's), ``--user`` and
``--password`` (``POLYMQ_ADMIN_USER``/``POLYMQ_ADMIN_PASSWORD``: a login with a management
tag, when the core runs with ``--auth``) or ``--token`` (``POLYMQ_ADMIN_TOKEN``), and
``--timeout``. Without a login they log in with the cluster secret, ``POLYMQ_CLUSTER_SECRET``,
when the environment has it, as the nodes do (it is a token of polymq's own, an administrator
on every node of the cluster that shares it). Tables by default, the API's JSON with
``--json``. ``consume`` takes messages (the admin API only looks at them): it is a
wire-protocol client of the core at ``--core``, logged in the same way, that acks each
message once printed.

``connections list`` hides polymq's own links (the frontends' and peers' links to the core,
logged in as ``polymq-internal``), as the console's Connections page does, and says how many
it hid; ``--all`` lists them too (in the table and in ``--json``'s ``connections``).

Exit codes: 0 done; 1 the API (or core) refused or could not be reached, said on stderr
with its problem's detail; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any, TextIO

from polymq_server.auth.principals import INTERNAL_PRINCIPAL

__all__ = ["AdminError", "add_arguments", "format_rows", "run"]

DEFAULT_ADMIN = "http://127.0.0.1:7401"
DEFAULT_CORE = "127.0.0.1:7400"
COMMANDS = ("destinations", "connections", "peek", "publish", "purge", "consume")
_DEST_COLUMNS = ("DESTINATION", "READY", "UNACKED", "CONSUMERS", "PUBLISH/S", "DELIVER/S")
_CONN_COLUMNS = ("ID", "PROTOCOL", "PEER", "USER", "NODE", "SUBS", "IN", "OUT")
_MSG_COLUMNS = ("SEQ", "PRIORITY", "CONTENT TYPE", "BODY")


class AdminError(Exception):
    """What to tell the user before exiting 1."""


# ---- arguments ------------------------------------------------------------------------------
def _common(parser: argparse.ArgumentParser, *, json_flag: bool = True) -> None:
    env = os.environ.get
    parser.add_argument(
        "--admin",
        default=env("POLYMQ_ADMIN_URL", DEFAULT_ADMIN),
        metavar="URL",
        help=f"a core node's admin URL (POLYMQ_ADMIN_URL; default {DEFAULT_ADMIN})",
    )
    parser.add_argument("--user", default=env("POLYMQ_ADMIN_USER"), help="(POLYMQ_ADMIN_USER)")
    parser.add_argument(
        "--password", default=env("POLYMQ_ADMIN_PASSWORD"), help="(POLYMQ_ADMIN_PASSWORD)"
    )
    parser.add_argument("--token", default=env("POLYMQ_ADMIN_TOKEN"), help="(POLYMQ_ADMIN_TOKEN)")
    parser.add_argument(
        "--timeout", type=float, default=10.0, metavar="S", help="seconds to wait (10)"
    )
    parser.add_argument("--log-level", default=env("POLYMQ_LOG_LEVEL", "WARNING"))
    if json_flag:
        parser.add_argument("--json", action="store_true", help="print the API's JSON")


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError("a header is NAME=VALUE")
    return name, value


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``destinations``, ``connections``, ``peek``, ``publish``, ``purge`` and
    ``consume`` to ``polymq``'s sub-commands."""
    dest = sub.add_parser("destinations", help="the core's destinations (admin API)")
    dest_cmds = dest.add_subparsers(dest="admin_command", required=True)
    ls = dest_cmds.add_parser("list", help="queues, streams, channels: depths and rates")
    _common(ls)
    ls.add_argument("--kind", choices=("queue", "topic", "stream", "channel"))
    ls.add_argument("--q", metavar="TEXT", help="only names that contain TEXT")
    ls.add_argument(
        "--sort",
        choices=(
            "name",
            "ready",
            "unacked",
            "consumers",
            "-name",
            "-ready",
            "-unacked",
            "-consumers",
        ),
        metavar="FIELD",
        help="name, ready, unacked or consumers (--sort=-ready, or --desc: descending)",
    )
    ls.add_argument("--desc", action="store_true", help="sort descending")
    ls.add_argument("--limit", type=int, metavar="N", help="at most N (500)")
    conns = sub.add_parser("connections", help="every frontend's client connections")
    conn_cmds = conns.add_subparsers(dest="admin_command", required=True)
    conn_ls = conn_cmds.add_parser("list", help="protocol, peer, user and counters of each")
    _common(conn_ls)
    conn_ls.add_argument(
        "--all",
        action="store_true",
        help="polymq's own links too (frontends', peers'), which are hidden by default",
    )
    close = conn_cmds.add_parser("close", help="close one with its protocol's close")
    _common(close, json_flag=False)
    close.add_argument("id", help="the connection's id (from connections list)")
    peek = sub.add_parser("peek", help="look at a queue's first (a stream's last) messages")
    _common(peek)
    peek.add_argument("destination", help="kind/name, e.g. queue/orders")
    peek.add_argument("--count", type=int, default=10, metavar="N", help="1..100 (10)")
    pub = sub.add_parser("publish", help="publish one message through the admin API")
    _common(pub)
    pub.add_argument("destination", help="kind/name, e.g. queue/orders")
    pub.add_argument("body", help="the message's body; - reads it from stdin")
    pub.add_argument("--content-type", default=None)
    pub.add_argument("--header", type=_header, action="append", default=[], metavar="K=V")
    pub.add_argument("--priority", type=int, default=None, metavar="0..9")
    pub.add_argument("--persistent", action="store_true")
    purge = sub.add_parser("purge", help="drop a queue's (a stream's) messages")
    _common(purge)
    purge.add_argument("destination", help="kind/name, e.g. queue/orders")
    consume = sub.add_parser("consume", help="take messages (a wire client of the core)")
    _common(consume)
    consume.add_argument("destination", help="kind/name, e.g. queue/orders")
    consume.add_argument("--count", type=int, default=1, metavar="N", help="how many (1)")
    consume.add_argument(
        "--core",
        default=os.environ.get("POLYMQ_CORE", DEFAULT_CORE),
        metavar="HOST:PORT",
        help=f"the core's wire port (POLYMQ_CORE; default {DEFAULT_CORE})",
    )


# ---- the API --------------------------------------------------------------------------------
class _Api:
    def __init__(self, args: argparse.Namespace) -> None:
        url = str(args.admin).strip().rstrip("/")
        self.base = url if "://" in url else "http://" + url
        self.timeout = float(args.timeout)
        self.headers = {"Accept": "application/json"}
        token = _token(args)
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        elif args.user:
            pair = f"{args.user}:{args.password or ''}".encode()
            self.headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()

    def call(self, method: str, path: str, body: Any = None) -> Any:
        url = self.base + path
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise AdminError(_refusal(url, exc)) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise AdminError(
                f"cannot reach the admin API at {self.base}: {reason} (is the core running, "
                "and is --admin its admin port?)"
            ) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise AdminError(f"{url} did not answer JSON") from None


def _token(args: argparse.Namespace) -> str | None:
    """``--token``; without a login, the cluster secret of the environment, if any."""
    if args.token or args.user:
        return str(args.token) if args.token else None
    return os.environ.get("POLYMQ_CLUSTER_SECRET") or None


def _refusal(url: str, exc: urllib.error.HTTPError) -> str:
    text = exc.read(2000).decode(errors="replace")
    try:
        detail = json.loads(text).get("detail") or text
    except (ValueError, AttributeError):
        detail = text.strip()
    hint = ""
    if exc.code == 401:
        hint = (
            " (log in: --user/--password or --token, a user with a management tag; or"
            " export the cluster's POLYMQ_CLUSTER_SECRET)"
        )
    elif exc.code == 403:
        hint = " (this needs a user with the tag administrator, or monitoring to read)"
    return f"HTTP {exc.code} from {url}: {detail}{hint}"


def _path(destination: str) -> str:
    kind, sep, name = destination.partition("/")
    if not sep or not kind or not name:
        raise AdminError(f"{destination!r}: a destination is kind/name, e.g. queue/orders")
    return f"/api/destinations/{urllib.parse.quote(kind)}/{urllib.parse.quote(name)}"


# ---- output ---------------------------------------------------------------------------------
def format_rows(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Aligned columns under their headings."""
    table = [list(columns), *[list(r) for r in rows]]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table]
    return "\n".join(line.rstrip() for line in lines)


def _rate(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else "-"


def _destination_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            str(d.get("destination")),
            str(d.get("ready", 0)),
            str(d.get("unacked", 0)),
            str(d.get("consumers", 0)),
            _rate(d.get("publish_rate")),
            _rate(d.get("deliver_rate")),
        ]
        for d in rows
    ]


def _connection_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            str(c.get("id")),
            str(c.get("protocol")),
            str(c.get("peer")),
            str(c.get("user") or "-"),
            str(c.get("node") or "-"),
            str(c.get("subscriptions", 0)),
            str(c.get("messages_in", 0)),
            str(c.get("messages_out", 0)),
        ]
        for c in rows
    ]


def _body(m: dict[str, Any], width: int = 60) -> str:
    text = m["body"] if "body" in m else f"base64:{m.get('body_base64', '')}"
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def _message_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [str(m.get("seq")), str(m.get("priority")), str(m.get("content_type")), _body(m)]
        for m in rows
    ]


# ---- the commands -----------------------------------------------------------------------------
def _publish_body(args: argparse.Namespace, stdin: TextIO) -> dict[str, Any]:
    text = stdin.read() if args.body == "-" else args.body
    body: dict[str, Any] = {"body": text}
    if args.content_type:
        body["content_type"] = args.content_type
    if args.header:
        body["headers"] = dict(args.header)
    if args.priority is not None:
        body["priority"] = args.priority
    if args.persistent:
        body["persistent"] = True
    return body


async def _consume(args: argparse.Namespace) -> list[dict[str, Any]]:
    from polymq import Client
    from polymq.errors import PolymqError

    host, _, port = str(args.core).rpartition(":")
    if not host or not port.isdigit():
        raise AdminError(f"--core {args.core!r}: give HOST:PORT")
    try:
        client = await Client.connect(
            host,
            int(port),
            client="polymq-cli",
            user=args.user,
            password=args.password,
            token=_token(args),
            timeout=args.timeout,
        )
    except (PolymqError, OSError, TimeoutError) as exc:
        raise AdminError(f"cannot log in to the core at {args.core}: {exc}") from None
    out: list[dict[str, Any]] = []
    try:
        sub = await client.subscribe(
            args.destination, ack_mode="client-individual", prefetch=args.count
        )
        while len(out) < args.count:
            try:
                delivery = await sub.get(args.timeout)
            except TimeoutError:
                break
            m = delivery.message
            row: dict[str, Any] = {"id": m.id, "seq": m.seq, "priority": m.priority}
            row["content_type"] = m.content_type
            try:
                row["body"] = m.body.decode("utf-8")
            except UnicodeDecodeError:
                row["body_base64"] = base64.b64encode(m.body).decode()
            out.append(row)
            delivery.ack()
        await client.drain()
    except PolymqError as exc:
        raise AdminError(f"{args.destination}: {exc}") from None
    finally:
        await client.close()
    return out


def _dispatch(args: argparse.Namespace, api: _Api, stdin: TextIO) -> tuple[Any, str | None]:
    """The command's JSON, and its table (None: the JSON is what to print)."""
    command = args.command
    if command == "destinations":
        query = {
            k: str(v)
            for k, v in (
                ("kind", args.kind),
                ("q", args.q),
                ("sort", args.sort),
                ("limit", args.limit),
            )
            if v is not None
        }
        if args.desc:
            query["sort"] = "-" + query.get("sort", "name").removeprefix("-")
        answer = api.call("GET", "/api/destinations?" + urllib.parse.urlencode(query))
        return answer, format_rows(_DEST_COLUMNS, _destination_rows(answer["destinations"]))
    if command == "connections" and args.admin_command == "close":
        api.call("DELETE", f"/api/connections/{urllib.parse.quote(args.id)}")
        return None, f"closed {args.id}"
    if command == "connections":
        answer = api.call("GET", "/api/connections")
        silent = [f["id"] for f in answer.get("frontends", []) if not f.get("answered")]
        rows = answer["connections"]
        shown = rows if args.all else [c for c in rows if c.get("user") != INTERNAL_PRINCIPAL]
        table = format_rows(_CONN_COLUMNS, _connection_rows(shown))
        if len(shown) < len(rows):
            table += f"\n({len(rows) - len(shown)} of polymq's own links hidden: --all shows them)"
        if silent:
            table += f"\n(no answer from {', '.join(silent)})"
        return {**answer, "connections": shown}, table
    if command == "peek":
        answer = api.call("GET", f"{_path(args.destination)}/messages?count={args.count}")
        return answer, format_rows(_MSG_COLUMNS, _message_rows(answer["messages"]))
    if command == "publish":
        path = f"{_path(args.destination)}/messages"
        answer = api.call("POST", path, _publish_body(args, stdin))
        seq = f" (seq {answer['seq']})" if "seq" in answer else ""
        return answer, f"published {answer.get('id') or 'to the topic'}{seq}"
    if command == "purge":
        answer = api.call("DELETE", f"{_path(args.destination)}/contents")
        return answer, f"purged {answer['purged']} messages from {args.destination}"
    _path(args.destination)  # consume: the same check of the name
    messages = asyncio.run(_consume(args))
    return {"messages": messages}, format_rows(_MSG_COLUMNS, _message_rows(messages))


def run(
    args: argparse.Namespace,
    out: TextIO | None = None,
    err: TextIO | None = None,
    stdin: TextIO | None = None,
) -> int:
    """Run one of the operator's commands; the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        answer, table = _dispatch(args, _Api(args), stdin or sys.stdin)
    except AdminError as exc:
        print(f"polymq {args.command}: {exc}", file=err)
        return 1
    if getattr(args, "json", False) and answer is not None:
        print(json.dumps(answer, indent=1), file=out)
    elif table is not None:
        print(table, file=out)
    return 0
