"""A Job whose pod template already carries its vNPU charge, on the real plane: what
Kueue needs (it admits a Job by its template's requests; docs/USAGE.md, "Quota with
Kueue"). The Job controller's pods pass the whole admission chain (the operator's
webhooks, the chart's protection policies, a ResourceQuota on the same names) with
their charge as the template wrote it, and are placed and run; a template
whose charge is wrong gets its pods' charge corrected, so Kueue's count and the
quota's would differ (the guide says how to write the right one)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_harness import Stack, get_json

from localplane import LocalPlane, NodeSpec
from localplane.waiting import wait_for
from vnpu_common.wire import names

pytestmark = pytest.mark.plane

NAMESPACE = "job-charge"
TEMPLATE = "vir05_1c_16g"  # 5 AICore, 16384 MB on a 910B3
# docs/USAGE.md's "Quota with Kueue": the webhook's charge of one vir05_1c_16g.
CHARGE = {
    names.RES_AICORE: "5",
    names.RES_MEMORY_MB: "16384",
    names.RES_VNPUS: "1",
    names.template_resource("vir05_1c_16g"): "1",
}


@pytest.fixture(scope="module")
def stack(plane: LocalPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack(
        plane,
        Path(tmp_path_factory.mktemp("job-charge")),
        [NodeSpec(name="jc-a", chips={"910B3": 1})],
    ).start()
    plane.kubectl("create", "namespace", NAMESPACE, check=False)
    try:
        yield stack
    finally:
        plane.kubectl("delete", "jobs", "--all", "-n", NAMESPACE, "--cascade=foreground",
                      "--wait=false", check=False)  # fmt: skip
        stack.close()
        plane.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def job(name: str, charge: dict[str, str], parallelism: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "template": {
                "metadata": {"annotations": {names.ANN_TEMPLATE: TEMPLATE}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "busybox",
                            "resources": {"requests": dict(charge), "limits": dict(charge)},
                        }
                    ],
                },
            },
        },
    }


def _job_pods(plane: LocalPlane, name: str) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = get_json(plane, "pods", "-n", NAMESPACE, "-l", f"job-name={name}")[
        "items"
    ]
    return pods


def test_a_job_template_with_the_charge_is_admitted_and_counted_as_written(
    plane: LocalPlane, stack: Stack
) -> None:
    plane.apply({
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "vnpu", "namespace": NAMESPACE},
        "spec": {"hard": {f"requests.{k}": "100000" for k in CHARGE}},
    })  # fmt: skip
    plane.apply(job("charged", CHARGE, parallelism=2))
    pods = wait_for(
        "both pods of the Job placed",
        lambda: (
            (ps := _job_pods(plane, "charged"))
            and len(ps) == 2
            and all(p["metadata"].get("annotations", {}).get(names.ANN_VISIBLE_DEVICES)
                    for p in ps)
            and ps
        ),
        timeout=60,
    )  # fmt: skip
    for pod in pods:
        resources = pod["spec"]["containers"][0]["resources"]
        assert resources == {"requests": CHARGE, "limits": CHARGE}
    # kwok ends a Job's pods as soon as they run, so the quota's use is gone by now;
    # the Job's completion says both ran.
    wait_for(
        "the Job complete",
        lambda: get_json(plane, "job", "charged", "-n", NAMESPACE)["status"].get("succeeded") == 2,
        timeout=60,
    )


def test_a_wrong_charge_in_the_template_is_corrected_on_the_pods(
    plane: LocalPlane, stack: Stack
) -> None:
    wrong = {names.RES_AICORE: "1", names.RES_MEMORY_MB: "1", names.RES_VNPUS: "1"}
    plane.apply(job("wrong", wrong, parallelism=1))
    (pod,) = wait_for("the Job's pod", lambda: _job_pods(plane, "wrong"), timeout=60)
    assert pod["spec"]["containers"][0]["resources"] == {"requests": CHARGE, "limits": CHARGE}
