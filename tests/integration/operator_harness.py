"""Helpers for tests of the operator: the pods, their Events and allocations
in the cluster, the vNPUs a simulated driver holds, the audit log, and `Stack`,
an agent and an operator run together (`localplane.components`)."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localplane import LocalPlane
from localplane.components import AGENT_NAMESPACE, AgentProcess, OperatorProcess
from localplane.waiting import wait_for
from vnpu_agent.drivers.base import VNPU
from vnpu_agent.drivers.sim import SimDriver
from vnpu_common.wire import names


def get_json(plane: LocalPlane, *args: str) -> Any:
    return plane.get_json(*args)


def get_pod(plane: LocalPlane, namespace: str, name: str) -> dict[str, Any] | None:
    pod: dict[str, Any] | None = get_json(plane, "pod", "-n", namespace, name)
    return pod


def pod_events(
    plane: LocalPlane, namespace: str, name: str, reason: str | None = None
) -> list[dict[str, Any]]:
    """Events on the pod, optionally only those of one reason."""
    selector = f"involvedObject.kind=Pod,involvedObject.name={name}"
    found = get_json(plane, "events", "-n", namespace, "--field-selector", selector) or {}
    return [e for e in found.get("items", []) if reason is None or e.get("reason") == reason]


def wait_event(
    plane: LocalPlane, namespace: str, name: str, reason: str, timeout: float = 60
) -> list[dict[str, Any]]:
    """The pod's Events of `reason`, once there is at least one."""
    events: list[dict[str, Any]] = wait_for(
        f"{reason} Event on pod {namespace}/{name}",
        lambda: pod_events(plane, namespace, name, reason),
        timeout=timeout,
        interval=0.5,
    )
    return events


def sim_vnpus(sim: SimDriver) -> dict[int, VNPU]:
    """vNPU id -> vNPU, as the simulated driver holds them."""
    return {v.id: v for c in sim.list_chips() for v in sim.list_vnpus(c.index)}


def pod_allocations(plane: LocalPlane, namespace: str, uid: str) -> list[dict[str, Any]]:
    items = get_json(
        plane, "vnpuallocations", "-n", namespace, "-l", f"{names.LABEL_POD_UID}={uid}"
    )
    return list((items or {}).get("items", []))


def vnpu_pods(plane: LocalPlane) -> list[dict[str, Any]]:
    """Every pod in the cluster that asks for vNPUs."""
    items = (get_json(plane, "pods", "-A") or {}).get("items", [])
    return [
        p
        for p in items
        if names.ANN_TEMPLATE in ((p.get("metadata") or {}).get("annotations") or {})
    ]


def delete_vnpu_pods(plane: LocalPlane, timeout: float = 60) -> None:
    """Deletes every vNPU pod and waits until they are gone: their releases need the
    operator and the agents still running."""
    for pod in vnpu_pods(plane):
        meta = pod["metadata"]
        plane.kubectl("delete", "pod", "-n", meta["namespace"], meta["name"], "--wait=false",
                      check=False)  # fmt: skip
    wait_for("vNPU pods gone", lambda: not vnpu_pods(plane), timeout=timeout)


def purge_foreign(plane: LocalPlane, ours: list[str] | tuple[str, ...]) -> None:
    """Earlier test modules may leave VNPUNodes, agent Leases and allocations
    of nodes nobody serves any more; an operator would place pods there.
    Removes those of nodes not in `ours` (allocations with their finalizers
    stripped)."""
    keep = set(ours)
    for vn in (get_json(plane, "vnpunodes") or {}).get("items", []):
        name = vn["metadata"]["name"]
        if name not in keep:
            plane.kubectl("delete", "vnpunode", name, "--wait=false", check=False)
    for lease in (get_json(plane, "leases", "-n", AGENT_NAMESPACE) or {}).get("items", []):
        name = lease["metadata"]["name"]
        if name.startswith(names.LEASE_PREFIX) and name[len(names.LEASE_PREFIX) :] not in keep:
            plane.kubectl("delete", "lease", "-n", AGENT_NAMESPACE, name, check=False)
    for alloc in (get_json(plane, "vnpuallocations", "-A") or {}).get("items", []):
        meta = alloc["metadata"]
        if (meta.get("labels") or {}).get(names.LABEL_NODE) in keep:
            continue
        where = ["-n", meta["namespace"], f"vnpuallocation/{meta['name']}"]
        plane.kubectl("delete", *where, "--wait=false", check=False)
        plane.kubectl(
            "patch", *where, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False
        )


def pod_running(
    plane: LocalPlane, namespace: str, name: str, *, timeout: float = 60, interval: float = 0.3
) -> dict[str, Any]:
    """The pod once its phase is Running."""

    def check() -> dict[str, Any] | None:
        p = get_json(plane, "pod", "-n", namespace, name)
        return p if p and (p.get("status") or {}).get("phase") == "Running" else None

    pod: dict[str, Any] = wait_for(f"pod {name} Running", check, timeout=timeout, interval=interval)
    return pod


