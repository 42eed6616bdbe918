"""Audit-log tallies, apiserver request counters, percentiles and the
printed table (the correctness snapshot: bench/snapshot.py)."""

from __future__ import annotations

import json
import math
import re
import ssl
import sys
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bench.stacks import LOOP
from localplane import LocalPlane
from vnpu_common.kube.rawcall import call_json
from vnpu_common.wire import names

OURS = {names.USER_AGENT_OPERATOR: "operator", names.USER_AGENT_AGENT: "agent"}
OTHERS = {"vnpu-bench": "bench-driver", "vnpu-floor": "floor"}
# The benchmark's names of the agent processes: vnpu-agent-0, -1, ...
AGENT_PROCESS = "vnpu-agent"


def agents_total(by_process: Mapping[str, float]) -> float:
    """The sum over every agent process of a per-process figure."""
    return sum(v for k, v in by_process.items() if k.startswith(AGENT_PROCESS))


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    # Nearest rank, ceil(p% of n). round(x + 0.5) rounded half to even: p99 of
    # 100 values was the maximum, p50 the 50th.
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(p * len(s) / 100) - 1))]


def summary(values: list[float], ps: tuple[int, ...] = (50, 90, 99)) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(values)}
    for p in ps:
        out[f"p{p}"] = pct(values, p)
    out["max"] = max(values) if values else None
    return out


def component(event: dict[str, Any]) -> str:
    agent = str(event.get("userAgent", ""))
    for prefix, name in {**OURS, **OTHERS}.items():
        if agent.startswith(prefix):
            return name
    return agent.split("/")[0] or "?"


def what(event: dict[str, Any]) -> str:
    ref = event.get("objectRef") or {}
    resource = str(ref.get("resource", "?"))
    if ref.get("subresource"):
        resource += "/" + ref["subresource"]
    return f"{event.get('verb')} {resource}"


# Verbs the benchmark's plane audits only for the periodic work's timeline
# (bench/timeline.py): every count of writes leaves them out.
READS = frozenset({"get", "list", "watch"})


