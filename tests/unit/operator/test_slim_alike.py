"""The operator's cached copies: only what it reads, equal parts kept once
(slim.Alike): at 10000 live pods each pod parsed its own tolerations and pin."""

from __future__ import annotations

import copy
from typing import Any

from localplane.pods import vnpu_pod
from vnpu_common.wire import names
from vnpu_operator.slim import METADATA_READ, Alike, slim_allocation, slim_pod

TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
     "tolerationSeconds": 300},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
     "tolerationSeconds": 300},
]  # fmt: skip


def served(name: str, uid: str, node: str) -> dict[str, Any]:
    """A running pod as the API serves it: each its own parsed copy."""
    pod = vnpu_pod(
        name, "ns", uid=uid, finalizers=[names.POD_FINALIZER], phase="Running",
        labels={"app": "x", names.LABEL_MANAGED: "true"},
        metadata={"creationTimestamp": "2026-12-04T12:00:00Z", "generation": 2,
                  "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "uid": "o"}],
                  "managedFields": [{"manager": "kubectl"}]},
        spec={"nodeName": node, "tolerations": copy.deepcopy(TOLERATIONS),
              "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                  "nodeSelectorTerms": [{"matchFields": [
                      {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}},
    )  # fmt: skip
    return copy.deepcopy(pod)


def test_equal_parts_of_two_pods_are_one_object_and_unequal_ones_stay_apart() -> None:
    a, b, c = (slim_pod(served(f"p{i}", f"u{i}", node)) for i, node in enumerate("nnm"))
    assert a["spec"]["tolerations"] == TOLERATIONS
    assert a["spec"]["tolerations"] is b["spec"]["tolerations"] is c["spec"]["tolerations"]
    assert a["spec"]["affinity"] is b["spec"]["affinity"]
    assert c["spec"]["affinity"] is not a["spec"]["affinity"]
    assert c["spec"]["affinity"] != a["spec"]["affinity"]
    assert a["metadata"]["labels"] is b["metadata"]["labels"]
    assert a["metadata"]["finalizers"] is b["metadata"]["finalizers"]
    assert a["status"] is b["status"] == {"phase": "Running"}
    # Each pod's own fields stay its own.
    assert (a["metadata"]["uid"], b["metadata"]["uid"]) == ("u0", "u1")


def test_the_cached_metadata_is_what_the_operator_reads() -> None:
    pod = slim_pod(served("p", "u", "n"))
    assert set(pod["metadata"]) <= set(METADATA_READ)
    for dropped in ("managedFields", "ownerReferences", "creationTimestamp", "generation"):
        assert dropped not in pod["metadata"]
    alloc = slim_allocation({
        "metadata": {"name": "a", "namespace": "ns", "uid": "au", "resourceVersion": "7",
                     "labels": {names.LABEL_POD_UID: "u"}, "finalizers": ["f"],
                     "deletionTimestamp": "2026-12-04T12:00:00Z",
                     "ownerReferences": [{"kind": "Pod", "name": "p", "uid": "u"}],
                     "creationTimestamp": "2026-12-04T12:00:00Z"},
        "spec": {"podUID": "u", "nodeName": "n"},
        "status": {"phase": "Ready", "message": "", "conditions": [{"type": "Ready"}]},
    })  # fmt: skip
    assert alloc["metadata"] == {
        "name": "a", "namespace": "ns", "uid": "au", "resourceVersion": "7",
        "labels": {names.LABEL_POD_UID: "u"}, "finalizers": ["f"],
        "deletionTimestamp": "2026-12-04T12:00:00Z",
    }  # fmt: skip
    assert alloc["status"] == {"phase": "Ready", "message": ""}


def test_a_sweep_forgets_the_parts_nobody_holds_and_keeps_the_held_ones() -> None:
    alike = Alike(first_sweep=4)
    held = [alike.share([f"held-{i}"]) for i in range(2)]
    for i in range(2):
        alike.share([f"dropped-{i}"])  # nobody keeps these
    assert len(alike) == 4
    alike.share(["fifth"])  # the table is full: it sweeps first
    assert len(alike) == 3
    assert alike.share(["held-0"]) is held[0]
    assert alike.share(["held-1"]) is held[1]
    fresh = ["dropped-0"]
    assert alike.share(fresh) is fresh  # forgotten: the new copy is kept


def test_empty_and_plain_values_are_not_shared() -> None:
    alike = Alike()
    empty: dict[str, Any] = {}
    assert alike.share(empty) is empty
    assert alike.share("text") == "text"
    assert len(alike) == 0
