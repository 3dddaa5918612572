"""TLS between the nodes of a cluster (docs/cluster.md, "Security"): from the node's PEM
certificate (chain), its key and the CA bundle that signed every node's certificate
(``POLYMQ_CLUSTER_TLS_CERT``, ``_KEY``, ``_CA``), the TLS contexts of the node's links to
its peers and of the listeners its peers reach it on. Both sides present their certificate
and accept only one the CA signed (mutual TLS): the CA is the cluster's own, and any
certificate it signed is a node of the cluster. Peer addresses are learned from
``system.peers`` and may be addresses a certificate does not name (a pod's IP, a bind-all
address), so the host name is not checked here; NATS routes, which use the ``--peers`` names,
are checked by nats-server, host name included (natsd).

Errors::

    ConfigError   (polymq_server.config) a file that is not PEM, a key that is not the
                  certificate's, a CA bundle OpenSSL cannot load; names the variable
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from polymq_server.config import ConfigError, load_certificate

from ..config import CoreSettings

__all__ = ["ClusterTls"]

_VARS = {"cert_var": "POLYMQ_CLUSTER_TLS_CERT", "key_var": "POLYMQ_CLUSTER_TLS_KEY"}


@dataclass(frozen=True)
class ClusterTls:
    """A node's certificate, key and the cluster's CA bundle (absolute paths: nats-server
    reads them too)."""

    cert: str
    key: str
    ca: str

    @classmethod
    def of(cls, settings: CoreSettings) -> ClusterTls | None:
        """The cluster TLS of ``settings`` (checked: all three files, readable), or None."""
        if not settings.cluster_tls:
            return None
        return cls(
            *(
                str(Path(p).resolve())
                for p in (
                    settings.cluster_tls_cert,
                    settings.cluster_tls_key,
                    settings.cluster_tls_ca,
                )
            )
        )

    def server_context(self) -> ssl.SSLContext:
        """The peers' listeners: this node's certificate; a client must present one the
        CA signed."""
        return self._context(ssl.PROTOCOL_TLS_SERVER)

    def client_context(self) -> ssl.SSLContext:
        """A link to a peer: its certificate must be one the CA signed; this node presents
        its own."""
        return self._context(ssl.PROTOCOL_TLS_CLIENT)

    def _context(self, protocol: ssl._SSLMethod) -> ssl.SSLContext:
        # no system CAs: only the cluster's CA vouches for a node
        ctx = ssl.SSLContext(protocol)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = False  # addresses from system.peers: see the module's docstring
        ctx.verify_mode = ssl.CERT_REQUIRED
        load_certificate(ctx, self.cert, self.key, **_VARS)
        try:
            with open(self.ca, "rb") as f:
                pem = f.read()
        except OSError as exc:
            raise ConfigError(
                f"POLYMQ_CLUSTER_TLS_CA={self.ca!r}: cannot read it: {exc.strerror or exc}"
            ) from None
        if b"-----BEGIN CERTIFICATE-----" not in pem:
            raise ConfigError(
                f"POLYMQ_CLUSTER_TLS_CA={self.ca!r}: not a PEM CA bundle "
                "(no '-----BEGIN CERTIFICATE-----' line)"
            )
        try:
            ctx.load_verify_locations(cadata=pem.decode("ascii", errors="replace"))
        except (ssl.SSLError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise ConfigError(
                f"POLYMQ_CLUSTER_TLS_CA={self.ca!r}: OpenSSL cannot load it ({reason})"
            ) from None
        return ctx
