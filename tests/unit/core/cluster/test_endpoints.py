"""polymq_core.cluster.endpoints.members_of: which pods the Service's EndpointSlices name, and
whether they are ready (no server here: the slices are the client's own model objects)."""

from __future__ import annotations

from kubernetes import client

from polymq_core.cluster.endpoints import (
    ADMIN_PORT,
    CLUSTER_PORT,
    SERVICE_LABEL,
    Member,
    members_of,
)


def endpoint_slice(
    name: str,
    *endpoints: client.V1Endpoint,
    service: str = "core",
    ports: dict[str, int] | None = None,
) -> object:
    return client.V1EndpointSlice(
        address_type="IPv4",
        metadata=client.V1ObjectMeta(name=name, labels={SERVICE_LABEL: service}),
        endpoints=list(endpoints),
        ports=[client.DiscoveryV1EndpointPort(name=n, port=p) for n, p in (ports or {}).items()],
    )


def endpoint(
    address: str | None,
    pod: str | None = None,
    ready: bool | None = True,
    hostname: str | None = None,
) -> client.V1Endpoint:
    return client.V1Endpoint(
        addresses=[address] if address else [],
        conditions=client.V1EndpointConditions(ready=ready),
        target_ref=client.V1ObjectReference(kind="Pod", name=pod) if pod else None,
        hostname=hostname,
    )


def test_pods_by_name_with_their_address_and_readiness() -> None:
    slices = {
        "a": endpoint_slice("a", endpoint("10.0.0.10", "core-0", ready=False)),
        "b": endpoint_slice(
            "b",
            endpoint("10.0.0.10", "core-0", ready=True),  # the same pod, ready in another slice
            endpoint("10.0.0.11", "core-1", ready=None),  # unknown counts as ready
            endpoint("10.0.0.12", "core-2", ready=False),
        ),
        "c": endpoint_slice("c", endpoint("10.0.0.13", hostname="core-3")),
        "d": endpoint_slice("d", endpoint("10.0.0.14"), endpoint(None, "core-9")),
        "web": endpoint_slice("web", endpoint("10.0.9.9", "web-0"), service="web"),
    }
    assert members_of(slices, "core") == {
        "core-0": Member("core-0", "10.0.0.10", True),
        "core-1": Member("core-1", "10.0.0.11", True),
        "core-2": Member("core-2", "10.0.0.12", False),
        "core-3": Member("core-3", "10.0.0.13", True),
        "10.0.0.14": Member("10.0.0.14", "10.0.0.14", True),
    }
    assert members_of({}, "core") == {}


def test_a_pods_cluster_and_admin_ports_are_the_ones_its_slice_names_so() -> None:
    """One slice per port set (as the EndpointSlice controller groups them): pods on one
    machine, each with a cluster port of its own, come in slices of their own."""
    slices = {
        "a": endpoint_slice(
            "a",
            endpoint("127.0.0.1", "core-0"),
            ports={"wire": 7400, CLUSTER_PORT: 17422, ADMIN_PORT: 17401},
        ),
        "b": endpoint_slice("b", endpoint("127.0.0.1", "core-1"), ports={CLUSTER_PORT: 17423}),
        "c": endpoint_slice("c", endpoint("10.0.0.12", "core-2"), ports={"wire": 7400}),
    }
    assert members_of(slices, "core") == {
        "core-0": Member("core-0", "127.0.0.1", True, 17422, 17401),
        "core-1": Member("core-1", "127.0.0.1", True, 17423, None),
        "core-2": Member("core-2", "10.0.0.12", True, None),  # no such port: the caller's own
    }