def audit_events(path: Path, start: int, end: int, *, reads: bool = False) -> list[dict[str, Any]]:
    """The audit log's completed requests between two offsets: the writes,
    and with `reads` the reads it holds too."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    out = []
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("stage") == "ResponseComplete" and (reads or e.get("verb") not in READS):
            out.append(e)
    return out


def release_write_rows(writes: dict[str, dict[str, int]]) -> list[tuple[str, str]]:
    """The release window's writes (component -> "verb resource" -> count) as
    report rows: the busiest component first, its five commonest writes."""
    rows = []
    for who, counts in sorted(writes.items(), key=lambda x: (-sum(x[1].values()), x[0])):
        top = sorted(counts.items(), key=lambda x: (-x[1], x[0]))[:5]
        rows.append(
            (
                f"  release's writes: {who}",
                f"{sum(counts.values())}  " + ", ".join(f"{k} {v}" for k, v in top),
            )
        )
    return rows


def tally(events: list[dict[str, Any]]) -> dict[str, Counter[str]]:
    """component -> Counter of "verb resource"."""
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for e in events:
        out[component(e)][what(e)] += 1
    return out


def per_lifecycle(events: list[dict[str, Any]], namespace: str, pods: int) -> dict[str, Any]:
    """Our components' writes per pod: about the pods (namespace objects),
    node inventory (VNPUNode) and Leases separately."""
    about_pod: Counter[str] = Counter()
    inventory: Counter[str] = Counter()
    leases: Counter[str] = Counter()
    for e in events:
        who = component(e)
        if who not in OURS.values():
            continue
        ref = e.get("objectRef") or {}
        key = f"{who}: {what(e)}"
        if ref.get("resource") == "leases":
            leases[key] += 1
        elif ref.get("namespace") == namespace:
            about_pod[key] += 1
        else:
            inventory[key] += 1
    n = max(1, pods)
    return {
        "pods": pods,
        "about_pod": {k: v / n for k, v in sorted(about_pod.items())},
        "node_inventory": {k: v / n for k, v in sorted(inventory.items())},
        "leases_total": sum(leases.values()),
        "per_pod_total": sum(about_pod.values()) / n,
        "per_pod_with_inventory": (sum(about_pod.values()) + sum(inventory.values())) / n,
    }


_METRIC = re.compile(r"^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$")
_WEBHOOK = re.compile(r"^apiserver_admission_webhook_request_total\{([^}]*)\} ([0-9.e+]+)$")


async def events_by_reason(core: Any, namespace: str) -> dict[str, int]:
    """Events our components posted in `namespace`, by component and reason:
    which Events make up the writes per pod, and why pods waited."""
    listed = await call_json(core.list_namespaced_event, namespace)
    counts: Counter[str] = Counter()
    for item in listed.get("items") or []:
        who = (item.get("source") or {}).get("component") or item.get("reportingComponent", "")
        if str(who).startswith("vnpu"):
            counts[f"{who}: {item.get('reason')}"] += item.get("count") or 1
    return dict(counts.most_common())


def _apiserver_metrics(plane: LocalPlane) -> str:
    ctx = ssl.create_default_context(cafile=str(plane.ca_file))
    ctx.load_cert_chain(plane.pki / "admin.crt", plane.pki / "admin.key")
    with urllib.request.urlopen(f"{plane.server}/metrics", timeout=30, context=ctx) as r:
        return str(r.read().decode())


def webhook_calls(plane: LocalPlane) -> Counter[str]:
    """Admission webhook calls the API server made, by "webhook operation"
    (apiserver_admission_webhook_request_total): each is an AdmissionReview
    the operator parses."""
    return webhook_calls_in(_apiserver_metrics(plane))


def webhook_calls_in(text: str) -> Counter[str]:
    out: Counter[str] = Counter()
    for line in text.splitlines():
        m = _WEBHOOK.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            out[f"{labels.get('name', '?')} {labels.get('operation', '?')}"] += int(
                float(m.group(2))
            )
    return out


def apiserver_requests(plane: LocalPlane) -> Counter[str]:
    """apiserver_request_total by "verb resource[/subresource]" (all clients,
    reads included: the audit log records writes only)."""
    text = _apiserver_metrics(plane)
    out: Counter[str] = Counter()
    for line in text.splitlines():
        m = _METRIC.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        res = labels.get("resource", "") + (
            "/" + labels["subresource"] if labels.get("subresource") else ""
        )
        out[f"{labels.get('verb', '?')} {res}"] += int(float(m.group(2)))
    return out


def cores_busy(churn: dict[str, Any]) -> float:
    """How many cores the processes we measure kept busy on average through the churn."""
    cpu = churn.get("cpu_seconds") or {}
    return float(sum(cpu.values())) / max(churn.get("duration_s") or 0, 1e-9)


def churn_machine_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """The machine through each churn, ours / floor: how busy its cores
    were, how much time the hypervisor took, and the API server's CPU per
    pod. The two churns run minutes apart, and a machine that slowed
    between them moves the ratios above; nothing for runs without both."""
    ours, floor = r.get("churn") or {}, (r.get("floor") or {}).get("churn") or {}
    mo, mf = ours.get("machine"), floor.get("machine")
    if not mo or not mf:
        return []

    def pct(m: dict[str, float], key: str) -> str:
        return f"{100 * m[key]:.1f}%"

    rows = [
        ("  the churn's machine, ours / floor",
         f"cores busy {pct(mo, 'busy')} / {pct(mf, 'busy')}, "
         f"stolen {pct(mo, 'steal')} / {pct(mf, 'steal')}"),
    ]  # fmt: skip
    pods = int((r.get("config") or {}).get("pods") or 0)
    api_o = (ours.get("cpu_seconds") or {}).get("kube-apiserver")
    api_f = (floor.get("cpu_seconds") or {}).get("kube-apiserver")
    if pods and api_o is not None and api_f is not None:
        rows.append(("  API server CPU ms per pod in the churn, ours / floor",
                     f"{1000 * api_o / pods:.1f} / {1000 * api_f / pods:.1f}"))  # fmt: skip
    return rows


def burst_cpu_rows(burst: dict[str, Any]) -> list[tuple[str, str]]:
    """Cores busy through each burst, then each process's CPU ms per burst
    pod, ours / floor, largest first (the floor's writer runs inside the
    bench-driver). Nothing for a run without the burst's CPU."""
    cpu = burst.get("cpu") or {}
    ours, floor = cpu.get("ours"), cpu.get("floor")
    pods = burst.get("pods") or 0
    if not ours or not pods:
        return []

    def busy(w: dict[str, Any] | None) -> str:
        return "-" if not w else f"{sum(w['cpu_seconds'].values()) / max(w['window_s'], 1e-9):.2f}"

    def ms(w: dict[str, Any] | None, name: str) -> str:
        seconds = (w or {}).get("cpu_seconds", {}).get(name)
        return "-" if seconds is None else f"{1000 * seconds / pods:.1f}"

    rows = [("  burst cores busy, ours / floor", f"{busy(ours)} / {busy(floor)}")]
    rows.append(("  burst CPU ms per pod, ours / floor", ""))
    for name in sorted(ours["cpu_seconds"], key=lambda k: -ours["cpu_seconds"][k]):
        rows.append((f"    {name}", f"{ms(ours, name)} / {ms(floor, name)}"))
    return rows


