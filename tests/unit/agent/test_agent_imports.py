"""What the agent loads at start: it runs on every node of a DaemonSet, so a
module it never uses costs memory on each of them."""

from __future__ import annotations

from tests.unit.common.test_lazyclient import fresh


def test_the_agent_loads_no_certificate_library_unless_it_makes_a_certificate() -> None:
    # cryptography is 8 MB of RSS; only metrics_auth=kubernetes with no
    # certificate of the admin's makes one (vnpu_common.process.metrics_auth).
    loaded = fresh(
        """
        import json, sys
        import vnpu_agent.main
        before = "cryptography" in sys.modules
        from vnpu_common.process.metrics_auth import self_signed_context
        self_signed_context("vnpu-agent")
        print(json.dumps({"before": before, "after": "cryptography" in sys.modules}))
        """
    )
    assert loaded == {"before": False, "after": True}
