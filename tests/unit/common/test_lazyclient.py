"""kubernetes-asyncio's generated classes load on first use, are the same
classes, and the components run with them so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from localplane.sourceroots import pythonpath


def fresh(code: str) -> dict[str, object]:
    """Runs `code` in a new interpreter; it prints one JSON object."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": pythonpath()},
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_names_resolve_to_kubernetes_asyncios_own_classes_and_work() -> None:
    result = fresh(
        """
        import asyncio, json, sys
        from vnpu_common.kube import lazyclient
        installed = lazyclient.install()
        import kopf
        from kubernetes_asyncio import client, config
        from kubernetes_asyncio.client.api.core_v1_api import CoreV1Api
        from kubernetes_asyncio.client.models.v1_lease import V1Lease

        class Answer:
            data = json.dumps({"metadata": {"name": "p", "labels": {"a": "b"}},
                               "spec": {"containers": [{"name": "c", "image": "i"}]}})

        async def answers():
            async with client.ApiClient() as api:
                pod = api.deserialize(Answer(), "V1Pod")
                lease = client.V1Lease(metadata=client.V1ObjectMeta(name="l"),
                                       spec=client.V1LeaseSpec(holder_identity="me"))
                return pod, api.sanitize_for_serialization(lease)

        pod, lease = asyncio.run(answers())
        print(json.dumps({
            "installed": installed,
            "lazy": lazyclient.is_lazy(),
            "same": client.CoreV1Api is CoreV1Api and client.V1Lease is V1Lease,
            "pod": [type(pod).__name__, pod.metadata.labels, pod.spec.containers[0].image],
            "lease": lease,
            "rest": client.rest.__name__,
            "missing": hasattr(client, "NoSuchApi") or hasattr(client.models, "V0Nothing"),
            "models_loaded": sum(m.startswith("kubernetes_asyncio.client.models.")
                                 for m in sys.modules),
        }))
        """
    )
    assert result["installed"] is True
    assert result["lazy"] is True
    assert result["same"] is True
    assert result["pod"] == ["V1Pod", {"a": "b"}, "i"]
    assert result["lease"] == {"metadata": {"name": "l"}, "spec": {"holderIdentity": "me"}}
    assert result["rest"] == "kubernetes_asyncio.client.rest"
    assert result["missing"] is False
    # Of 768: those the test touched and what they refer to.
    assert isinstance(result["models_loaded"], int)
    assert result["models_loaded"] < 30


def test_importing_either_component_makes_the_client_lazy() -> None:
    for package in ("vnpu_operator", "vnpu_agent"):
        result = fresh(
            f"""
            import json
            import {package}.main
            from vnpu_common.kube import lazyclient
            print(json.dumps({{"lazy": lazyclient.is_lazy()}}))
            """
        )
        assert result == {"lazy": True}, package


def test_a_client_imported_before_is_left_as_it_is() -> None:
    result = fresh(
        """
        import json
        import kubernetes_asyncio
        from vnpu_common.kube import lazyclient
        print(json.dumps({"installed": lazyclient.install(), "lazy": lazyclient.is_lazy()}))
        """
    )
    assert result == {"installed": False, "lazy": False}


def test_the_operator_process_is_smaller_by_tens_of_megabytes() -> None:
    measure = """
        import json
        {first}
        import vnpu_operator.main
        rss = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")]
        print(json.dumps({{"rss_mb": rss[0] / 1024}}))
        """
    eager = fresh(measure.format(first="import kubernetes_asyncio"))["rss_mb"]
    lazy = fresh(measure.format(first=""))["rss_mb"]
    assert isinstance(eager, float)
    assert isinstance(lazy, float)
    assert eager - lazy > 15, (eager, lazy)
