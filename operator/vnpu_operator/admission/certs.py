"""Where the webhook's serving certificate comes from, and when it changes.

`SelfSigned` makes a CA and a leaf in memory and renews each at a fraction of its
lifetime; `CertDir` reads tls.crt, tls.key and ca.crt from a directory (a mounted
Secret, e.g. cert-manager's) and notices when they are replaced. Both hand out
`Material`; the server (admission/server.py) decides when to register a CA bundle and
when to start serving a new certificate.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from vnpu_common.kube import certs

Clock = Callable[[], float]
_SHA256 = hashes.SHA256()


class CertError(Exception):
    """Certificate material that cannot be served; the message says why."""


@dataclass(frozen=True)
class Material:
    """A serving certificate (chain) and key, and the CA bundle that verifies it."""

    cert_pem: bytes
    key_pem: bytes
    # PEM of the CA(s) a client needs; None: the source does not know it (the API
    # server's own trust roots, or a CA bundle injected by someone else).
    ca_bundle: bytes | None
    not_after: float


def bundle(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise CertError(f"not PEM certificates: {exc}") from None


def covers(registered: bytes | None, wanted: bytes) -> bool:
    """Whether every CA of `wanted` is already in `registered`."""
    if registered is None:
        return False
    have = {c.fingerprint(_SHA256) for c in bundle(registered)}
    return all(c.fingerprint(_SHA256) in have for c in bundle(wanted))


def handover(new: bytes, old: bytes | None, now: float, limit: int | None = None) -> bytes:
    """`new` followed by the still valid CAs of `old` it lacks, at most `limit` in all
    (the newest of `old` first kept): while the server still serves a certificate of the
    old CA, an API server that already has the new bundle must accept it too; and with
    several replicas each making its own CA, the API server must trust every live
    replica's (each puts its own first; a dead replica's CA, whose key died with it, is
    the first to go over the limit)."""
    out = bundle(new)
    seen = {c.fingerprint(_SHA256) for c in out}
    for c in bundle(old) if old else []:
        if limit is not None and len(out) >= limit:
            break
        if c.fingerprint(_SHA256) not in seen and c.not_valid_after_utc.timestamp() > now:
            out.append(c)
            seen.add(c.fingerprint(_SHA256))
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in out)


def load(context: ssl.SSLContext, material: Material, workdir: Path) -> None:
    """Puts `material` into `context`; new handshakes use it, open connections keep theirs.

    A failed load_cert_chain leaves a context half-changed (the new certificate with the
    old key), which fails every handshake, so the material is first loaded into a scratch
    context and only then into the live one.
    """
    cert, key = workdir / "tls.crt", workdir / "tls.key"
    certs.KeyPair(material.cert_pem, material.key_pem).write(cert, key)
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise CertError(f"certificate and key do not load together: {exc}") from None
    context.load_cert_chain(cert, key)


class SelfSigned:
    """An in-memory CA and a leaf it signs. Each is renewed once `renew_fraction` of its
    lifetime has passed (counted from issue, not from the back-dated notBefore); a leaf
    never outlives its CA."""

    def __init__(
        self,
        dns_names: tuple[str, ...],
        ip_addresses: tuple[str, ...],
        *,
        validity: float,
        ca_validity: float,
        renew_fraction: float,
        clock: Clock = time.time,
    ) -> None:
        if not 0 < renew_fraction < 1:
            raise ValueError(f"renew fraction {renew_fraction} is not in (0, 1)")
        self.dns_names = dns_names
        self.ip_addresses = ip_addresses
        self.validity = validity
        self.ca_validity = ca_validity
        self.renew_fraction = renew_fraction
        self.clock = clock
        self._ca = self._new_ca()
        self._material, self._leaf_renew_at = self._new_leaf()

    def _new_ca(self) -> tuple[certs.KeyPair, float]:
        now = self.clock()
        ca = certs.make_ca(
            "vnpu-operator-webhook-ca",
            validity=dt.timedelta(seconds=self.ca_validity),
            now=dt.datetime.fromtimestamp(now, dt.UTC),
        )
        return ca, now + self.renew_fraction * self.ca_validity

    def _new_leaf(self) -> tuple[Material, float]:
        ca, _ = self._ca
        now = self.clock()
        leaf = certs.issue(
            ca, "vnpu-operator-webhook", dns_names=self.dns_names,
            ip_addresses=self.ip_addresses, validity=dt.timedelta(seconds=self.validity),
            now=dt.datetime.fromtimestamp(now, dt.UTC),
        )  # fmt: skip
        not_after = certs.not_after(leaf.cert_pem)
        material = Material(leaf.cert_pem, leaf.key_pem, ca.cert_pem, not_after)
        return material, now + self.renew_fraction * (not_after - now)

    def current(self) -> Material:
        return self._material

    def refresh(self) -> Material | None:
        """New material once the leaf or the CA is due for renewal, else None."""
        now = self.clock()
        if now >= self._ca[1]:
            self._ca = self._new_ca()
        elif now < self._leaf_renew_at:
            return None
        self._material, self._leaf_renew_at = self._new_leaf()
        return self._material


class CertDir:
    """tls.crt, tls.key and optionally ca.crt in `directory`.

    A Secret volume is updated by swapping the `..data` symlink, so the files change all
    at once; a directory edited by hand may be caught half-written, which fails to load and
    is tried again when the files change next. Changes are found by reading the files
    (a few KB) each poll: contents, unlike mtimes and inodes, cannot look unchanged.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._digest: bytes | None = None

    def _read(self) -> tuple[bytes, bytes, bytes | None]:
        try:
            cert = (self.directory / "tls.crt").read_bytes()
            key = (self.directory / "tls.key").read_bytes()
        except OSError as exc:
            raise CertError(f"cannot read {exc.filename}: {exc.strerror}") from None
        try:
            ca: bytes | None = (self.directory / "ca.crt").read_bytes()
        except FileNotFoundError:
            ca = None
        except OSError as exc:
            raise CertError(f"cannot read {exc.filename}: {exc.strerror}") from None
        return cert, key, ca

    def _material(self, cert: bytes, key: bytes, ca: bytes | None) -> Material:
        where = self.directory
        try:
            not_after = certs.not_after(cert)
        except ValueError:
            raise CertError(f"{where / 'tls.crt'} holds no PEM certificate") from None
        if ca is not None and not ca.strip():
            ca = None  # cert-manager writes an empty ca.crt for issuers that have no CA
        if ca is not None:
            try:
                bundle(ca)
            except CertError as exc:
                raise CertError(f"{where / 'ca.crt'}: {exc}") from None
        return Material(cert, key, ca, not_after)

    def current(self) -> Material:
        cert, key, ca = self._read()
        self._digest = _digest(cert, key, ca)
        return self._material(cert, key, ca)

    def refresh(self) -> Material | None:
        """The files' material when they differ from the last read, else None; raises
        CertError once per change that cannot be served."""
        try:
            cert, key, ca = self._read()
        except CertError as exc:
            # Missing files are reported once, not every poll, until they change.
            if self._digest == str(exc).encode():
                return None
            self._digest = str(exc).encode()
            raise
        digest = _digest(cert, key, ca)
        if digest == self._digest:
            return None
        self._digest = digest
        return self._material(cert, key, ca)


def _digest(*parts: bytes | None) -> bytes:
    h = hashlib.sha256()
    for part in parts:
        h.update(b"-" if part is None else b"+%d:" % len(part) + part)
    return h.digest()
