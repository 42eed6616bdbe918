"""Pure helpers of the local plane tool and the certificate module."""

from __future__ import annotations

import pytest
from cryptography import x509

from localplane.nodes import NodeSpec, format_chips, node_manifest, parse_chips
from vnpu_common import certs, names


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
