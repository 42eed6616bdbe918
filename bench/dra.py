"""`python -m bench.dra` (`make bench-dra`): claim pods, annotation pods and
plain pods created at one rate, side by side, on one plane.

One plane, one scheduler, one operator: `--nodes` annotation nodes (the
operator places annotated pods there) and `--nodes` DRA nodes (`dn-*`, an
agent of their own with `--dra true` publishing their pools; a node serves
one mode, docs/DRA.md). Each kind gets `--pods` pods of the churn's mix
(bench/load.py) at `--rate`/s, each held `--hold` s and deleted: claim pods
through ResourceClaimTemplates choosing the template by CEL, annotation pods
through the annotations, plain pods asking for nothing (the scheduler puts
them on nodes of both kinds). Plain pods are the floor: Kubernetes alone, in
the same run. Per kind: created -> running p50/p99 and its ratio to plain
pods (goal: claim pods within 1.5x at p99), API writes per pod (audit log),
operator and agent CPU per pod with the idle rate taken out (an idle window
before the churn), the fill rate (pods that ran / pods asked for); for claim
pods the scheduler's binding-condition wait, from its /metrics and from the
benchmark's watches (claim allocated -> vNPU ready -> pod bound).
Exits 1 if a correctness counter is not 0 (no timing assertions).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import ssl
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from kubernetes_asyncio import client

from bench import load, report
from bench.cluster import Cluster
from bench.run import (
    CpuWindow,
    add_plane_args,
    driver_cpu,
    on_plane,
    over_idle,
    settle_audit,
)
from bench.watchloop import StampedWatch
from localplane import LocalPlane
from localplane.waiting import wait_for
from vnpu_common.wire import names

KINDS = ("claim", "annotation", "plain")
NAMESPACES = {"claim": "bench-dra", "annotation": "bench", "plain": "bench-base"}
PREFIXES = {"claim": "d", "annotation": "a", "plain": "p"}
DRA_NODE_PREFIX = "dn-"
ANN_NODE_PREFIX = "bn-"
GOAL_P99_RATIO = 1.5  # claim pods' created -> running p99 over plain pods'
# The scheduler's histogram of the binding-condition wait (PreBind), by the
# name the issue gives it and by the name kube-scheduler 1.37 serves.
BINDING_METRICS = (
    "scheduler_dra_bindingconditions_prebind_duration_seconds",
    "scheduler_dra_bindingconditions_wait_duration_seconds",
)


def say(msg: str) -> None:
    print(f"[bench-dra {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def dra_node_names(count: int) -> list[str]:
    return [f"{DRA_NODE_PREFIX}{i:04d}" for i in range(count)]


# -- manifests ---------------------------------------------------------------


def device_class() -> dict[str, Any]:
    """The chart's DeviceClass (templates/deviceclass.yaml)."""
    return {
        "apiVersion": names.RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": names.DRA_DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{names.DRA_DRIVER}"'}}]},
    }


def template_name(template: str, count: int) -> str:
    return f"{template.replace('_', '-')}-x{count}"


def claim_template(namespace: str, template: str, count: int) -> dict[str, Any]:
    """`count` devices of vNPU template `template`, chosen by CEL."""
    cel = f'device.attributes["{names.DRA_DRIVER}"].{names.DRA_ATTR_TEMPLATE} == "{template}"'
    request = {
        "name": "npu",
        "exactly": {
            "deviceClassName": names.DRA_DEVICE_CLASS,
            "count": count,
            "selectors": [{"cel": {"expression": cel}}],
        },
    }
    return {
        "apiVersion": names.RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": template_name(template, count), "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def claim_pod(name: str, namespace: str, template: str, count: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "vnpu-bench"}},
        "spec": {
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "npu"}]}}
            ],
            "resourceClaims": [
                {"name": "npu", "resourceClaimTemplateName": template_name(template, count)}
            ],
        },
    }


@dataclass
class ClaimDriver(load.Driver):
    """The load driver creating pods that ask through a ResourceClaimTemplate."""

    def manifest(self, name: str, template: str, count: int) -> dict[str, Any]:
        return claim_pod(name, self.namespace, template, count)


# -- the claims' steps -------------------------------------------------------


@dataclass
class ClaimSteps:
    """When the watch first showed a pod's claim allocated and its vNPUs ready."""

    allocated: float | None = None
    ready: float | None = None


