"""polymq.addresses: the core's addresses as given (a list, a comma-separated string), a
name expanded to every IP it resolves to, and the back-off between rounds. No sockets: the
resolver is a fake."""

from __future__ import annotations

import pytest

from polymq import Client
from polymq.addresses import Address, Backoff, expand, parse_addresses


def test_a_list_of_host_port_strings() -> None:
    assert parse_addresses(["n1:7400", "n2:7401"]) == [Address("n1", 7400), Address("n2", 7401)]


def test_a_comma_separated_string_and_the_default_port() -> None:
    got = parse_addresses(" n1:7500 , n2,n3 ", default_port=7600)
    assert got == [Address("n1", 7500), Address("n2", 7600), Address("n3", 7600)]
    assert parse_addresses("core") == [Address("core", 7400)]


def test_ipv6_with_and_without_a_port() -> None:
    assert parse_addresses(["[::1]:7401", "::1", "[fe80::1]"]) == [
        Address("::1", 7401),
        Address("::1", 7400),
        Address("fe80::1", 7400),
    ]
    assert str(Address("::1", 7401)) == "[::1]:7401"


def test_duplicates_are_dropped_in_order() -> None:
    assert parse_addresses("b:1,a:1,b:1") == [Address("b", 1), Address("a", 1)]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("", "no core address"),
        ([], "no core address"),
        ("n1:7400,,n2", "an empty address"),
        ("n1:port", "'port' is not a number"),
        ("n1:0", "1..65535"),
        ("n1:70000", "1..65535"),
        (":7400", "no host"),
        ("[::1", "expected [IPv6]:PORT"),
        ([7400], "an address is a 'host:port' string"),
    ],
)
def test_malformed_addresses_are_named(spec: object, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("[", r"\[")):
        parse_addresses(spec)  # type: ignore[arg-type]


async def test_a_name_is_every_ip_it_resolves_to() -> None:
    asked: list[tuple[str, int]] = []

    async def resolve(host: str, port: int) -> list[str]:
        asked.append((host, port))
        return {"core-headless": ["10.0.0.2", "10.0.0.1", "10.0.0.2"]}.get(host, [])

    given = parse_addresses("core-headless:7400,10.0.0.9:7400,10.0.0.1:7400")
    got = await expand(given, resolve)
    assert got == [
        Address("10.0.0.2", 7400, "core-headless"),
        Address("10.0.0.1", 7400, "core-headless"),
        Address("10.0.0.9", 7400),
        Address("10.0.0.1", 7400),
    ]
    assert asked == [("core-headless", 7400)]  # IPs are not looked up
    # TLS checks the name it was given; the logs show both
    assert got[0].server_name == "core-headless"
    assert str(got[0]) == "10.0.0.2:7400 (core-headless)"


async def test_a_name_that_does_not_resolve_stays_and_kept_ones_are_not_looked_up() -> None:
    async def resolve(host: str, port: int) -> list[str]:
        if host == "gone":
            raise OSError("Name or service not known")
        raise AssertionError(f"{host} should not be looked up")

    given = parse_addresses("gone:1,served:2")
    got = await expand(given, resolve, keep=lambda a: a.host == "served")
    assert got == [Address("gone", 1), Address("served", 2)]


def test_backoff_doubles_to_its_cap_with_jitter_and_resets() -> None:
    high = Backoff(0.1, 1.0, rand=lambda: 0.999999)
    assert [round(high.next(), 3) for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    low = Backoff(0.1, 1.0, rand=lambda: 0.0)
    assert [low.next() for _ in range(3)] == [0.05, 0.1, 0.2]  # half, at the least
    low.reset()
    assert low.next() == 0.05


def test_backoff_is_jittered_by_default() -> None:
    b = Backoff(1.0, 1.0)
    delays = {b.next() for _ in range(20)}
    assert len(delays) > 1 and all(0.5 <= d < 1.0 for d in delays)


@pytest.mark.parametrize("bad", [(0.0, 1.0), (2.0, 1.0)])
def test_backoff_refuses_nonsense(bad: tuple[float, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(*bad)


async def test_connect_refuses_malformed_addresses_and_timeouts_before_connecting() -> None:
    with pytest.raises(ValueError, match=r"Client\.connect: 'n1:x': the port 'x' is not a number"):
        await Client.connect(["n1:x"])
    with pytest.raises(ValueError, match="reconnect_timeout must be a positive number"):
        await Client.connect(["n1:7400"], reconnect_timeout=0)
