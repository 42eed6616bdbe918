"""The Kopf wiring keeps to the rules the API economy depends on."""

from __future__ import annotations

import kopf

from vnpu_operator.config import OperatorSettings
from vnpu_operator.convergence import Convergence
from vnpu_operator.handlers import NoDiffBase, configure, register
from vnpu_operator.kubeapi import OperatorApi
from vnpu_operator.leases import LeaseWatch
from vnpu_operator.metrics import OperatorMetrics
from vnpu_operator.watches import managed_pod
from vnpu_operator.wiring import build_pods


def test_kopf_watches_no_kind_so_no_watch_fault_ends_the_process() -> None:
    registry = kopf.OperatorRegistry()
    settings = OperatorSettings()
    pods = build_pods(OperatorApi.__new__(OperatorApi), settings, OperatorMetrics())
    leases = LeaseWatch.__new__(LeaseWatch)
    convergence = Convergence.__new__(Convergence)
    register(registry, pods.controller, settings, leases, convergence, [])
    # Change-detecting handlers would make Kopf persist progress on objects
    # (writes) and would need the diff base NoDiffBase skips.
    assert list(registry._changing.get_all_handlers()) == []
    assert list(registry._spawning.get_all_handlers()) == []
    watched = {h.id.split(".")[-1] for h in registry._watching.get_all_handlers()}
    indexed = {h.id.split(".")[-1] for h in registry._indexing.get_all_handlers()}
    # VNPUNodes, Nodes, pods, allocations and ResourceQuotas have informers
    # (watches.py), and so do agent Leases (leases.py).
    assert watched == set(), watched
    assert indexed == set(), indexed


def test_kopf_settings() -> None:
    settings = kopf.OperatorSettings()
    configure(settings, OperatorSettings(watch_timeout_seconds=120))
    assert settings.persistence.finalizer == "vnpu.io/operator"
    assert isinstance(settings.persistence.diffbase_storage, NoDiffBase)
    assert settings.posting.level == 30
    assert settings.watching.server_timeout == 120
    assert settings.watching.client_timeout == 150
    assert settings.scanning.disabled is True


def test_the_operator_keeps_every_pod_it_admitted_whatever_its_annotations_say() -> None:
    def pod(**meta: object) -> dict[str, object]:
        return {"metadata": meta, "spec": {}}

    assert managed_pod(pod(annotations={"vnpu.io/template": "vir01"}))
    assert managed_pod(pod(finalizers=["vnpu.io/release"]))
    assert managed_pod(pod(labels={"vnpu.io/managed": "true"}))
    gated = {"metadata": {}, "spec": {"schedulingGates": [{"name": "vnpu.io/allocation"}]}}
    assert managed_pod(gated)
    assert not managed_pod(pod(annotations={"other": "x"}, finalizers=["other/f"]))
    assert not managed_pod({"metadata": {}, "spec": {"schedulingGates": [{"name": "x"}]}})
