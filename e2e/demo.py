"""`make demo`: the whole story of vnpu-operator on a local control plane.

Brings up a real control plane on loopback (etcd, kube-apiserver,
controller-manager, scheduler, kwok), creates kwok nodes with simulated
Ascend chips, runs the node agent and the operator as real processes, and
walks through what a user sees: pods asking for vNPUs by annotation, the
webhook refusing a bad request, a pod waiting for capacity, a vNPU that is
kept although its pod never touched it, and every vNPU destroyed when the
pods go. Exits non-zero, with the reason, if anything is not as shown.

Everything is stopped at the end; pass `--keep` to leave the plane running
(in .localplane; the KUBECONFIG to export is printed).

Needs `hack` (the localplane package) on PYTHONPATH; `make demo` sets it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localplane import LocalPlane, NodeSpec
from localplane.components import AGENT_NAMESPACE, AgentProcess, OperatorProcess, vnpu_ids
from localplane.plane import REPO_ROOT, PlaneError
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from vnpu_agent.drivers.base import ANY_VNPU_ID
from vnpu_common.wire import names

NS = "demo"
QUOTA_NS = "team-q"
NODE_VNPU_CAPACITY = (
    "custom-columns=NODE:.metadata.name,VNPUS:.status.capacity.vnpu\\.io/vnpus,"
    "AICORE:.status.capacity.vnpu\\.io/aicore,MEMORY-MB:.status.capacity.vnpu\\.io/memory-mb"
)
NODES = [
    NodeSpec(name="npu-910b-1", chips={"910B3": 4}),
    NodeSpec(name="npu-910b-2", chips={"910B3": 4}),
    NodeSpec(name="npu-310p-1", chips={"310P3": 2}),
]

# Agent intervals shortened so the demo runs in seconds. In production the
# defaults are --resync-seconds=30 (how often the agent compares driver and
# allocations, collects orphans and checks health) and --gc-grace-seconds=120
# (how long a vNPU nobody declared must stay unused before it is destroyed).
RESYNC_SECONDS = 0.5
GC_GRACE_SECONDS = 2.0
AGENT_SETTINGS = {
    **AgentProcess.QUICK,
    "resync-seconds": RESYNC_SECONDS,
    "gc-grace-seconds": GC_GRACE_SECONDS,
    # vNPUs the agent did not create (a leak, a config-recover replay after a
    # reboot) are only reported by default; the demo collects them.
    "foreign-vnpu-policy": "collect",
}


def columns(**cols: str) -> str:
    """`-o custom-columns=...`; keyword underscores become dashes in the header."""
    return "custom-columns=" + ",".join(f"{k.replace('_', '-')}:{v}" for k, v in cols.items())


def ann(key: str) -> str:
    """JSONPath of an annotation (dots in the key escaped)."""
    return ".metadata.annotations." + key.replace(".", "\\.")


CRD_COLUMNS = columns(NAME=".metadata.name", SHORT=".spec.names.shortNames", SCOPE=".spec.scope")
NODE_COLUMNS = columns(
    NAME=".metadata.name",
    READY='.status.conditions[?(@.type=="Ready")].status',
    NPU=".metadata.labels." + names.LABEL_NPU_NODE.replace(".", "\\."),
    CHIPS=ann(names.ANN_SIM_CHIPS),
)
POD_COLUMNS = columns(
    NAME=".metadata.name",
    STATUS=".status.phase",
    NODE=".spec.nodeName",
    TEMPLATE=ann(names.ANN_TEMPLATE),
    COUNT=ann(names.ANN_COUNT),
    VISIBLE_DEVICES=ann(names.ANN_VISIBLE_DEVICES),
    GATES=".spec.schedulingGates[*].name",
)
ENV_JSONPATH = (
    "jsonpath={range .spec.containers[0].env[*]}"
    '{.name}={.value}{.valueFrom.fieldRef.fieldPath}{"\\n"}{end}'
)
CONDITION_JSONPATH = (
    f'jsonpath={{range .status.conditions[?(@.type=="{names.POD_COND_ALLOCATED}")]}}'
    '{.type}={.status} reason={.reason}{"\\n"}  {.message}{"\\n"}{end}'
)


class DemoError(Exception):
    """Something is not as the demo says it is."""


# --------------------------------------------------------------- printing


def banner(title: str, text: str = "") -> None:
    print(f"\n=== {title}", flush=True)
    paras = [textwrap.fill(" ".join(p.split()), width=88) for p in text.split("\n\n")]
    print("\n\n".join(textwrap.indent(p, "    ") for p in paras if p), flush=True)


def say(text: str) -> None:
    print(f"  > {text}", flush=True)


def kubectl(
    plane: LocalPlane, *args: str, expect_fail: bool = False, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs kubectl as a user would type it and prints command and output; `stdin`
    (a manifest for `-f -`) is printed as a here-document."""
    if stdin is None:
        print(f"$ kubectl {shlex.join(args)}", flush=True)
    else:
        print(f"$ kubectl {shlex.join(args)} <<EOF\n{stdin.rstrip()}\nEOF", flush=True)
    out = plane.kubectl(*args, check=False, timeout=120, input=stdin)
    text = (out.stdout + out.stderr).rstrip()
    if text:
        print(text, flush=True)
    if expect_fail and out.returncode == 0:
        raise DemoError(f"`kubectl {shlex.join(args)}` was expected to fail but succeeded")
    if not expect_fail and out.returncode != 0:
        raise DemoError(f"`kubectl {shlex.join(args)}` failed: {out.stderr.strip()}")
    return out


