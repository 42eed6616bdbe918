"""Pure helpers of the local plane tool and the certificate module."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest
from cryptography import x509

from localplane.nodes import NodeSpec, format_chips, node_manifest, parse_chips
from localplane.plane import ephemeral_low, free_port
from vnpu_common.kube import certs
from vnpu_common.wire import names


def test_chip_spec_roundtrip() -> None:
    chips = {"910B3": 4, "310P3": 2}
    assert parse_chips(format_chips(chips)) == chips
    assert parse_chips("") == {}


@pytest.mark.parametrize("bad", ["910B3", "910B3=x", "=4", "910B3=0"])
def test_bad_chip_specs_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="MODEL=COUNT"):
        parse_chips(bad)


def test_npu_node_manifest_carries_chips_for_the_simulator() -> None:
    m = node_manifest(NodeSpec(name="n1", chips={"910B3": 8}, labels={"zone": "a"}))
    assert m["metadata"]["annotations"][names.ANN_SIM_CHIPS] == "910B3=8"
    assert m["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert m["metadata"]["labels"][names.LABEL_NPU_NODE] == "true"
    assert m["metadata"]["labels"]["zone"] == "a"
    plain = node_manifest(NodeSpec(name="cpu-1"))
    assert names.LABEL_NPU_NODE not in plain["metadata"]["labels"]


def test_issued_certificate_chains_to_ca_with_sans() -> None:
    ca = certs.make_ca()
    leaf = certs.issue(ca, "svc", dns_names=("svc.ns.svc",), ip_addresses=("127.0.0.1",))
    cert = x509.load_pem_x509_certificate(leaf.cert_pem)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    cert.verify_directly_issued_by(ca_cert)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["svc.ns.svc"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


class _Sequence(random.Random):
    """Answers randint from a fixed list: the ports free_port tries in turn."""

    def __init__(self, ports: list[int]) -> None:
        super().__init__(0)
        self.ports = ports

    def randint(self, a: int, b: int) -> int:
        port = self.ports.pop(0)
        assert a <= port <= b
        return port


def test_free_port_stays_below_the_ephemeral_range_and_never_repeats() -> None:
    got = [free_port(low=32768) for _ in range(50)]
    assert all(10000 <= p < 32768 for p in got), got
    assert len(set(got)) == len(got)


def test_free_port_skips_a_port_something_listens_on() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        other = 10000 + (busy + 7) % 20000
        got = free_port(_Sequence([busy, other]), low=max(busy, other) + 1)
    assert got == other


def test_free_port_takes_the_kernels_choice_without_room_below_the_range() -> None:
    port = free_port(low=10500)
    assert port >= ephemeral_low()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))  # it was free


def test_ephemeral_low_reads_the_kernels_range(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("40000\t60999\n")
    assert ephemeral_low(str(f)) == 40000
    assert ephemeral_low(str(tmp_path / "missing")) == 32768