def pod_waiting(
    plane: LocalPlane, namespace: str, name: str, *, timeout: float = 60, interval: float = 0.3
) -> dict[str, Any]:
    """The pod's Allocated=False condition, once the operator set it: the pod waits
    for capacity (so it stays gated)."""

    def check() -> dict[str, Any] | None:
        p = get_json(plane, "pod", "-n", namespace, name) or {}
        for cond in (p.get("status") or {}).get("conditions") or []:
            if cond.get("type") == names.POD_COND_ALLOCATED and cond.get("status") == "False":
                return dict(cond)
        return None

    cond: dict[str, Any] = wait_for(
        f"pod {name} waiting", check, timeout=timeout, interval=interval
    )
    return cond


def pod_gone(
    plane: LocalPlane, namespace: str, name: str, *, timeout: float = 90, interval: float = 0.5
) -> None:
    wait_for(
        f"pod {name} gone",
        lambda: get_json(plane, "pod", "-n", namespace, name) is None,
        timeout=timeout,
        interval=interval,
    )


OUR_AGENTS = (names.USER_AGENT_OPERATOR, names.USER_AGENT_AGENT)


def audit_since(plane: LocalPlane, offset: int) -> list[dict[str, Any]]:
    """Completed writes (the plane audits only writes) since `offset` of the audit log."""
    with open(plane.audit_log, "rb") as f:
        f.seek(offset)
        lines = f.read().splitlines()
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            # A line still being written, or cut by an offset taken while
            # another client's write was in flight.
            continue
    return [e for e in events if e.get("stage") == "ResponseComplete"]


def component(event: dict[str, Any]) -> str:
    """Which of our components made an audited request (else its client's name)."""
    agent = str(event.get("userAgent", ""))
    return next((c for c in OUR_AGENTS if agent.startswith(c)), agent.split("/")[0] or "?")


class Stack:
    """Nodes with simulated chips, one agent process serving them and one
    operator: what a module of operator tests runs against.

    Only one Stack may run at a time in a plane (operators would compete).
    `close` deletes every vNPU pod and waits until they are gone while the
    operator still runs, so no pod is left stuck on its finalizer, then
    removes the nodes, their VNPUNodes and Leases.
    """

    def __init__(
        self,
        plane: LocalPlane,
        workdir: Path,
        nodes: list[Any],
        *,
        agent_extra: list[str] | None = None,
        operator_extra: list[str] | None = None,
    ) -> None:
        self.plane = plane
        self.workdir = workdir
        self.specs = nodes
        self.node_names = [n.name for n in nodes]
        workdir.mkdir(parents=True, exist_ok=True)
        if plane.kubectl("get", "namespace", AGENT_NAMESPACE, check=False).returncode != 0:
            plane.kubectl("create", "namespace", AGENT_NAMESPACE, check=False)
        plane.add_nodes(nodes)
        (workdir / "agent").mkdir(exist_ok=True)
        self.agent = AgentProcess(plane, workdir / "agent", self.node_names, extra=agent_extra)
        self.operator = OperatorProcess(plane, workdir / "operator", extra=operator_extra)

    def start(self) -> Stack:
        purge_foreign(self.plane, self.node_names)
        self.agent.start()
        wait_for(
            "VNPUNodes published",
            lambda: all(get_json(self.plane, "vnpunode", n) for n in self.node_names),
            timeout=30,
        )
        self.operator.start()
        return self

    def close(self) -> None:
        try:
            if self.operator.proc is None:
                self.operator.start()
            if self.agent.proc is None:
                self.agent.start()
            delete_vnpu_pods(self.plane)
        finally:
            self.operator.kill(signal.SIGTERM)
            self.agent.kill(signal.SIGTERM)
            # The operator registered webhooks that now point nowhere; with
            # failurePolicy Fail they would refuse later modules' vNPU pods.
            for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
                self.plane.kubectl("delete", kind, names.WEBHOOK_CONFIG_NAME, check=False)
            for node in self.node_names:
                self.plane.kubectl("delete", "node", node, "--wait=false", check=False)
                self.plane.kubectl("delete", "vnpunode", node, "--wait=false", check=False)
                self.plane.kubectl(
                    "delete", "lease", "-n", AGENT_NAMESPACE, names.lease_name(node),
                    "--wait=false", check=False,
                )  # fmt: skip


StackOf = Callable[..., Stack]
"""The `stack_of` fixture (conftest.py): `stack_of(nodes, agent_extra=...,
operator_extra=...)` starts a Stack, closed after the module's last test."""


def apply_quota(plane: LocalPlane, namespace: str, hard: dict[str, str]) -> None:
    """What docs/USAGE.md's "Quota" tells admins to write: a plain ResourceQuota
    `vnpu` with `hard`, applied and counted by the quota controller."""
    plane.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "vnpu", "namespace": namespace},
            "spec": {"hard": dict(hard)},
        }
    )

    def counted() -> bool:
        quota = get_json(plane, "resourcequota", "-n", namespace, "vnpu") or {}
        return bool((quota.get("status") or {}).get("hard") == hard)

    wait_for(f"quota of {namespace} counted", counted, timeout=30, interval=0.3)