def apiserver_ms_per_pod(profiled: dict[str, Any] | None, pods: int) -> dict[str, float]:
    """A profiled churn's API server CPU per pod (ms) by kind of work."""
    if not profiled or "error" in profiled or pods <= 0:
        return {}
    total = 1000 * float(profiled["cpu_seconds"]) / pods
    return {str(name): total * float(share) for name, share in profiled["shares"]}


def phase_apiserver_rows(
    r: dict[str, Any], phase: str = "churn", pods: int | None = None
) -> list[tuple[str, str]]:
    """A phase's API server profile per pod (the churn's, or the burst's),
    ours beside the floor's, by kind, largest difference first: what ours
    costs the API server more."""
    got = r.get(f"{phase}_apiserver_cpu")
    if not got:
        return []
    if "error" in got:
        return [(f"  API server CPU in the {phase} (profile)", f"not read: {got['error']}")]
    pods = int(r["config"]["pods"]) if pods is None else pods
    ours = apiserver_ms_per_pod(got, pods)
    floor = apiserver_ms_per_pod(((r.get("floor") or {}).get(f"{phase}_apiserver_cpu")), pods)
    rows = [(f"  API server CPU ms per pod in the {phase} (profile), ours / floor",
             f"{sum(ours.values()):.1f} / {sum(floor.values()):.1f}" if floor
             else f"{sum(ours.values()):.1f} / -")]  # fmt: skip
    for name in sorted(set(ours) | set(floor), key=lambda k: floor.get(k, 0) - ours.get(k, 0)):
        there = f"{floor[name]:.1f}" if name in floor else "-"
        rows.append((f"    {name}", f"{ours.get(name, 0.0):.1f} / {there}"))
    return rows


def apiserver_rows(profiled: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The release's API server profile (bench/apiprofile.py) as rows."""
    if not profiled:
        return []
    if "error" in profiled:
        return [("  the API server's CPU (profile)", f"not read: {profiled['error']}")]

    def shares(pairs: list[list[Any]]) -> str:
        return ", ".join(f"{name} {share:.0%}" for name, share in pairs)

    rows = [(f"  the API server's CPU ({profiled['cpu_seconds']:.1f} s profiled)",
             shares(profiled["shares"]))]  # fmt: skip
    if profiled.get("custom_resources"):
        rows.append(("    custom resources by request", shares(profiled["custom_resources"])))
    return rows


def saturation_hint(r: dict[str, Any], cores: int, stuck_seconds: float) -> str | None:
    """Why pods counted stuck gated may be late rather than lost: the churn kept
    the machine's cores (nearly) all busy, or the logic-free floor itself kept
    pods gated past the bound. None when neither holds or nothing was stuck."""
    if not (r.get("correctness") or {}).get("churn_pods_stuck_gated"):
        return None
    busy = cores_busy(r.get("churn") or {})
    floor_p99 = ((((r.get("floor") or {}).get("churn") or {}).get("ungate")) or {}).get("p99")
    why = []
    if cores > 0 and busy >= 0.9 * cores:
        why.append(f"{busy:.2f} of {cores} cores busy through the churn")
    if floor_p99 is not None and floor_p99 > stuck_seconds:
        why.append(f"the logic-free floor's own created -> ungated p99 was {floor_p99:.1f}s")
    if not why:
        return None
    return (
        f"the machine was saturated ({'; '.join(why)}): here pods gated over "
        f"{stuck_seconds:g}s may be late, not lost (their latencies are above); a lower --rate "
        "or more cores tells the two apart"
    )


def failed(counters: Mapping[str, int]) -> int:
    """The exit status of a run with these correctness counters: 1, said on
    stderr, where one is not 0."""
    bad = {k: v for k, v in counters.items() if v}
    if bad:
        print(f"FAIL: correctness counters not 0: {bad}", file=sys.stderr)
        return 1
    return 0


def fmt(v: Any, unit: str = "s") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}{unit}" if unit == "s" else f"{v:.2f}{unit}"
    return f"{v}{unit}"


