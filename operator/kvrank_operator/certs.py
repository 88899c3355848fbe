"""TLS material for a managed Redis Cluster: a certificate authority of its own and one
server certificate it signs, shared by the cluster's nodes.

Every managed Redis gets a fresh CA; its private key is discarded once the server
certificate is signed, so nothing can ever issue another certificate that this
RankerDeployment's clients trust. Clients verify the chain against that CA alone (the
nodes announce pod IPs, which no certificate can name in advance), which proves the peer
holds the one key the operator put into the cluster's Secret. Rotating means a new CA, which
nodes still on the old one would refuse on the cluster bus: re-create the RankerDeployment
(its cache starts empty), or bring a Secret of one's own whose CA stays (cert-manager
renewing from one issuer) and roll the Redis pods after a renewal.

Pure apart from randomness: no API calls, no files.
"""

from __future__ import annotations

import datetime as dt

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 825
"""The longest lifetime browsers ever accepted for a server certificate; a managed cache
outliving it is re-created (see the module's note on rotation)."""
CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "tls.crt", "tls.key"
"""The keys of a ``kubernetes.io/tls`` Secret (cert-manager's names), so a Secret of one's
own can replace the generated one."""


CertificateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def ca_certificate(
    subject: x509.Name,
    key: CertificateKey,
    not_before: dt.datetime,
    not_after: dt.datetime,
    path_length: int | None = 0,
) -> x509.Certificate:
    """A self-signed CA that signs certificates (and CRLs) only. The one CA builder of the
    project: the managed Redis's CA here, the local test cluster's in ``localkube.pki``."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )


def leaf_certificate(
    ca: x509.Certificate,
    ca_key: CertificateKey,
    subject: x509.Name,
    key: CertificateKey,
    not_before: dt.datetime,
    not_after: dt.datetime,
    usages: list[x509.ObjectIdentifier],
    names: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    """A certificate ``ca`` signs for ``key``: for the extended ``usages`` (server, client),
    valid for ``names`` (subject alternative names) when given."""
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def redis_tls(common_name: str, dns_names: list[str], now: dt.datetime) -> dict[str, str]:
    """``{ca.crt, tls.crt, tls.key}`` (PEM): a CA named after ``common_name`` and a server
    certificate for ``dns_names`` (also valid as a client certificate: the nodes dial each
    other over TLS on the cluster bus)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    key = ec.generate_private_key(ec.SECP256R1())
    not_before, not_after = now - dt.timedelta(minutes=5), now + dt.timedelta(days=VALID_DAYS)
    ca = ca_certificate(_name(f"{common_name} CA"), ca_key, not_before, not_after)
    server = leaf_certificate(
        ca,
        ca_key,
        _name(common_name),
        key,
        not_before,
        not_after,
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
        [x509.DNSName(n) for n in dns_names],
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return {CA_FILE: _pem(ca), CERT_FILE: _pem(server), KEY_FILE: key_pem}
