"""The webhook's certificates: self-signed renewal on a clock, a certificate directory
replaced like a Secret volume, the live TLS context reloaded (or kept when the new
files are bad), the CA bundle handed over, and an injected caBundle kept."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from vnpu_common.kube import certs
from vnpu_operator.admission import ServiceRef, mutating_webhook_configuration
from vnpu_operator.admission.certs import (
    CertDir,
    CertError,
    Material,
    SelfSigned,
    bundle,
    covers,
    handover,
    load,
)
from vnpu_operator.admission.configurations import keep_ca_bundles, merge_ca_bundles
from vnpu_operator.admission.quotas import QuotaBook
from vnpu_operator.admission.server import MAX_CAS, WebhookServer
from vnpu_operator.config import parse_args

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def leaf(material: Material) -> x509.Certificate:
    return x509.load_pem_x509_certificate(material.cert_pem)


def verifies(material: Material) -> bool:
    """Whether the material's CA bundle verifies its certificate for 127.0.0.1."""
    assert material.ca_bundle is not None
    cert = leaf(material)
    store = x509.verification.Store(bundle(material.ca_bundle))
    verifier = (
        x509.verification.PolicyBuilder()
        .store(store)
        .time(cert.not_valid_before_utc)
        .build_server_verifier(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    )
    try:
        verifier.verify(cert, [])
    except x509.verification.VerificationError:
        return False
    return True


def self_signed(clock: Clock, validity: float = 90, ca_validity: float = 300) -> SelfSigned:
    return SelfSigned(
        ("localhost",), ("127.0.0.1",),
        validity=validity, ca_validity=ca_validity, renew_fraction=2 / 3, clock=clock,
    )  # fmt: skip


def test_self_signed_leaf_is_renewed_at_two_thirds_of_its_life_by_the_same_ca() -> None:
    clock = Clock()
    source = self_signed(clock)
    first = source.current()
    assert verifies(first)
    assert first.not_after == pytest.approx(T0 + 90, abs=1)
    clock.now = T0 + 59
    assert source.refresh() is None
    clock.now = T0 + 61
    second = source.refresh()
    assert second is not None
    assert leaf(second).serial_number != leaf(first).serial_number
    assert second.ca_bundle == first.ca_bundle
    assert second.not_after == pytest.approx(T0 + 61 + 90, abs=1)
    assert verifies(second)
    assert source.refresh() is None


def test_self_signed_ca_is_renewed_and_a_leaf_never_outlives_its_ca() -> None:
    clock = Clock()
    source = self_signed(clock, validity=90, ca_validity=200)
    ca = source.current().ca_bundle
    assert ca is not None
    ca_end = bundle(ca)[0].not_valid_after_utc.timestamp()
    # At 120 s the CA (due at 2/3 of 200 s) still signs; 120 + 90 s would pass its end.
    clock.now = T0 + 120
    cut = source.refresh()
    assert cut is not None
    assert cut.ca_bundle == ca
    assert cut.not_after == pytest.approx(ca_end, abs=1)
    assert cut.not_after < T0 + 120 + 90
    clock.now = T0 + 134
    renewed = source.refresh()
    assert renewed is not None
    assert renewed.ca_bundle != ca
    assert verifies(renewed)
    assert not covers(ca, renewed.ca_bundle or b"")


def write_pair(directory: Path, name: str, *, with_ca: bool = True) -> tuple[bytes, bytes]:
    ca = certs.make_ca(f"{name}-ca")
    pair = certs.issue(ca, name, ip_addresses=("127.0.0.1",))
    files = {"tls.crt": pair.cert_pem, "tls.key": pair.key_pem}
    if with_ca:
        files["ca.crt"] = ca.cert_pem
    certs.write_like_a_secret_volume(directory, files)
    return pair.cert_pem, ca.cert_pem


def test_cert_dir_sees_a_secret_volume_swap_once(tmp_path: Path) -> None:
    cert_a, ca_a = write_pair(tmp_path, "a")
    source = CertDir(tmp_path)
    assert source.current() == Material(
        cert_a, (tmp_path / "tls.key").read_bytes(), ca_a, certs.not_after(cert_a)
    )
    assert source.refresh() is None
    cert_b, ca_b = write_pair(tmp_path, "b")
    new = source.refresh()
    assert new is not None
    assert (new.cert_pem, new.ca_bundle) == (cert_b, ca_b)
    assert source.refresh() is None
    # The old generation's directory is gone; only ..data and the links remain besides it.
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("..") and p.is_dir()]) == 2