def claim_owner(obj: dict[str, Any]) -> str | None:
    """The pod a claim generated from a template belongs to."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Pod":
            return str(ref.get("name"))
    return None


def devices_ready(obj: dict[str, Any]) -> bool:
    """Every allocated device's binding condition is True in the claim's status."""
    status = obj.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    ready = {
        (d.get("pool"), d.get("device"))
        for d in status.get("devices") or []
        if any(
            c.get("type") == names.DRA_COND_READY and c.get("status") == "True"
            for c in d.get("conditions") or []
        )
    }
    return bool(results) and all((r.get("pool"), r.get("device")) in ready for r in results)


class ClaimWatch(StampedWatch):
    """Watches the claims of one namespace and stamps their steps by pod."""

    def __init__(self, resource: client.ResourceV1Api, namespace: str) -> None:
        super().__init__(
            f"{namespace} claims", partial(resource.list_namespaced_resource_claim, namespace)
        )
        self.steps: dict[str, ClaimSteps] = {}

    def stamp(self, kind: str, obj: dict[str, Any], now: float) -> None:
        pod = claim_owner(obj)
        if pod is None or kind == "DELETED":
            return
        s = self.steps.setdefault(pod, ClaimSteps())
        if s.allocated is None and (obj.get("status") or {}).get("allocation"):
            s.allocated = now
        if s.ready is None and devices_ready(obj):
            s.ready = now


def gap(a: float | None, b: float | None) -> float | None:
    return max(0.0, b - a) if a is not None and b is not None else None


def claim_step_summaries(
    pods: list[load.PodTimes], steps: dict[str, ClaimSteps]
) -> dict[str, dict[str, Any]]:
    """Claim pods' time between their steps: created -> claim allocated (the
    claim controller and the scheduler), allocated -> vNPU ready (operator
    and agent), ready -> pod bound (the scheduler notices), and the whole
    binding-condition wait, allocated -> bound."""
    rows: dict[str, list[float]] = {
        "created_to_allocated": [],
        "allocated_to_ready": [],
        "ready_to_bound": [],
        "allocated_to_bound": [],
        "bound_to_running": [],
    }
    for p in pods:
        s = steps.get(p.name, ClaimSteps())
        for key, (a, b) in {
            "created_to_allocated": (p.created, s.allocated),
            "allocated_to_ready": (s.allocated, s.ready),
            "ready_to_bound": (s.ready, p.scheduled),
            "allocated_to_bound": (s.allocated, p.scheduled),
            "bound_to_running": (p.scheduled, p.running),
        }.items():
            if (x := gap(a, b)) is not None:
                rows[key].append(x)
    return {k: report.summary(v) for k, v in rows.items()}


# -- the scheduler's histogram -------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})? (\S+)$")
_LE = re.compile(r'(?:^|,)le="([^"]*)"')


@dataclass
class Histogram:
    """A Prometheus histogram summed over its label sets: cumulative counts by bound."""

    buckets: dict[float, float] = field(default_factory=dict)
    sum: float = 0.0
    count: float = 0.0

    def minus(self, before: Histogram) -> Histogram:
        return Histogram(
            {le: n - before.buckets.get(le, 0.0) for le, n in self.buckets.items()},
            self.sum - before.sum,
            self.count - before.count,
        )

    def quantile(self, q: float) -> float | None:
        """The upper bound of the bucket holding the q-th percentile (None
        without observations, or where it is past the last finite bound)."""
        if self.count <= 0:
            return None
        want = q / 100 * self.count
        for le in sorted(self.buckets):
            if self.buckets[le] >= want:
                return None if math.isinf(le) else le
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "mean": self.sum / self.count if self.count else None,
            "p50_at_most": self.quantile(50),
            "p99_at_most": self.quantile(99),
        }


def histogram(text: str, name: str, label: str = "") -> Histogram | None:
    """Histogram `name` in a /metrics text, its label sets holding `label`
    (e.g. `status="success"`) summed (None: not served)."""
    out = Histogram()
    seen = False
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None or not m.group(1).startswith(name):
            continue
        metric, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if label not in labels:
            continue
        if metric == f"{name}_bucket":
            le = _LE.search(labels)
            if le is None:
                continue
            bound = float(le.group(1))  # "+Inf" reads as inf
            out.buckets[bound] = out.buckets.get(bound, 0.0) + value
            seen = True
        elif metric == f"{name}_sum":
            out.sum += value
        elif metric == f"{name}_count":
            out.count += value
            seen = True
    return out if seen else None


def scheduler_metrics(plane: LocalPlane) -> str:
    """kube-scheduler's /metrics as the admin (delegated authorization)."""
    ctx = ssl.create_default_context(cafile=str(plane.ca_file))
    ctx.load_cert_chain(plane.pki / "admin.crt", plane.pki / "admin.key")
    ctx.check_hostname = False  # a self-signed serving certificate
    ctx.verify_mode = ssl.CERT_NONE
    url = f"https://127.0.0.1:{plane.ports.scheduler}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=30, context=ctx) as r:
            return str(r.read().decode())
    except OSError as exc:
        say(f"scheduler /metrics not read: {exc}")
        return ""


