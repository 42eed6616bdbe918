"""X.509 material: a CA, serving certificates and client certificates.

Used by the operator to self-sign its webhook certificate and by the local
control plane for the API server and its admin user.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=365)
# Valid from a little before issue, so a peer whose clock is behind ours accepts it.
_BACKDATE = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes

    def write(self, cert_path: Path, key_path: Path) -> None:
        cert_path.write_bytes(self.cert_pem)
        key_path.write_bytes(self.key_pem)
        key_path.chmod(0o600)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    return x509.Name(attrs)


def make_ca(
    common_name: str = "vnpu-operator-ca",
    *,
    validity: dt.timedelta = _VALIDITY * 10,
    now: dt.datetime | None = None,
) -> KeyPair:
    key = _key()
    now = now or dt.datetime.now(dt.UTC)
    subject = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem(key))


def issue(
    ca: KeyPair,
    common_name: str,
    *,
    dns_names: tuple[str, ...] = (),
    ip_addresses: tuple[str, ...] = (),
    organizations: tuple[str, ...] = (),
    server: bool = True,
    client: bool = False,
    validity: dt.timedelta = _VALIDITY,
    now: dt.datetime | None = None,
) -> KeyPair:
    """A leaf certificate signed by `ca`, valid for `validity` from `now` but never past
    the CA's own notAfter (a client would refuse the chain then anyway)."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise TypeError("CA key must be EC or RSA")
    key = _key()
    now = now or dt.datetime.now(dt.UTC)
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, organizations))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(min(now + validity, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        # RFC 5280 verifiers (cryptography's among them) want the issuer's key named.
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    )
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem(key))


def not_after(cert_pem: bytes) -> float:
    """Epoch seconds of the notAfter of the first certificate in `cert_pem`."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    return cert.not_valid_after_utc.timestamp()


def write_like_a_secret_volume(directory: Path, files: dict[str, bytes]) -> None:
    """Replaces the files of `directory` at once, the way the kubelet updates a Secret
    volume: a new hidden directory, then the `..data` symlink renamed onto it, with each
    name a link through `..data`. A reader sees all old files or all new ones."""
    directory.mkdir(parents=True, exist_ok=True)
    fresh = f"..{uuid.uuid4().hex}"
    (directory / fresh).mkdir()
    for name, data in files.items():
        (directory / fresh / name).write_bytes(data)
    link = directory / f"..data_{uuid.uuid4().hex}"
    link.symlink_to(fresh)
    old = (directory / "..data").readlink() if (directory / "..data").is_symlink() else None
    os.replace(link, directory / "..data")
    for name in files:
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(Path("..data") / name)
    if old is not None:
        for stale in (directory / old).iterdir():
            stale.unlink()
        (directory / old).rmdir()


def rsa_keypair() -> tuple[bytes, bytes]:
    """(private PEM, public PEM) for service-account token signing."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _pem(key), public
