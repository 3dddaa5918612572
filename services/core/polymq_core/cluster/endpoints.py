"""Cluster members from Kubernetes: the addresses of the core's headless Service, from its
EndpointSlices (``discovery.k8s.io/v1``), listed and then watched with the official
``kubernetes`` client.

:class:`EndpointWatcher` keeps the Service's slices (those labelled
``kubernetes.io/service-name: <service>``) and tells ``on_change`` the members they name
whenever that changes: each endpoint's pod (``targetRef.name``, else its ``hostname``, else
its first address) with its first address, ready or not (``conditions.ready``; unknown counts
as ready, as the API says consumers should take it), its cluster (NATS route) port: the
port its slice names ``cluster`` (:data:`CLUSTER_PORT`, the chart's headless Service's name
for it), if any, and its admin port, the one named ``admin`` (:data:`ADMIN_PORT`: what
``polymq nats``'s partition watch probes), if any. A slice's ports are those of every
endpoint in it, so pods listening on different cluster ports (several nodes on one
machine) come in slices of their own, as the EndpointSlice controller makes them for a
named target port. A pod gone from every slice is gone from the members; what to make of
that (a grace period before its shards move, its NATS route dropped) is the caller's.

The client is synchronous, so the watcher runs on a thread of its own and hands what it
finds to the event loop (``loop.call_soon_threadsafe``). It never gives up and never
raises: a watch that ends is resumed from the last resourceVersion it saw, a ``410 Gone``
(the version is too old) lists everything again, and any other error (the API server away,
a refused request) is logged and retried after a back-off (0.5 s doubling to 30 s), listing
again. ``last_error`` says what went wrong last, for the cluster view.

:func:`scaled_below` tells a pod that is stopping whether its StatefulSet was scaled below
it (``kubectl scale --replicas=2`` stops pod ``<set>-2`` for good; a rolling restart
does not change the replicas).

Errors: none escape the watcher; a configuration that cannot be loaded (no in-cluster
service account and no kubeconfig) is :class:`EndpointsError` from :func:`api_client`, and
so is an API that named no peer in time (:meth:`polymq_core.cluster.natsroutes.Routes.wait`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SERVICE_LABEL = "kubernetes.io/service-name"
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
CLUSTER_PORT = "cluster"  # the name of the Service's port for NATS routes
ADMIN_PORT = "admin"  # ... and of its port for the core's admin HTTP


class EndpointsError(Exception):
    """The Kubernetes API cannot be configured (no service account, no kubeconfig), or
    did not name the peers a node waits for in time."""


@dataclass(frozen=True, slots=True)
class Member:
    """One endpoint of the Service: a pod, its address, whether it is ready, and the ports
    its slice names ``cluster`` and ``admin`` (None: the slice names none)."""

    name: str
    address: str
    ready: bool
    cluster_port: int | None = None
    admin_port: int | None = None


def api_client(kubeconfig: str | None = None) -> Any:
    """An ``ApiClient`` for the in-cluster service account, else ``kubeconfig`` (or the
    default kubeconfig) for development."""
    from kubernetes import client, config

    try:
        if kubeconfig is None:
            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
                return client.ApiClient()
            except config.ConfigException:
                pass
        return config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except Exception as exc:
        raise EndpointsError(
            f"cannot reach the Kubernetes API: no in-cluster service account and no usable"
            f" kubeconfig ({exc})"
        ) from exc


def own_namespace(default: str = "default") -> str:
    """The namespace of this pod (from its service account), else ``default``."""
    try:
        return NAMESPACE_FILE.read_text().strip() or default
    except OSError:
        return default


def scaled_below(api: Any, namespace: str, pod: str, timeout: float = 3.0) -> bool | None:
    """Is ``pod`` (a StatefulSet's pod, named ``<set>-<ordinal>``) beyond the replicas its
    StatefulSet now asks for, which are not none (scaled to nothing is a stop of the whole
    set, not a scale-down)? None when it cannot tell: another kind of name, no such
    StatefulSet (``helm uninstall``), the API refusing or away. Blocking: call it from a
    thread."""
    name, _, ordinal = pod.rpartition("-")
    if not name or not ordinal.isdigit():
        return None
    from kubernetes.client import AppsV1Api
    from kubernetes.client.exceptions import ApiException

    try:
        found = AppsV1Api(api).read_namespaced_stateful_set(
            name, namespace, _request_timeout=timeout
        )
    except Exception as exc:
        why = f"{exc.status} {exc.reason}" if isinstance(exc, ApiException) else str(exc)
        log.warning("StatefulSet %s/%s: cannot read its replicas (%s)", namespace, name, why)
        return None
    spec = found.spec
    replicas = spec.replicas if spec is not None and spec.replicas is not None else 1
    return bool(0 < replicas <= int(ordinal))


def members_of(slices: dict[str, Any], service: str) -> dict[str, Member]:
    """The members that ``slices`` (V1EndpointSlice objects by name) name for ``service``;
    a pod in several slices is ready if any says so."""
    out: dict[str, Member] = {}
    for item in slices.values():
        labels = (item.metadata.labels or {}) if item.metadata is not None else {}
        if labels.get(SERVICE_LABEL) != service:
            continue  # (a server that ignores the label selector)
        named = {p.name: p.port for p in item.ports or () if p.name}
        port, admin = named.get(CLUSTER_PORT), named.get(ADMIN_PORT)
        for endpoint in item.endpoints or ():
            if not endpoint.addresses:
                continue
            ref = endpoint.target_ref
            name = (ref.name if ref is not None else None) or endpoint.hostname
            name = name or endpoint.addresses[0]
            conditions = endpoint.conditions
            ready = conditions is None or conditions.ready is not False
            known = out.get(name)
            if known is None or (ready and not known.ready):
                out[name] = Member(name, endpoint.addresses[0], ready, port, admin)
    return out


class EndpointWatcher:
    """Lists and watches ``service``'s EndpointSlices in ``namespace`` on a thread; calls
    ``on_change(members)`` on ``loop`` whenever the members change (and once after the
    first listing)."""

    def __init__(
        self,
        namespace: str,
        service: str,
        on_change: Callable[[dict[str, Member]], None],
        *,
        api: Any,
        loop: asyncio.AbstractEventLoop,
        watch_seconds: float = 60.0,
        backoff: tuple[float, float] = (0.5, 30.0),
    ) -> None:
        self.namespace = namespace
        self.service = service
        self.on_change = on_change
        self.api = api
        self.loop = loop
        self.watch_seconds = watch_seconds
        self.backoff = backoff
        self.members: dict[str, Member] = {}
        self.last_error: str | None = None
        self.lists = 0  # how many times the slices were listed (a 410 lists again)
        self._slices: dict[str, Any] = {}
        self._told = False  # on_change has been called once (after the first listing)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"endpoints {self.namespace}/{self.service}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop watching. The thread may sit in a read until the watch's timeout; it is a
        daemon and tells nobody anything after this."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        from kubernetes.client import DiscoveryV1Api
        from kubernetes.client.exceptions import ApiException

        api = DiscoveryV1Api(self.api)
        pause = self.backoff[0]
        while not self._stopping.is_set():
            try:
                version = self._list(api)
                pause = self.backoff[0]
                while not self._stopping.is_set():
                    version = self._watch(api, version)
            except ApiException as exc:
                if exc.status == 410:
                    log.info("endpoints of %s: watch expired (410 Gone): listing again", self)
                    continue
                self._failed(f"{exc.status} {exc.reason}", pause)
                pause = min(pause * 2, self.backoff[1])
            except Exception as exc:  # the API server away, a broken stream, ...
                self._failed(f"{type(exc).__name__}: {exc}", pause)
                pause = min(pause * 2, self.backoff[1])

    def __str__(self) -> str:
        return f"{self.namespace}/{self.service}"

    def _failed(self, why: str, pause: float) -> None:
        if self._stopping.is_set():
            return
        self.last_error = why
        log.warning("endpoints of %s: %s; trying again in %.1f s", self, why, pause)
        self._stopping.wait(pause)

    def _list(self, api: Any) -> str | None:
        listed = api.list_namespaced_endpoint_slice(
            self.namespace,
            label_selector=f"{SERVICE_LABEL}={self.service}",
            _request_timeout=self.watch_seconds,
        )
        self.lists += 1
        self._slices = {item.metadata.name: item for item in listed.items or ()}
        self.last_error = None
        self._publish()
        return listed.metadata.resource_version if listed.metadata is not None else None

    def _watch(self, api: Any, version: str | None) -> str | None:
        """Follow changes from ``version`` until the watch ends; the last version seen."""
        from kubernetes import watch

        for event in self._events(watch.Watch(), api, version):  # type: ignore[no-untyped-call]
            if self._stopping.is_set():
                break
            kind = event.get("type")
            item: Any = event.get("object")
            name = getattr(getattr(item, "metadata", None), "name", None)
            if name is None:
                continue
            if kind == "DELETED":
                self._slices.pop(name, None)
            elif kind in ("ADDED", "MODIFIED"):
                self._slices[name] = item
            else:
                continue
            version = item.metadata.resource_version or version
            self._publish()
        return version

    def _events(self, w: Any, api: Any, version: str | None) -> Iterator[dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "label_selector": f"{SERVICE_LABEL}={self.service}",
            "timeout_seconds": max(1, int(self.watch_seconds)),
            # the read gives up a little after the server should have ended the watch
            "_request_timeout": self.watch_seconds + 5,
        }
        if version:
            kwargs["resource_version"] = version
        started = time.monotonic()
        try:
            yield from w.stream(api.list_namespaced_endpoint_slice, self.namespace, **kwargs)
        except Exception as exc:
            # a read that timed out is a watch that ended quietly: resume it
            if "timed out" not in str(exc).lower() and "timeout" not in type(exc).__name__.lower():
                raise
            log.debug(
                "endpoints of %s: watch read timed out after %.0f s",
                self,
                time.monotonic() - started,
            )
        finally:
            w.stop()

    def _publish(self) -> None:
        members = members_of(self._slices, self.service)
        if members == self.members and self._told:
            return
        self.members = members
        self._told = True
        if not self._stopping.is_set():
            self.loop.call_soon_threadsafe(self._tell, members)

    def _tell(self, members: dict[str, Member]) -> None:
        if self._stopping.is_set():
            return
        try:
            self.on_change(members)
        except Exception:
            log.exception("endpoints of %s: on_change failed", self)