def binding_wait(before: str, after: str) -> dict[str, Any]:
    """The scheduler's binding-condition histogram over the churn, by the first
    of BINDING_METRICS it serves; the names it serves that look alike."""
    found = re.finditer(r"^(\w*bindingcondition\w*?)(?:_bucket|_sum|_count)?[{ ]", after, re.M)
    alike = sorted({m.group(1) for m in found})
    for name in BINDING_METRICS:
        end = histogram(after, name)
        if end is None:
            continue
        whole = end.minus(histogram(before, name) or Histogram())
        out: dict[str, Any] = {"metric": name, **whole.to_json()}
        for status in ("success", "timeout", "failure", "error"):
            label = f'status="{status}"'
            got = histogram(after, name, label)
            if got is not None:
                out[status] = got.minus(histogram(before, name, label) or Histogram()).to_json()
        return {**out, "served": alike}
    return {"metric": None, "served": alike}


# -- writes ------------------------------------------------------------------


def namespace_writes(events: list[dict[str, Any]], namespace: str, pods: int) -> dict[str, Any]:
    """Every component's writes in `namespace` per pod (pods, claims,
    allocations, bindings, Events), ours apart."""
    by: Counter[str] = Counter()
    for e in events:
        if (e.get("objectRef") or {}).get("namespace") == namespace:
            by[f"{report.component(e)}: {report.what(e)}"] += 1
    n = max(1, pods)
    who: Counter[str] = Counter()
    for key, v in by.items():
        who[key.split(":", 1)[0]] += v
    return {
        "per_pod": sum(by.values()) / n,
        "ours_per_pod": sum(v for k, v in who.items() if k in report.OURS.values()) / n,
        "by_component": {k: v / n for k, v in sorted(who.items(), key=lambda x: -x[1])},
        "by_write": {k: v / n for k, v in sorted(by.items(), key=lambda x: -x[1])},
    }


def node_writes(events: list[dict[str, Any]], prefix: str) -> dict[str, int]:
    """Cluster-scoped writes about the nodes named `prefix*` (VNPUNodes,
    their ResourceSlices `<node>-vnpu-*`, Nodes), by component and write."""
    by: Counter[str] = Counter()
    for e in events:
        ref = e.get("objectRef") or {}
        if not ref.get("namespace") and str(ref.get("name", "")).startswith(prefix):
            by[f"{report.component(e)}: {report.what(e)}"] += 1
    return dict(by.most_common())


# -- the run -----------------------------------------------------------------


def start(args: argparse.Namespace, cluster: Cluster, out: dict[str, Any]) -> list[str]:
    """The plane, both kinds of nodes, their agents, the operator, the claim
    templates; returns the DRA nodes."""
    plane = cluster.plane
    out["correctness"] = {}
    cluster.start_plane(say)
    for ns in (NAMESPACES["claim"], NAMESPACES["plain"]):
        plane.kubectl("create", "namespace", ns)
    plane.apply(device_class())
    dra = dra_node_names(args.nodes)
    say(f"creating {args.nodes} annotation nodes and {args.nodes} DRA nodes (kwok)")
    t = time.monotonic()
    cluster.add_nodes(cluster.nodes + dra)
    out["startup"] = {"nodes_ready_s": time.monotonic() - t}
    t = time.monotonic()
    cluster.start_agents()
    cluster.start_agent("agent-dra", dra, "agent-dra", ["--dra", "true"])
    want = set(dra)

    def pools() -> bool:
        have = {s["spec"].get("nodeName") for s in cluster.list("resourceslices")}
        return want <= have

    wait_for("every DRA node's pool published", pools, timeout=300, interval=2)
    out["startup"]["agents_to_all_pools_s"] = time.monotonic() - t
    t = time.monotonic()
    cluster.start_operator()
    out["startup"]["operator_ready_s"] = time.monotonic() - t
    for template, count in sorted({(t_, n) for t_, n, _ in load.MIX}):
        plane.apply(claim_template(NAMESPACES["claim"], template, count))
    return dra


