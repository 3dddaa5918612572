"""A throw-away certificate authority for tests, made with the ``openssl`` command line (the
venv has no ``cryptography``): ``ca = Authority.make(dir, "ca")``, then
``cert, key = ca.issue("node", sans="IP:127.0.0.1,DNS:localhost")``: a certificate the CA
signed, usable by a server and by a client (mutual TLS)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

HAVE_OPENSSL = shutil.which("openssl") is not None


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@dataclass(frozen=True)
class Authority:
    directory: Path
    cert: Path
    key: Path

    @classmethod
    def make(cls, directory: Path, name: str = "ca") -> Authority:
        """A self-signed CA valid for a day, its key unencrypted, in ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        cert, key = directory / f"{name}.crt", directory / f"{name}.key"
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "1", "-keyout", str(key), "-out", str(cert),
            "-subj", f"/CN=polymq test {name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        return cls(directory, cert, key)

    def issue(self, name: str, sans: str = "IP:127.0.0.1,DNS:localhost") -> tuple[Path, Path]:
        """A certificate (for servers and clients) for ``sans``, signed by this CA, and
        its unencrypted key."""
        cert, key = self.directory / f"{name}.crt", self.directory / f"{name}.key"
        csr, ext = self.directory / f"{name}.csr", self.directory / f"{name}.ext"
        _openssl(
            "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}",
        )  # fmt: skip
        ext.write_text(
            f"subjectAltName={sans}\nextendedKeyUsage=serverAuth,clientAuth\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
        )
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(self.cert), "-CAkey", str(self.key),
            "-CAcreateserial", "-days", "1", "-out", str(cert), "-extfile", str(ext),
        )  # fmt: skip
        return cert, key
