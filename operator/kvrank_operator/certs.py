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
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 825
"""The longest lifetime browsers ever accepted for a server certificate; a managed cache
outliving it is re-created (see the module's note on rotation)."""
CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "tls.crt", "tls.key"
"""The keys of a ``kubernetes.io/tls`` Secret (cert-manager's names), so a Secret of one's
own can replace the generated one."""


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def redis_tls(common_name: str, dns_names: list[str], now: dt.datetime) -> dict[str, str]:
    """``{ca.crt, tls.crt, tls.key}`` (PEM): a CA named after ``common_name`` and a server
    certificate for ``dns_names`` (also valid as a client certificate: the nodes dial each
    other over TLS on the cluster bus)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    key = ec.generate_private_key(ec.SECP256R1())
    not_before, not_after = now - dt.timedelta(minutes=5), now + dt.timedelta(days=VALID_DAYS)
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name(f"{common_name} CA"))
        .issuer_name(_name(f"{common_name} CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
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
        .sign(ca_key, hashes.SHA256())
    )
    server = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return {CA_FILE: _pem(ca), CERT_FILE: _pem(server), KEY_FILE: key_pem}