def print_table(r: dict[str, Any], more: Callable[[], None] | None = None) -> None:
    """The results; `more` prints further sections before the correctness counters."""

    def row(k: str, v: str) -> None:
        print(f"  {k:<44} {v}")

    c = r["config"]
    print("\n=== vnpu-operator scale benchmark")
    row("nodes x chips / pods / rate / hold", f"{c['nodes']} x 8 / {c['pods']} / "
        f"{c['rate']}/s / {c['hold']}s  (agents: {c['agents']} process(es))")  # fmt: skip
    st = r.get("startup") or {}
    if "nodes_ready_s" in st:
        row("startup: nodes Ready / all VNPUNodes / operator",
            f"{st['nodes_ready_s']:.1f}s / {st['agents_to_all_vnpunodes_s']:.1f}s / "
            f"{st['operator_ready_s']:.1f}s")  # fmt: skip
    if "node_files_on_tmpfs" in st:
        where = "tmpfs, as /var/run/cdi on a node" if st["node_files_on_tmpfs"] else "disk"
        row("agent node files (CDI specs, sim state)", where)
    print("-- churn (ours)")
    floor = r.get("floor")
    for key, label in (("ungate", "created -> ungated"), ("gone", "deleted -> gone")):
        s = r["churn"][key]
        row(label, "  ".join(f"{p} {fmt(s.get(p))}" for p in ("p50", "p90", "p99", "max")))
        if floor is None:
            continue
        f = floor["churn"][key]
        row(
            f"  floor {label}",
            "  ".join(f"{p} {fmt(f.get(p))}" for p in ("p50", "p90", "p99", "max")),
        )
        row("  ratio ours/floor p50, p99", f"{fmt(r['ratios'][key + '_p50'], 'x')}  "
            f"{fmt(r['ratios'][key + '_p99'], 'x')}")  # fmt: skip
    for label, value in churn_machine_rows(r) + phase_apiserver_rows(r):
        row(label, value)
    if "burst" not in r:
        # A churn-only run (bench.scale's sizes): no fill, no writes table.
        print_stacks(r.get("stacks") or {})
        print("-- correctness (all must be 0)")
        for k, v in r["correctness"].items():
            row(f"  {k}", str(v))
        return
    b = r["burst"]
    if floor is None:
        row("burst throughput ours (pods/s)",
            f"{fmt(b['ours_pods_per_s'], '')}  (floor not replayed)")  # fmt: skip
    else:
        row("burst throughput ours / floor (pods/s)", f"{fmt(b['ours_pods_per_s'], '')} / "
            f"{fmt(b['floor_pods_per_s'], '')}"
            f"  ratio {fmt(r['ratios']['throughput'], 'x')}")  # fmt: skip
    for label, value in burst_cpu_rows(b) + phase_apiserver_rows(r, "burst", b["pods"]):
        row(label, value)
    f2 = r["fill"]
    row("fill: placed / waiting / freed", f"{f2['placed']} / {f2['waiting']} / {f2['freed']}")
    rate = f2.get("release_rate")
    row("  the freed pods deleted", f"at {rate:g}/s" if rate else "all at once")

    def delays(summary: dict[str, Any]) -> str:
        return "  ".join(f"{p} {fmt(summary.get(p))}" for p in ("p50", "p99", "max"))

    for key, label in (
        ("gone_to_placed", "allocations gone -> waiting pod placed"),
        ("gone_to_creates_sent", "  of which: -> operator sent the creates"),
        ("creates_sent_to_placed", "  of which: creates sent -> placed (API)"),
        ("gone_to_ungated", "allocations gone -> waiting pod ungated"),
        ("wait_to_place", "pods deleted -> waiting pod ungated"),
    ):
        if key in f2:
            row(f"  {label}", delays(f2[key]))
    if "release_cpu_seconds" in f2:
        spent = f2["release_cpu_seconds"]
        top = sorted(spent.items(), key=lambda x: -x[1])[:6]
        row(
            f"  release's CPU s in {f2['release_window_s']:.1f}s (total {sum(spent.values()):.1f})",
            ", ".join(f"{k} {v:.1f}" for k, v in top),
        )
    for label, value in release_write_rows(f2.get("release_writes") or {}):
        row(label, value)
    served = f2.get("served") or {}
    for key, label in (
        ("gone_to_placed", "as served: freed -> placed"),
        ("gone_to_creates_sent", "  of which: -> operator sent the creates"),
        ("creates_sent_to_placed", "  of which: creates sent -> served"),
    ):
        if key in served:
            row(f"  {label}", delays(served[key]))
    for label, value in apiserver_rows(r.get("release_apiserver_cpu")):
        row(label, value)
    w = r["writes_per_lifecycle"]
    print(f"-- our writes per pod lifecycle (churn, {w['pods']} pods)")
    for k, v in w["about_pod"].items():
        row(f"  {k}", f"{v:.2f}")
    for k, v in w["node_inventory"].items():
        row(f"  {k} (node inventory)", f"{v:.2f}")
    row("total about the pod / incl. inventory", f"{w['per_pod_total']:.2f} / "
        f"{w['per_pod_with_inventory']:.2f}  (target <= 8)")  # fmt: skip
    row("lease writes during churn", str(w["leases_total"]))
    print("-- all writes during churn by component (audit)")
    for who, counts in sorted(
        r["churn_writes_by_component"].items(), key=lambda x: -sum(x[1].values())
    ):
        row(f"  {who}", f"{sum(counts.values())}  " + ", ".join(
            f"{k} {v}" for k, v in sorted(counts.items(), key=lambda x: -x[1])[:4]))  # fmt: skip
    i = r["idle"]
    row(f"idle {i['seconds']:.0f}s: our writes/s (non-lease writes)",
        f"{i['writes_per_s']:.2f}/s ({i['non_lease_writes']})  {i['kinds']}")  # fmt: skip
    p = r["processes"]
    row("operator CPU s / peak RSS", f"{p['operator']['cpu_seconds']:.1f}s / "
        f"{p['operator']['peak_rss_mb']:.1f} MB (target <= 200 MB at 200 nodes, "
        "300 MB at 1000)")  # fmt: skip
    if "leader_step_downs" in p["operator"]:
        row("operator: times it stopped leading", str(p["operator"]["leader_step_downs"]))
    row("agent(s) CPU s / peak RSS", f"{p['agents']['cpu_seconds']:.1f}s / "
        f"{p['agents']['peak_rss_mb']:.1f} MB; base {p['agents']['base_rss_mb']:.1f} MB; "
        f"{p['agents']['mb_per_node_over_base']:.3f} MB/node (target <= 1)")  # fmt: skip
    cpu = r["churn"].get("cpu_seconds") or {}
    if cpu:
        row("churn CPU s by process", f"{cores_busy(r['churn']):.2f} of the cores busy on average")
        for name, seconds in sorted(cpu.items(), key=lambda kv: -kv[1]):
            row(f"  {name}", f"{seconds:.1f}s")
    lean = r["churn"].get("cpu_ms_per_pod_over_idle") or {}
    if lean:
        agents = agents_total(lean)
        agents_idle = agents_total(r["idle"].get("cpu_per_s") or {})
        row("CPU ms per pod, idle rate taken out", f"operator {lean.get('vnpu-operator', 0):.1f}, "
            f"agent(s) {agents:.1f}  (idle: agent(s) {1000 * agents_idle:.0f} ms/s, "
            "Lease renewals and resyncs)")  # fmt: skip
        driver = agents_total(r["churn"].get("driver_ms_per_pod_over_idle") or {})
        row("  agent(s): own code / simulated driver", f"{agents - driver:.1f} / {driver:.1f}  "
            "(the driver calls' threads: the simulator, in place of the chips)")  # fmt: skip
    print_stacks(r.get("stacks") or {})
    print_floors(r, row)
    if more is not None:
        more()
    print("-- correctness (all must be 0)")
    for k, v in r["correctness"].items():
        row(f"  {k}", str(v))
    row("runtime", f"{r['runtime_s']:.0f}s")