def table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("   ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


# --------------------------------------------------------------- helpers


def run_pod(
    plane: LocalPlane,
    name: str,
    template: str,
    count: int | None = None,
    chip_model: str | None = None,
    *,
    expect_fail: bool = False,
) -> None:
    """The pod `vnpu_pod` describes, created the way a user would type it."""
    manifest = vnpu_pod(name, NS, template=template, count=count, chip_model=chip_model)
    (container,) = manifest["spec"]["containers"]
    args = ["run", name, "-n", NS, f"--image={container['image']}"]
    args += [f"--annotations={k}={v}" for k, v in manifest["metadata"]["annotations"].items()]
    kubectl(plane, *args, expect_fail=expect_fail)


def pod(plane: LocalPlane, name: str) -> dict[str, Any] | None:
    out: dict[str, Any] | None = plane.get_json("pod", "-n", NS, name)
    return out


def phase_of(plane: LocalPlane, name: str) -> str:
    p = pod(plane, name)
    return "(gone)" if p is None else str(p.get("status", {}).get("phase"))


def wait_running(plane: LocalPlane, pods: list[str], timeout: float = 60) -> None:
    def check() -> bool:
        return all(phase_of(plane, n) == "Running" for n in pods)

    try:
        wait_for("pods Running", check, timeout=timeout)
    except AssertionError:
        state = ", ".join(f"{n}={phase_of(plane, n)}" for n in pods)
        raise DemoError(f"pods not Running after {timeout:.0f}s: {state}") from None


def allocated_condition(plane: LocalPlane, name: str) -> dict[str, Any] | None:
    p = pod(plane, name) or {}
    for cond in p.get("status", {}).get("conditions") or []:
        if cond.get("type") == names.POD_COND_ALLOCATED:
            return dict(cond)
    return None


def allocations(plane: LocalPlane) -> list[dict[str, Any]]:
    return list((plane.get_json(names.ALLOCATION_PLURAL, "-A") or {}).get("items", []))


def vnpu_owners(plane: LocalPlane) -> dict[tuple[str, int], str]:
    """(node, vNPU id) -> pod name, from the allocations."""
    return {
        (a["spec"]["nodeName"], a["spec"]["vnpuId"]): a["spec"]["podName"]
        for a in allocations(plane)
    }


def inventory_vnpus(plane: LocalPlane) -> int:
    items = (plane.get_json(names.NODE_PLURAL) or {}).get("items", [])
    return sum(int(i.get("status", {}).get("vnpuCount", 0)) for i in items)


def sim_vnpus(agent: AgentProcess) -> list[tuple[str, int, int, str, bool]]:
    """(node, chip, id, template, is_container_used) of every simulated vNPU."""
    rows = []
    for node in agent.nodes:
        sim = agent.sim(node)
        for chip in sim.list_chips():
            rows += [
                (node, chip.index, v.id, v.template, v.in_use) for v in sim.list_vnpus(chip.index)
            ]
    return rows


def show_sim(plane: LocalPlane, agent: AgentProcess) -> None:
    owners = vnpu_owners(plane)
    rows = [
        [node, str(chip), str(vid), tpl, "1" if used else "0", owners.get((node, vid), "(nobody)")]
        for node, chip, vid, tpl, used in sim_vnpus(agent)
    ]
    print("(the simulated driver's vNPU table, as `npu-smi info -t info-vnpu` lists it per chip)")
    table(rows, ["NODE", "CHIP", "VNPU", "TEMPLATE", "IS_CONTAINER_USED", "POD (declared owner)"])


def pod_vnpus(plane: LocalPlane, pod_name: str) -> list[tuple[str, int]]:
    return sorted(
        (a["spec"]["nodeName"], a["spec"]["vnpuId"])
        for a in allocations(plane)
        if a["spec"]["podName"] == pod_name
    )


def show_events(plane: LocalPlane, pod_name: str) -> None:
    selector = f"--field-selector=involvedObject.name={pod_name}"
    kubectl(plane, "get", "events", "-n", NS, selector, "--sort-by=.metadata.creationTimestamp")


def metric_lines(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


# --------------------------------------------------------------- the story


def story(plane: LocalPlane, workdir: Path, procs: dict[str, Any]) -> None:
    banner(
        "installing the CRDs",
        """VNPUAllocation (namespaced: which pod owns which vNPU on which chip) and
        VNPUNode (cluster-scoped: a node's chips, free capacity and vNPUs), generated
        from the API models.""",
    )
    plane.install_crds()
    kubectl(plane, "get", "crd", "-o", CRD_COLUMNS)

    banner(
        "creating kwok nodes with simulated Ascend chips",
        """Two training nodes with four 910B3 chips each, one inference node with two
        310P3 chips. kwok plays the kubelets; the chip layout is a node annotation the
        agent's simulated driver reads.""",
    )
    plane.add_nodes(NODES)
    kubectl(plane, "get", "nodes", "-o", NODE_COLUMNS)

    banner(
        "starting the node agent",
        f"""In production one agent per NPU node (a DaemonSet); here one process serves
        all three simulated nodes. It publishes each node's inventory as a VNPUNode and
        renews a Lease. Demo intervals: resync every {RESYNC_SECONDS}s (production 30s),
        a vNPU nobody declared is destroyed after {GC_GRACE_SECONDS:.0f}s unused
        (production 120s).""",
    )
    kubectl(plane, "create", "namespace", AGENT_NAMESPACE)
    (workdir / "agent").mkdir(parents=True, exist_ok=True)
    agent = AgentProcess(plane, workdir / "agent", [n.name for n in NODES], settings=AGENT_SETTINGS)
    procs["agent"] = agent
    agent.start()
    wait_for(
        "VNPUNodes published",
        lambda: all(
            (plane.get_json(names.NODE_PLURAL, n.name) or {}).get("status", {}).get("chips")
            for n in NODES
        ),
        timeout=30,
    )
    kubectl(plane, "get", "vnpunodes")

    banner(
        "starting the operator",
        """It registers its admission webhooks (here on a loopback URL), watches pods,
        allocations, VNPUNodes and agent Leases, places pods and writes the
        allocations.""",
    )
    operator = OperatorProcess(plane, workdir / "operator")
    procs["operator"] = operator
    operator.start()
    kubectl(plane, "get", "mutatingwebhookconfigurations,validatingwebhookconfigurations")

    banner(
        "creating pods that ask for vNPUs",
        f"""A pod opts in with the annotation {names.ANN_TEMPLATE} (optional:
        {names.ANN_COUNT}, {names.ANN_CHIP_MODEL}). The webhook checks it and adds a
        scheduling gate, a finalizer and the ASCEND_* env; the operator picks node, chip
        and vNPU id and writes a VNPUAllocation; the agent creates that vNPU; then the
        operator pins the pod to the node and removes the gate.

        "notebook" stands for a pod that starts and then waits (for data, a user,
        a peer) before it opens its NPU.

        "infer-b" wants two vir04 on 310P3 chips. A vir04 takes 4 of a 310P3's 7
        AICPUs, so a chip holds one, and infer-a already has one of the two chips:
        infer-b has to wait.""",
    )
    kubectl(plane, "create", "namespace", NS)
    run_pod(plane, "train-small", "vir05_1c_16g")
    run_pod(plane, "train-pair", "vir10_3c_32g", count=2)
    run_pod(plane, "infer-a", "vir04", chip_model="310P3")
    run_pod(plane, "notebook", "vir05_1c_16g")
    wait_running(plane, ["infer-a"])  # so infer-b is the one that waits
    run_pod(plane, "infer-b", "vir04", count=2, chip_model="310P3")

    banner(
        "a bad request is refused at the door",
        """vir10_3c_16g is a 910B4 template; no node of this cluster offers it. The
        webhook says so and lists what the cluster does offer.""",
    )
    run_pod(plane, "typo", "vir10_3c_16g", expect_fail=True)
    if pod(plane, "typo") is not None:
        raise DemoError("pod typo was created although its template is not offered")

    fitting = ["train-small", "train-pair", "infer-a", "notebook"]
    wait_running(plane, fitting)
    wait_for(
        "infer-b told to wait",
        lambda: (allocated_condition(plane, "infer-b") or {}).get("status") == "False",
        timeout=30,
    )

    banner(
        "what kubectl shows",
        """One VNPUAllocation per vNPU, Ready once the agent created it. The pods run
        on the chosen nodes with vnpu.io/visible-devices set; infer-b is still gated.""",
    )
    kubectl(plane, "get", "vnpuallocations", "-A")
    kubectl(plane, "get", "vnpunodes")
    kubectl(plane, "get", "pods", "-n", NS, "-o", POD_COLUMNS)
    say("the container env the webhook added; the runtime reads the device list from it")
    kubectl(plane, "get", "pod", "train-pair", "-n", NS, "-o", ENV_JSONPATH)
    say("why infer-b waits: a pod condition and an Event")
    kubectl(plane, "get", "pod", "infer-b", "-n", NS, "-o", CONDITION_JSONPATH)
    show_events(plane, "infer-b")

    banner(
        "a vNPU nobody touches is kept",
        f"""The driver flag is_container_used turns 1 only when a container opens the
        device. HAMi's device plugin destroys every vNPU whose flag is 0, so a pod that
        is Running but has not opened its NPU yet loses it. Here the training and
        inference containers open their devices (simulated); the notebook does not.
        At the same time a vNPU nobody declared appears on a chip (a leak, or a replay
        of /etc/vnpu.cfg after a reboot). We wait {GC_GRACE_SECONDS:.0f}s grace
        several times over.""",
    )
    touched = [
        v for name in ("train-small", "train-pair", "infer-a") for v in pod_vnpus(plane, name)
    ]
    for node, vid in touched:
        agent.sim(node).open_vnpu(vid)
    (nb_vnpu,) = pod_vnpus(plane, "notebook")
    leak_node, leak = plant_leak(agent)
    say("the containers of train-small, train-pair and infer-a opened their vNPUs")
    say(f"vNPU {leak.id} appeared on {leak_node} chip {leak.chip}, no allocation names it")
    show_sim(plane, agent)
    t0 = time.monotonic()
    wait_for("leak collected", lambda: leak.id not in vnpu_ids(agent.sim(leak_node)), timeout=30)
    time.sleep(max(0.0, 4 * GC_GRACE_SECONDS - (time.monotonic() - t0)))
    waited = time.monotonic() - t0
    say(f"{waited:.1f}s later, {waited / GC_GRACE_SECONDS:.0f} times the grace period:")
    show_sim(plane, agent)
    if nb_vnpu[1] not in vnpu_ids(agent.sim(nb_vnpu[0])):
        raise DemoError(f"the notebook's vNPU {nb_vnpu[1]} on {nb_vnpu[0]} was destroyed")
    if phase_of(plane, "notebook") != "Running":
        raise DemoError(f"notebook is {phase_of(plane, 'notebook')}, not Running")
    say(f"the leaked vNPU {leak.id} is gone; the notebook's vNPU {nb_vnpu[1]} is still there")
    say("ownership is declared by an allocation, never guessed from a driver flag")
    for line in metric_lines(agent.metrics(), "vnpu_agent_gc_actions_total{"):
        print(f"  agent metric: {line}")

    banner(
        "capacity frees up, the waiting pod goes",
        """infer-a ends. Its allocation is deleted, the agent destroys the vNPU and only
        then does the pod object go (finalizers). The freed capacity wakes infer-b
        (event driven, no polling).""",
    )
    for node, vid in touched:
        agent.sim(node).release_vnpu(vid)
    say("containers exit and release their devices (simulated)")
    kubectl(plane, "delete", "pod", "infer-a", "-n", NS)
    wait_running(plane, ["infer-b"], timeout=30)
    kubectl(plane, "get", "pods", "-n", NS, "-o", POD_COLUMNS)
    show_events(plane, "infer-b")

    banner(
        "an admin cordons a chip",
        """Chip 1 of npu-310p-1 is taken out of service with a reason, without draining
        the node: infer-b's vNPU on it stays, nothing new goes there. The cordon is the
        VNPUNode's spec.cordonedChips, written by cluster admins only (`kubectl vnpu
        cordon NODE CHIP --reason R` does the same patch).""",
    )
    cordon = {"spec": {"cordonedChips": [{"chip": 1, "reason": "fan failing"}]}}
    kubectl(plane, "patch", "vnpunode", "npu-310p-1", "--type=merge", "-p", json.dumps(cordon))
    wait_for(
        "the cordon in the VNPUNode's columns",
        lambda: (
            (plane.get_json(names.NODE_PLURAL, "npu-310p-1") or {})
            .get("status", {})
            .get("cordoned")
            == "1"
        ),
        timeout=30,
    )
    kubectl(plane, "get", "vnpunodes")
    if phase_of(plane, "infer-b") != "Running":
        raise DemoError("infer-b was disturbed by the cordon")
    say("infer-b ends; infer-c wants both 310P3 chips, one of which is cordoned")
    kubectl(plane, "delete", "pod", "infer-b", "-n", NS)
    run_pod(plane, "infer-c", "vir04", count=2, chip_model="310P3")
    wait_for(
        "infer-c told the chip is cordoned",
        lambda: "cordoned" in (allocated_condition(plane, "infer-c") or {}).get("message", ""),
        timeout=30,
    )
    kubectl(plane, "get", "pod", "infer-c", "-n", NS, "-o", CONDITION_JSONPATH)
    say("the chip is back in service: infer-c is placed at once")
    kubectl(plane, "patch", "vnpunode", "npu-310p-1", "--type=merge",
            "-p", json.dumps({"spec": {"cordonedChips": None}}))  # fmt: skip
    wait_running(plane, ["infer-c"], timeout=30)
    kubectl(plane, "get", "pods", "-n", NS, "-o", POD_COLUMNS)

    quota_story(plane)

    banner(
        "deleting every pod destroys every vNPU",
        """kubectl delete returns once the pods are gone, which is after their vNPUs
        are destroyed.""",
    )
    kubectl(plane, "delete", "pods", "--all", "-n", NS, "--timeout=60s")
    left = [
        p["metadata"]["name"] for p in (plane.get_json("pods", "-n", NS) or {}).get("items", [])
    ]
    if left:
        raise DemoError(f"pods still there after delete: {', '.join(left)}")
    kubectl(plane, "get", "vnpuallocations", "-A")
    with contextlib.suppress(AssertionError):  # reported below with the table
        wait_for("inventory empty", lambda: inventory_vnpus(plane) == 0, timeout=20)
    kubectl(plane, "get", "vnpunodes")
    rows = sim_vnpus(agent)
    say(f"vNPUs left on the simulated chips: {len(rows)}")
    if rows:
        show_sim(plane, agent)
        raise DemoError(f"{len(rows)} vNPU(s) left on the simulated chips")
    if inventory_vnpus(plane) != 0:
        raise DemoError("VNPUNodes still report vNPUs")
    if allocations(plane):
        raise DemoError("allocations left")


def quota_story(plane: LocalPlane) -> None:
    banner(
        "a namespace quota refuses a pod",
        f"""Each vNPU pod is charged its vNPUs as extended resources (vnpu.io/vnpus,
        vnpu.io/aicore, vnpu.io/memory-mb, written by the webhook) and each node advertises
        its chips' totals under the same names, so a plain ResourceQuota caps a namespace.
        Team {QUOTA_NS} may hold one vNPU.""",
    )
    kubectl(plane, "get", "node", "npu-910b-1", "-o", NODE_VNPU_CAPACITY)
    kubectl(plane, "create", "namespace", QUOTA_NS)
    kubectl(plane, "create", "quota", "vnpu", "-n", QUOTA_NS, "--hard=requests.vnpu.io/vnpus=1")
    wait_for(
        f"ServiceAccount default in {QUOTA_NS}",
        lambda: plane.get_json("serviceaccount", "default", "-n", QUOTA_NS) is not None,
        timeout=60,
    )
    template = f"--annotations={names.ANN_TEMPLATE}=vir05_1c_16g"
    kubectl(plane, "run", "train-q1", "-n", QUOTA_NS, "--image=busybox", template)
    wait_for(
        "the quota counts train-q1",
        lambda: plane.quota_used(QUOTA_NS, "vnpu").get("requests.vnpu.io/vnpus") == "1",
        timeout=30,
    )
    refused = kubectl(plane, "run", "train-q2", "-n", QUOTA_NS, "--image=busybox",
                      template, expect_fail=True)  # fmt: skip
    if f"namespace {QUOTA_NS} is over its vNPU quota" not in refused.stderr:
        raise DemoError("train-q2 was refused, but not with the quota message")
    kubectl(plane, "get", "quota", "-n", QUOTA_NS)
    kubectl(plane, "delete", "namespace", QUOTA_NS, "--timeout=60s")


def plant_leak(agent: AgentProcess) -> tuple[str, Any]:
    """Creates a vNPU directly in the driver, on an empty 910B3 chip."""
    for node in reversed(agent.nodes):
        sim = agent.sim(node)
        for chip in reversed(sim.list_chips()):
            if chip.model.endswith("910B3") and not sim.list_vnpus(chip.index):
                return node, sim.create_vnpu(chip.index, "vir05_1c_16g", ANY_VNPU_ID)
    raise DemoError("no empty 910B3 chip for the leaked vNPU")


def log_tail(path: Path, lines: int = 30) -> str:
    """The last lines of a component's log, without the API client's bodies."""
    if not path.exists():
        return "(no log)"
    text = path.read_text(errors="replace").splitlines()
    keep = [line[:300] for line in text if "client.rest response body" not in line]
    return "\n".join(keep[-lines:])


def stop(procs: dict[str, Any]) -> None:
    for name in ("operator", "agent"):
        proc = procs.get(name)
        if proc is not None:
            proc.kill(signal.SIGTERM)


Story = Callable[[LocalPlane, Path, dict[str, Any]], None]


def main(tell: Story = story, description: str = __doc__.splitlines()[0]) -> int:
    """Starts a plane, tells `tell` on it, stops everything (`--keep`: leaves the plane);
    e2e/demo_dra.py tells its story through this too."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--keep", action="store_true", help="leave the plane running")
    args = parser.parse_args()
    t0 = time.monotonic()
    if args.keep:
        workdir = REPO_ROOT / ".localplane"
        if LocalPlane.stop_detached(workdir):
            print("stopped the plane an earlier run left in .localplane")
        LocalPlane(workdir, attached=False).rmtree()
    else:
        workdir = Path(tempfile.mkdtemp(prefix="vnpu-demo-"))
    plane = LocalPlane(workdir, attached=not args.keep)
    procs: dict[str, Any] = {}
    ok = False
    try:
        banner(
            "starting a local control plane",
            """Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler on
            loopback, kwok for fake nodes and kubelets.""",
        )
        plane.start(progress=lambda m: print(f"  {m}", flush=True))
        tell(plane, workdir, procs)
        ok = True
    except (DemoError, PlaneError, AssertionError) as exc:
        print(f"\nDEMO FAILED: {exc}", file=sys.stderr, flush=True)
        for name in ("operator", "agent"):
            proc = procs.get(name)
            if proc is not None:
                print(f"\n--- {name} log tail ({proc.log_path})", file=sys.stderr)
                print(log_tail(proc.log_path), file=sys.stderr, flush=True)
    finally:
        stop(procs)
        if not args.keep:
            plane.stop()
            if ok:
                plane.rmtree()
            else:
                print(f"\nlogs kept in {workdir}", file=sys.stderr)
    print(f"\ndemo {'finished' if ok else 'FAILED'} in {time.monotonic() - t0:.1f}s", flush=True)
    if args.keep:
        print(
            "plane left running (operator and agent stopped; their webhooks stay registered, "
            "so pods asking for vNPUs are refused until an operator runs again)\n"
            f"export KUBECONFIG={plane.kubeconfig}\nstop it with: make cluster-down"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
