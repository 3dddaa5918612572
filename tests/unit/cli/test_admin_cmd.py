"""polymq_cli.admin_cmd without sockets: its tables and argument checks."""

from __future__ import annotations

import pytest

from polymq_cli.admin_cmd import AdminError, _destination_rows, _path, format_rows
from polymq_cli.main import _parser


def test_destinations_table_aligns_its_columns() -> None:
    rows = _destination_rows(
        [
            {"destination": "queue/orders", "ready": 12, "unacked": 3, "consumers": 1,
             "publish_rate": 2.25, "deliver_rate": 0},
            {"destination": "stream/s", "ready": 0},
        ]
    )  # fmt: skip
    table = format_rows(("DESTINATION", "READY", "UNACKED", "CONSUMERS", "PUB", "DEL"), rows)
    assert table.splitlines() == [
        "DESTINATION   READY  UNACKED  CONSUMERS  PUB  DEL",
        "queue/orders  12     3        1          2.2  0.0",
        "stream/s      0      0        0          -    -",
    ]


def test_a_destination_is_kind_slash_name_and_quoted_in_the_path() -> None:
    assert _path("queue/a:b") == "/api/destinations/queue/a%3Ab"
    for bad in ("orders", "/orders", "queue/"):
        with pytest.raises(AdminError, match="kind/name"):
            _path(bad)


def test_the_commands_parse() -> None:
    args = _parser().parse_args(["publish", "queue/q", "hi", "--header", "a=b", "--priority", "3"])
    assert (args.command, args.destination, args.header, args.priority) == (
        "publish",
        "queue/q",
        [("a", "b")],
        3,
    )
    with pytest.raises(SystemExit):
        _parser().parse_args(["publish", "queue/q", "hi", "--header", "novalue"])