def print_stacks(by_process: dict[str, Any], limit: int = 12) -> None:
    """Where each process's churn CPU went, by py-spy's samples (bench/stacks.py)."""
    for name, prof in sorted(by_process.items()):
        print(f"-- {name}: where the churn's CPU went ({prof['samples']} samples, py-spy; "
              "inclusive shares)")  # fmt: skip
        print(f"    {100 * prof['loop_share']:5.1f}%  innermost frame: {LOOP}")
        for fn, share in prof["top"][:limit]:
            print(f"    {100 * share:5.1f}%  {fn}")


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:.2f} ms"


def print_floors(r: dict[str, Any], row: Any) -> None:
    """Baseline, Kopf floor and sustainable rate, where the run measured them."""
    churn = r["churn"]
    hooks = churn.get("webhook_calls_per_pod") or {}
    if hooks:
        row("admission calls per pod (churn)", ", ".join(f"{k} {v:.2f}" for k, v in hooks.items()))
    base = r.get("baseline")
    if base:
        print(f"-- baseline: the same churn with plain pods ({base['pods']} pods, no operator)")
        diff = r["ours_minus_baseline"]
        for key, label in (("scheduled", "created -> scheduled"), ("running", "created -> Running"),
                           ("gone", "deleted -> gone")):  # fmt: skip
            o, b = churn.get(key) or {}, base[key]
            # n: pods that got there (one deleted first is not in the percentiles).
            row(f"{label} p50 / p99 ours",
                f"{fmt(o.get('p50'))} / {fmt(o.get('p99'))}  (n {o.get('n')})")  # fmt: skip
            row("  baseline", f"{fmt(b.get('p50'))} / {fmt(b.get('p99'))}  (n {b.get('n')})")
            row("  ours - baseline", f"{fmt(diff[key]['p50'])} / {fmt(diff[key]['p99'])}")
        oc, bc = churn.get("cpu_ms_per_pod") or {}, base["cpu_ms_per_pod"]
        row("CPU ms per pod by process", "ours / baseline / ours - baseline")
        for k in sorted(set(oc) | set(bc), key=lambda k: -(oc.get(k, 0))):
            row(f"  {k}", f"{oc.get(k, 0):.1f} / {bc.get(k, 0):.1f} / "
                f"{diff['cpu_ms_per_pod'][k]:.1f}")  # fmt: skip
    kf = r.get("kopf_floor")
    if kf:
        print(f"-- Kopf's floor: empty handlers beside the operator ({kf['pods']} pods)")
        for who, c in kf["watch_per_pod"].items():
            kinds = ", ".join(f"{k} {v['events']:.1f}" for k, v in c["by_kind"].items())
            row(f"  {who} watch events / KB per pod", f"{c['events']:.1f} / "
                f"{c['bytes'] / 1024:.1f} KB  ({kinds})")  # fmt: skip
        ms, mp = kf["cpu_ms_per_event"], kf["cpu_ms_per_pod"]
        row(
            "CPU per event: operator / Kopf floor",
            f"{_ms(ms['operator'])} / {_ms(ms['kopf_floor'])}  "
            f"ratio {fmt(ratio_of(ms['operator'], ms['kopf_floor']), 'x')}",
        )
        row("CPU per event: agent(s)", _ms(ms["agents"]))
        row("CPU per pod: operator / Kopf floor / agent(s)",
            f"{mp['operator']:.1f} / {mp['kopf_floor']:.1f} / {mp['agents']:.1f} ms")  # fmt: skip
    rs = r.get("rate_search")
    if rs:
        print(f"-- sustainable rate (p99 <= {rs['ours']['limit_s']}s: ours created -> ungated, "
              "baseline created -> scheduled)")  # fmt: skip
        for who in ("ours", "baseline"):
            s = rs.get(who)
            if not s:
                continue
            steps = ", ".join(f"{x['rate']:g}/s {'ok' if x['ok'] else 'fail'} "
                              f"(p99 {fmt(x['p99'])})" for x in s["steps"])  # fmt: skip
            row(f"  {who}", f"{fmt(s['best_pods_per_s'], ' pods/s')}  [{s['stopped']}]")
            row("    steps", steps)
        row("  ours / baseline", fmt(rs.get("ratio_ours_to_baseline"), "x"))


def ratio_of(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None