async def staggered(delay: float, work: Awaitable[float]) -> float:
    await asyncio.sleep(delay)
    return await work


async def leftovers(cluster: Cluster, timeout: float) -> dict[str, int]:  # noqa: ASYNC109
    """What the churn left once it had `timeout` s to go: allocations of
    both vNPU kinds, claims."""

    def count() -> dict[str, int]:
        return {
            "allocations_left": sum(
                len(cluster.list("vnpuallocations", "-n", NAMESPACES[k]))
                for k in ("claim", "annotation")
            ),
            "claims_left": len(cluster.list("resourceclaims", "-n", NAMESPACES["claim"])),
        }

    deadline = time.monotonic() + timeout
    while True:
        left = await asyncio.to_thread(count)
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        await asyncio.sleep(2)


async def phases(args: argparse.Namespace, cluster: Cluster, out: dict[str, Any]) -> None:
    plane = cluster.plane
    api = await load.api_client(plane.kubeconfig, load.BENCH_UA, args.concurrency)
    core = client.CoreV1Api(api)
    limit = asyncio.Semaphore(args.concurrency)
    gates = {"annotation": names.SCHEDULING_GATE}
    trackers = {k: load.Tracker(core, NAMESPACES[k], gates.get(k, "none")) for k in KINDS}
    claims = ClaimWatch(client.ResourceV1Api(api), NAMESPACES["claim"])
    for w in (*trackers.values(), claims):
        w.start()
        await w.synced.wait()
    drivers = {
        "claim": ClaimDriver(core, NAMESPACES["claim"], trackers["claim"], limit),
        "annotation": load.Driver(core, NAMESPACES["annotation"], trackers["annotation"], limit),
        "plain": load.Driver(core, NAMESPACES["plain"], trackers["plain"], limit, plain=True),
    }
    say(f"idle window: {args.idle:g}s")
    idle = CpuWindow(cluster)
    idle.start()
    await asyncio.sleep(args.idle)
    idled = idle.stop()
    idle_per_s = {k: v / idled["window_s"] for k, v in idled["cpu_seconds"].items()}
    off0 = await asyncio.to_thread(settle_audit, plane.audit_log)
    sched0 = await asyncio.to_thread(scheduler_metrics, plane)
    pods = {k: load.mix_pods(PREFIXES[k], args.pods) for k in KINDS}
    say(f"churn: {args.pods} pods of each kind at {args.rate:g}/s each, held {args.hold:g}s")
    window = CpuWindow(cluster)
    window.start()
    drv0 = driver_cpu(cluster)
    # The three kinds' creations interleaved: one every 1 / (3 x rate) s.
    durations = await asyncio.gather(*(
        staggered(i / (len(KINDS) * args.rate), load.churn(
            drivers[k], pods[k], args.rate, args.hold, args.timeout, say if k == "claim" else None
        ))
        for i, k in enumerate(KINDS)
    ))  # fmt: skip
    spent = window.stop()
    drv1 = driver_cpu(cluster)
    sched1 = await asyncio.to_thread(scheduler_metrics, plane)
    off1 = await asyncio.to_thread(settle_audit, plane.audit_log)
    left = await leftovers(cluster, 120)
    for w in (*trackers.values(), claims):
        await w.stop()
    await api.close()
    events = report.audit_events(plane.audit_log, off0, off1)
    agent_of = {"annotation": f"{report.AGENT_PROCESS}-0", "claim": f"{report.AGENT_PROCESS}-1"}
    node_prefix = {"annotation": ANN_NODE_PREFIX, "claim": DRA_NODE_PREFIX}
    kinds: dict[str, Any] = {}
    for i, k in enumerate(KINDS):
        batch = pods[k]
        created = sum(1 for p in batch if p.created is not None)
        running = [x for p in batch if (x := p.running_latency()) is not None]
        row: dict[str, Any] = {
            "asked": len(batch),
            "created": created,
            "admitted": len(running),
            "fill_rate": len(running) / max(1, len(batch)),
            "duration_s": durations[i],
            "running": report.summary(running),
            "scheduled": report.summary(
                [x for p in batch if (x := p.scheduled_latency()) is not None]
            ),
            "gone": report.summary([x for p in batch if (x := p.gone_latency()) is not None]),
            "writes": namespace_writes(events, NAMESPACES[k], created),
            "errors": drivers[k].errors[:20],
        }
        if k in agent_of:
            inventory = node_writes(events, node_prefix[k])
            row["node_writes"] = inventory
            row["writes_per_pod_with_nodes"] = row["writes"]["per_pod"] + sum(
                inventory.values()
            ) / max(1, created)
            name = agent_of[k]
            row["agent_cpu_ms_per_pod"] = over_idle(
                spent["cpu_seconds"], idle_per_s, spent["window_s"], created
            ).get(name)
            row["agent_driver_threads_s"] = round(drv1.get(name, 0) - drv0.get(name, 0), 2)
        if k == "annotation":
            row["ungate"] = report.summary(
                [x for p in batch if (x := p.ungate_latency()) is not None]
            )
        if k == "claim":
            row["steps"] = claim_step_summaries(batch, claims.steps)
        kinds[k] = row
        out["correctness"][f"{k}_pods_not_gone"] = sum(
            1 for p in batch if p.created and p.gone is None
        )
    out["correctness"].update(left)
    vnpu_pods = kinds["claim"]["created"] + kinds["annotation"]["created"]
    all_pods = vnpu_pods + kinds["plain"]["created"]
    out["kinds"] = kinds
    out["binding_conditions"] = binding_wait(sched0, sched1)
    out["cpu"] = {
        "window_s": spent["window_s"],
        "machine": spent["machine"],
        "seconds": spent["cpu_seconds"],
        "idle_per_s": idle_per_s,
        "ms_per_pod_any_kind_over_idle": over_idle(
            spent["cpu_seconds"], idle_per_s, spent["window_s"], all_pods
        ),
        "operator_ms_per_vnpu_pod_over_idle": over_idle(
            spent["cpu_seconds"], idle_per_s, spent["window_s"], vnpu_pods
        ).get("vnpu-operator"),
    }
    out["ratios"] = ratios(kinds)