def test_cert_dir_errors_name_the_file_once_per_change(tmp_path: Path) -> None:
    source = CertDir(tmp_path)
    with pytest.raises(CertError, match=r"tls\.crt"):
        source.current()
    with pytest.raises(CertError, match=r"tls\.crt"):
        source.refresh()
    assert source.refresh() is None  # the same missing file: reported once
    certs.write_like_a_secret_volume(tmp_path, {"tls.crt": b"junk", "tls.key": b"junk"})
    with pytest.raises(CertError, match="no PEM certificate"):
        source.refresh()
    assert source.refresh() is None
    cert, _ = write_pair(tmp_path, "c")
    assert (source.refresh() or pytest.fail("no new material")).cert_pem == cert


def test_cert_dir_without_or_with_empty_ca_has_no_bundle(tmp_path: Path) -> None:
    write_pair(tmp_path / "none", "n", with_ca=False)
    assert CertDir(tmp_path / "none").current().ca_bundle is None
    pair = certs.issue(certs.make_ca(), "e")
    files = {"tls.crt": pair.cert_pem, "tls.key": pair.key_pem, "ca.crt": b""}
    certs.write_like_a_secret_volume(tmp_path / "empty", files)
    assert CertDir(tmp_path / "empty").current().ca_bundle is None
    files["ca.crt"] = b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n"
    certs.write_like_a_secret_volume(tmp_path / "bad", files)
    with pytest.raises(CertError, match=r"ca\.crt"):
        CertDir(tmp_path / "bad").current()


def test_handover_bundle_trusts_new_then_old_and_drops_expired() -> None:
    old, new = certs.make_ca("old"), certs.make_ca("new")
    both = handover(new.cert_pem, old.cert_pem, now=T0 - 10**9)
    assert [c.subject.rfc4514_string() for c in bundle(both)] == ["CN=new", "CN=old"]
    assert covers(both, new.cert_pem)
    assert covers(both, old.cert_pem)
    assert not covers(old.cert_pem, new.cert_pem)
    assert not covers(None, new.cert_pem)
    # Handing over again keeps each CA once; an expired old CA is dropped.
    assert handover(both, both, now=T0 - 10**9) == both
    ten_years = 3650 * 86400 + 10**9
    assert bundle(handover(new.cert_pem, old.cert_pem, now=T0 + ten_years)) == bundle(new.cert_pem)


def test_keep_ca_bundles_keeps_an_injected_bundle_and_ours_wins() -> None:
    target = ServiceRef("ns", "svc")
    injected = {
        "webhooks": [
            {"name": "mutate.pods.vnpu.io", "clientConfig": {"caBundle": "aW5qZWN0ZWQ="}},
            {"name": "other.example.com", "clientConfig": {"caBundle": "b3RoZXI="}},
        ]
    }
    kept = keep_ca_bundles(mutating_webhook_configuration(target, None), injected)
    assert [w["clientConfig"].get("caBundle") for w in kept["webhooks"]] == ["aW5qZWN0ZWQ="]
    assert kept["webhooks"][0]["clientConfig"]["service"]["name"] == "svc"
    ours = keep_ca_bundles(mutating_webhook_configuration(target, b"ours"), injected)
    assert ours["webhooks"][0]["clientConfig"]["caBundle"] == "b3Vycw=="
    assert keep_ca_bundles(mutating_webhook_configuration(target, None), {}) == (
        mutating_webhook_configuration(target, None)
    )


async def served_serial(port: int) -> int:
    pem = await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", port))
    return int(x509.load_pem_x509_certificate(pem.encode()).serial_number)


