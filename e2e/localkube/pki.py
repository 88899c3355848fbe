"""Certificates and keys for a throwaway control plane: one CA, a serving cert, client certs.

Everything is generated fresh per cluster (RSA 2048, one-day validity) into the cluster's
own directory; nothing here is meant to outlive a test run.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kvrank_operator.certs import ca_certificate, leaf_certificate


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(key: rsa.RSAPrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


class CertificateAuthority:
    """A self-signed CA that issues serving and client certificates into ``directory``
    (built with the operator's certificate builders: one CA builder in the project)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._key = _key()
        now = dt.datetime.now(dt.UTC)
        self._cert = ca_certificate(
            _name("localkube-ca"), self._key, *_validity(now), path_length=None
        )
        self.pair = KeyPair(self.dir / "ca.crt", self.dir / "ca.key")
        self.pair.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self._key, self.pair.key)

    def issue(
        self, name: str, cn: str, org: str | None = None, hosts: tuple[str, ...] = ()
    ) -> KeyPair:
        """A leaf certificate; with ``hosts`` it is a serving cert, else a client cert."""
        key = _key()
        usage = ExtendedKeyUsageOID.SERVER_AUTH if hosts else ExtendedKeyUsageOID.CLIENT_AUTH
        sans = [_san(h) for h in hosts]
        now = dt.datetime.now(dt.UTC)
        cert = leaf_certificate(
            self._cert, self._key, _name(cn, org), key, *_validity(now), [usage], sans
        )
        pair = KeyPair(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, pair.key)
        return pair


def _validity(now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """From five minutes ago (clock skew) for one day: nothing outlives a test run."""
    return now - dt.timedelta(minutes=5), now + dt.timedelta(days=1)


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def service_account_keys(directory: Path) -> KeyPair:
    """The key pair the API server signs (and verifies) service-account tokens with."""
    key = _key()
    pair = KeyPair(directory / "sa.pub", directory / "sa.key")
    _write_key(key, pair.key)
    pair.cert.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pair


def kubeconfig_doc(server: str, ca: Path, user: dict[str, str], name: str) -> dict[str, Any]:
    """A kubeconfig for one user of the cluster whose API server ``ca`` signed."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "localkube", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": "localkube", "user": name}}],
        "current-context": name,
    }