def ratios(kinds: dict[str, Any]) -> dict[str, Any]:
    """Each vNPU kind's created -> running over plain pods', p50 and p99, and the goal."""
    base = kinds["plain"]["running"]
    out: dict[str, Any] = {}
    for k in ("claim", "annotation"):
        for p in ("p50", "p99"):
            out[f"{k}_{p}"] = report.ratio_of(kinds[k]["running"].get(p), base.get(p))
    r = out["claim_p99"]
    out["goal"] = f"claim p99 <= {GOAL_P99_RATIO}x plain p99"
    out["goal_met"] = r is not None and r <= GOAL_P99_RATIO
    return out


def _s(v: Any) -> str:
    return "-" if v is None else f"{v:.3f} s"


def _x(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:.1f} ms"


def markdown(r: dict[str, Any]) -> str:
    """The run's figures as a short markdown summary."""
    c, k, rat = r["config"], r["kinds"], r["ratios"]
    lines = [
        f"### bench-dra: {c['nodes']} DRA + {c['nodes']} annotation nodes, "
        f"{c['pods']} pods of each kind at {c['rate']:g}/s each, held {c['hold']:g} s",
        "",
        f"Machine: {r['machine']['cpus_usable']} cores, {r['machine']['model']}; "
        f"run {r.get('runtime_s', 0):.0f} s.",
        "",
        "| | claim pods | annotation pods | plain pods |",
        "|---|---|---|---|",
    ]

    def row(label: str, cells: list[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("created -> running p50 / p99", [
        f"{_s(k[x]['running']['p50'])} / {_s(k[x]['running']['p99'])}" for x in KINDS
    ])  # fmt: skip
    row("p50 / p99 over plain pods' (the floor)", [
        f"{_x(rat['claim_p50'])} / {_x(rat['claim_p99'])}",
        f"{_x(rat['annotation_p50'])} / {_x(rat['annotation_p99'])}", "1x",
    ])  # fmt: skip
    row("deleted -> gone p50 / p99", [
        f"{_s(k[x]['gone']['p50'])} / {_s(k[x]['gone']['p99'])}" for x in KINDS
    ])  # fmt: skip
    row("fill: ran / asked", [
        f"{k[x]['admitted']} / {k[x]['asked']} ({100 * k[x]['fill_rate']:.1f}%)" for x in KINDS
    ])  # fmt: skip
    row("API writes per pod (its namespace; + its nodes' objects)", [
        f"{k[x]['writes']['per_pod']:.2f}"
        + (f" ({k[x]['writes_per_pod_with_nodes']:.2f})" if "writes_per_pod_with_nodes" in k[x]
           else "")
        for x in KINDS
    ])  # fmt: skip
    row(
        "  of which ours (operator, agent)",
        [f"{k[x]['writes']['ours_per_pod']:.2f}" for x in KINDS],
    )
    row("agent CPU per pod, idle rate out", [
        _ms(k["claim"].get("agent_cpu_ms_per_pod")),
        _ms(k["annotation"].get("agent_cpu_ms_per_pod")), "-",
    ])  # fmt: skip
    cpu = r["cpu"]
    per = cpu["ms_per_pod_any_kind_over_idle"]
    lines += [
        "",
        f"Operator CPU per vNPU pod (claim and annotation together, one operator), idle rate "
        f"out: {_ms(cpu['operator_ms_per_vnpu_pod_over_idle'])}. Per pod of any kind: "
        f"API server {_ms(per.get('kube-apiserver'))}, scheduler {_ms(per.get('kube-scheduler'))}"
        f", etcd {_ms(per.get('etcd'))}; the cores {100 * cpu['machine']['busy']:.0f}% busy "
        "in the churn.",
    ]
    st = k["claim"].get("steps") or {}
    b = r["binding_conditions"]
    if b.get("metric"):
        sched = (
            f"the scheduler's `{b['metric']}`: {b['count']:.0f} waits (one per device), "
            f"mean {_s(b['mean'])}, "
            f"p50 <= {_s(b['p50_at_most'])}, p99 <= {_s(b['p99_at_most'])}"
        )
        ok = b.get("success")
        if ok:
            sched += f" (succeeded: {ok['count']:.0f}, mean {_s(ok['mean'])})"
    else:
        sched = "the scheduler serves no binding-condition histogram"
    parts = [
        f"{label} p50 / p99 {_s((st.get(key) or {}).get('p50'))} / "
        f"{_s((st.get(key) or {}).get('p99'))}"
        for key, label in (
            ("created_to_allocated", "created -> allocated"),
            ("allocated_to_ready", "allocated -> vNPU ready"),
            ("ready_to_bound", "ready -> bound"),
            ("bound_to_running", "bound -> running"),
        )
    ]
    wait = st.get("allocated_to_bound") or {}
    lines += [
        "",
        f"Binding-condition wait of claim pods (allocated -> bound, by the watches): p50 / p99 "
        f"{_s(wait.get('p50'))} / {_s(wait.get('p99'))}; {sched}.",
        "Claim pods' steps: " + "; ".join(parts) + ".",
        "",
        f"Goal ({rat['goal']}): {'met' if rat['goal_met'] else 'NOT met'} "
        f"({_x(rat['claim_p99'])}).",
    ]
    bad = {n: v for n, v in r["correctness"].items() if v}
    lines.append(f"Correctness counters: {bad if bad else 'all 0'}.")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.dra", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=20, help="nodes of each mode (DRA, annotation)")
    p.add_argument("--pods", type=int, default=300, help="pods of each kind")
    p.add_argument("--rate", type=float, default=3.0, help="pods created per second, each kind")
    p.add_argument("--hold", type=float, default=20.0, help="seconds each pod lives")
    p.add_argument("--idle", type=float, default=20.0, help="idle window for the idle CPU rate")
    add_plane_args(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out = on_plane(args, 1, start, phases)
    if args.out:
        args.out.write_text(json.dumps(out, indent=2, default=str))
    print()
    print(markdown(out))
    return report.failed(out["correctness"])


if __name__ == "__main__":
    raise SystemExit(main())