async def test_a_bad_new_pair_leaves_the_live_context_serving_the_old(tmp_path: Path) -> None:
    ca = certs.make_ca()
    a, b = certs.issue(ca, "a"), certs.issue(ca, "b")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    load(context, Material(a.cert_pem, a.key_pem, None, 0), tmp_path)
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    try:
        serial_a = x509.load_pem_x509_certificate(a.cert_pem).serial_number
        assert await served_serial(port) == serial_a
        with pytest.raises(CertError, match="do not load together"):
            load(context, Material(b.cert_pem, a.key_pem, None, 0), tmp_path)
        assert await served_serial(port) == serial_a
        load(context, Material(b.cert_pem, b.key_pem, None, 0), tmp_path)
        assert await served_serial(port) == x509.load_pem_x509_certificate(b.cert_pem).serial_number
    finally:
        server.close()
        await server.wait_closed()


async def test_server_serves_replaced_files_without_a_restart(tmp_path: Path) -> None:
    from localplane.plane import free_port

    write_pair(tmp_path / "certs", "first")
    port = free_port()
    settings = parse_args([
        "--webhook-host=127.0.0.1", f"--webhook-port={port}",
        f"--webhook-cert-dir={tmp_path / 'certs'}", "--webhook-cert-poll-seconds=0.1",
    ])  # fmt: skip
    server = WebhookServer(settings, lambda: None, QuotaBook())
    await server.start()
    try:
        first = await served_serial(port)
        assert server.cert_not_after() == certs.not_after((tmp_path / "certs/tls.crt").read_bytes())
        cert, _ = write_pair(tmp_path / "certs", "second")
        second = x509.load_pem_x509_certificate(cert).serial_number
        for _ in range(50):
            if await served_serial(port) == second:
                break
            await asyncio.sleep(0.1)
        assert await served_serial(port) == second != first
        assert server.cert_not_after() == certs.not_after(cert)
    finally:
        await server.stop()


async def test_a_missing_cert_dir_stops_the_start_with_one_clear_line(tmp_path: Path) -> None:
    settings = parse_args(["--webhook-port=1", f"--webhook-cert-dir={tmp_path / 'nope'}"])
    server = WebhookServer(settings, lambda: None, QuotaBook())
    with pytest.raises(SystemExit, match=r"webhook certificate: cannot read .*nope/tls.crt"):
        await server.start()
    await server.stop()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--webhook-cert-validity-seconds=3650", "--webhook-ca-validity-seconds=5000"], "twice"),
        (["--webhook-cert-renew-fraction=1.5"], "--webhook-cert-renew-fraction"),
        (["--webhook-cert-validity-seconds=1"], "--webhook-cert-validity-seconds"),
        (["--webhook-cert-poll-seconds=0"], "--webhook-cert-poll-seconds"),
    ],
)
def test_bad_certificate_settings_exit_naming_the_setting(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert needle in capsys.readouterr().err


def test_each_replica_registers_its_own_ca_beside_the_others() -> None:
    """Operator-made certificates with two replicas (issue 35): each has its own CA;
    registering puts its own first and keeps the others' still-valid CAs, at most
    `limit`, so the API server trusts every live replica."""
    clock = Clock()
    a, b, c = (self_signed(clock).current().ca_bundle for _ in range(3))
    assert a
    assert b
    assert c
    both = handover(b, a, clock.now, limit=MAX_CAS)
    assert covers(both, a)
    assert covers(both, b)
    assert bundle(both)[0].fingerprint(hashes.SHA256()) == bundle(b)[0].fingerprint(hashes.SHA256())
    capped = handover(c, both, clock.now, limit=2)
    assert covers(capped, c)
    assert covers(capped, b)
    assert not covers(capped, a)

    target = "https://127.0.0.1:9443"
    existing = mutating_webhook_configuration(target, both)
    ours = mutating_webhook_configuration(target, c)
    merged = merge_ca_bundles(ours, existing, lambda o, t: handover(o, t, clock.now))
    pem = base64.b64decode(merged["webhooks"][0]["clientConfig"]["caBundle"])
    assert covers(pem, a)
    assert covers(pem, b)
    assert covers(pem, c)
    # A body without a CA (cert-manager injects it) is not merged: it keeps the injected one.
    plain = mutating_webhook_configuration(target, None)
    kept = keep_ca_bundles(merge_ca_bundles(plain, existing, lambda o, t: o), existing)
    assert (
        kept["webhooks"][0]["clientConfig"]["caBundle"]
        == (existing["webhooks"][0]["clientConfig"]["caBundle"])
    )
