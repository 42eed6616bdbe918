"""`make demo-dra`: vNPUs as DRA devices (ResourceClaims) on a local control plane.

The claim story of docs/DRA.md, told on the plane `make demo` uses (etcd, kube-apiserver,
controller-manager, scheduler, kwok): a kwok node with two simulated 910B3 chips whose
agent runs with --dra publishes its chips as a ResourceSlice pool; pods ask for a vNPU
through a ResourceClaimTemplate that selects a template by CEL; the scheduler allocates
devices, the operator writes a VNPUAllocation per device, the agent creates the vNPU and
only then does the binding condition let the scheduler bind the pod. Then a cordoned chip
that offers no device even to a pod that tolerates every taint, the two requests the
chart's admission policies refuse, and the pods' end: claims gone, allocations released,
vNPUs destroyed. Exits non-zero, with the reason, if anything is not as shown.

Everything is stopped at the end; pass `--keep` to leave the plane running (in
.localplane; the KUBECONFIG to export is printed).

Needs `hack` (the localplane package) on PYTHONPATH; `make demo-dra` sets it.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

import demo
from demo import DemoError, banner, columns, kubectl, say, table
from localplane import LocalPlane, NodeSpec, policies
from localplane.chart import CHART, helm_ok
from localplane.components import AGENT_NAMESPACE, AgentProcess, OperatorProcess
from localplane.waiting import wait_for
from vnpu_common.wire import names

NS = demo.NS  # demo.pod() and demo.phase_of() read pods there
NODE = "npu-dra-1"
CHIPS = 2
SMALL = "vir05_1c_16g"
CLAIM_TEMPLATE = "one-small-vnpu"
# The chart's files this story installs: the plane installs only its protection*.yaml.
CHART_FILES = ("templates/deviceclass.yaml", "templates/dra-admission.yaml")
# What the chart's dra-admission policies answer (tests/integration/test_dra_admission.py).
RESOURCE = f"deviceclass.resource.kubernetes.io/{names.DRA_DEVICE_CLASS}"
ADMIN_ACCESS = "adminAccess to vNPUs (DeviceClass vnpu.io) is not supported"
EXTENDED = f"resources {RESOURCE} (a DeviceClass as an extended resource) are not supported"
# The namespace label without which the API server refuses admin access itself.
ADMIN_LABEL = "resource.kubernetes.io/admin-access"
AGENT_SETTINGS = {**AgentProcess.QUICK, "resync-seconds": demo.RESYNC_SECONDS}

CLAIM_COLUMNS = columns(
    CLAIM=".metadata.name",
    POD=".status.reservedFor[0].name",
    POOL=".status.allocation.devices.results[0].pool",
    DEVICE=".status.allocation.devices.results[0].device",
    VNPU_READY=f'.status.devices[0].conditions[?(@.type=="{names.DRA_COND_READY}")].status',
)
BOUND_COLUMNS = columns(
    NAME=".metadata.name",
    STATUS=".status.phase",
    NODE=".spec.nodeName",
    CLAIM=".status.resourceClaimStatuses[0].resourceClaimName",
)

CLAIM_TEMPLATE_YAML = f"""\
apiVersion: {names.RESOURCE_API}
kind: ResourceClaimTemplate
metadata:
  name: {CLAIM_TEMPLATE}
spec:
  spec:
    devices:
      requests:
      - name: npu
        exactly:
          deviceClassName: {names.DRA_DEVICE_CLASS}
          selectors:
          - cel:
              expression: device.attributes["{names.DRA_DRIVER}"].{names.DRA_ATTR_TEMPLATE} \
== "{SMALL}"
"""


def pod_yaml(name: str, *, tolerate_all: bool = False) -> str:
    tolerations = "  tolerations:\n  - operator: Exists\n" if tolerate_all else ""
    return f"""\
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  resourceClaims:
  - name: npu
    resourceClaimTemplateName: {CLAIM_TEMPLATE}
  containers:
  - name: main
    image: busybox
    resources:
      claims:
      - name: npu
{tolerations}"""


ADMIN_CLAIM_YAML = f"""\
apiVersion: {names.RESOURCE_API}
kind: ResourceClaim
metadata:
  name: peek
spec:
  devices:
    requests:
    - name: npu
      exactly:
        deviceClassName: {names.DRA_DEVICE_CLASS}
        adminAccess: true
"""

EXTENDED_POD_YAML = f"""\
apiVersion: v1
kind: Pod
metadata:
  name: by-class
spec:
  containers:
  - name: main
    image: busybox
    resources:
      limits:
        {RESOURCE}: "1"
"""


# --------------------------------------------------------------- reading


def get(plane: LocalPlane, *args: str) -> dict[str, Any]:
    return dict(plane.get_json(*args) or {})


def items(plane: LocalPlane, *args: str) -> list[dict[str, Any]]:
    return list(get(plane, *args).get("items") or [])


def pool_slices(plane: LocalPlane) -> list[dict[str, Any]]:
    return items(
        plane,
        "resourceslices",
        f"--field-selector=spec.nodeName={NODE},spec.driver={names.DRA_DRIVER}",
    )


def pool_devices(plane: LocalPlane) -> list[dict[str, Any]]:
    return [d for s in pool_slices(plane) for d in s["spec"].get("devices") or []]


def attr(device: dict[str, Any], key: str) -> Any:
    value = device.get("attributes", {}).get(key, {})
    return next(iter(value.values()), None)


def devices_per_chip(plane: LocalPlane) -> Counter[tuple[int, str]]:
    """(chip, template) -> how many devices the pool offers."""
    return Counter(
        (int(attr(d, names.DRA_ATTR_CHIP)), str(attr(d, names.DRA_ATTR_TEMPLATE)))
        for d in pool_devices(plane)
    )


def counter_sets(plane: LocalPlane) -> dict[str, dict[str, str]]:
    return {
        cs["name"]: {k: v["value"] for k, v in cs["counters"].items()}
        for s in pool_slices(plane)
        for cs in s["spec"].get("sharedCounters") or []
    }


def claim_of(plane: LocalPlane, pod_name: str) -> dict[str, Any]:
    p = demo.pod(plane, pod_name) or {}
    statuses = p.get("status", {}).get("resourceClaimStatuses") or [{}]
    name = statuses[0].get("resourceClaimName")
    return get(plane, "resourceclaim", "-n", NS, name) if name else {}


def claim_device(claim: dict[str, Any]) -> str | None:
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {})
    got = results.get("results") or [{}]
    device = got[0].get("device")
    return str(device) if device else None


def ready_condition(claim: dict[str, Any]) -> dict[str, Any] | None:
    for dev in (claim.get("status") or {}).get("devices") or []:
        for cond in dev.get("conditions") or []:
            if cond.get("type") == names.DRA_COND_READY:
                return dict(cond)
    return None


def allocation_of(plane: LocalPlane, pod_name: str) -> dict[str, Any] | None:
    mine = [a for a in demo.allocations(plane) if a["spec"].get("podName") == pod_name]
    if len(mine) > 1:
        raise DemoError(f"{pod_name} has {len(mine)} allocations, not one")
    return mine[0] if mine else None


def bound_node(plane: LocalPlane, pod_name: str) -> str | None:
    node = ((demo.pod(plane, pod_name) or {}).get("spec") or {}).get("nodeName")
    return str(node) if node else None


def wait_bound(plane: LocalPlane, pods: list[str], timeout: float = 60) -> None:
    try:
        wait_for(
            "pods bound and Running",
            lambda: all(
                bound_node(plane, p) and demo.phase_of(plane, p) == "Running" for p in pods
            ),
            timeout=timeout,
        )
    except AssertionError:
        state = ", ".join(f"{p}={demo.phase_of(plane, p)} on {bound_node(plane, p)}" for p in pods)
        raise DemoError(f"pods not bound and Running after {timeout:.0f}s: {state}") from None


def scheduled_at(plane: LocalPlane, pod_name: str) -> str:
    for cond in (demo.pod(plane, pod_name) or {}).get("status", {}).get("conditions") or []:
        if cond["type"] == "PodScheduled" and cond["status"] == "True":
            return str(cond["lastTransitionTime"])
    raise DemoError(f"{pod_name} has no PodScheduled=True condition")


def sim_count(agent: AgentProcess) -> int:
    return len(demo.sim_vnpus(agent))


# --------------------------------------------------------------- showing


def show_pool(plane: LocalPlane) -> None:
    per = devices_per_chip(plane)
    rows = [[str(chip), tpl, str(n)] for (chip, tpl), n in sorted(per.items())]
    print(f"(the devices of pool {NODE}, counted per chip and template)")
    table(rows or [["-", "(none)", "0"]], ["CHIP", "TEMPLATE", "DEVICES"])
    sets = counter_sets(plane)
    keys = sorted({k for c in sets.values() for k in c})
    print("(the pool's counter sets: one per chip, what the chip holds in all)")
    table([[n, *(c.get(k, "") for k in keys)] for n, c in sorted(sets.items())], ["SET", *keys])


def install_chart_dra(plane: LocalPlane) -> None:
    """The chart's DeviceClass and DRA admission policies, rendered as the chart renders
    them (helm template) with the plane's operator identity, and applied."""
    show = [arg for f in CHART_FILES for arg in ("--show-only", f)]
    manifests = helm_ok(
        plane, "template", policies.RELEASE, str(CHART), *show,
        "--kube-version", plane.k8s_version,
        "--api-versions", f"{names.RESOURCE_API}/DeviceClass",
        "--set", "agent.dra=true", "--set", f"fullnameOverride={policies.RELEASE}",
        *policies.settings(),
    )  # fmt: skip
    print(f"$ helm template ... --show-only {' --show-only '.join(CHART_FILES)} | kubectl apply")
    out = plane.kubectl("apply", "-f", "-", input=manifests)
    print(out.stdout.rstrip(), flush=True)


def policies_enforced(plane: LocalPlane) -> bool:
    """A server-side dry run of the refused pod is refused: the API server has the
    policies (a moment after they are written)."""
    out = plane.kubectl(
        "create", "--dry-run=server", "-n", NS, "-f", "-", input=EXTENDED_POD_YAML, check=False
    )
    return out.returncode != 0 and EXTENDED in out.stderr


# --------------------------------------------------------------- the story


def story(plane: LocalPlane, workdir: Path, procs: dict[str, Any]) -> None:
    major_minor = tuple(int(x) for x in plane.k8s_version.lstrip("v").split(".")[:2])
    if major_minor < (1, 36):
        raise DemoError(f"the DRA path needs Kubernetes 1.36 or later, not {plane.k8s_version}")

    banner(
        "installing the CRDs, the DeviceClass vnpu.io and the DRA admission policies",
        """The CRDs as in `make demo`; from the chart, its DeviceClass (every device of driver
        vnpu.io, which claims name) and its dra-admission ValidatingAdmissionPolicies (two
        requests the vNPU ledger cannot serve, refused inside the API server).""",
    )
    plane.install_crds()
    install_chart_dra(plane)
    kubectl(plane, "get", "deviceclasses")

    banner(
        "a DRA node publishes its pool",
        f"""{NODE} is a kwok node with {CHIPS} simulated 910B3 chips. Its agent runs with
        --dra=true: the node serves ResourceClaims, not annotated pods, and the agent
        publishes its chips as a ResourceSlice pool named after the node. One device per
        template instance that fits on an empty chip; each device consumes its share of
        its chip's counter set, and the scheduler subtracts what allocated devices
        consume.""",
    )
    plane.add_nodes([NodeSpec(name=NODE, chips={"910B3": CHIPS})])
    kubectl(plane, "create", "namespace", AGENT_NAMESPACE)
    (workdir / "agent").mkdir(parents=True, exist_ok=True)
    agent = AgentProcess(
        plane, workdir / "agent", [NODE], settings=AGENT_SETTINGS, extra=["--dra=true"]
    )
    procs["agent"] = agent
    agent.start()
    wait_for(
        "the pool published",
        lambda: (
            len(counter_sets(plane)) == CHIPS
            and {c for c, _ in devices_per_chip(plane)} == set(range(CHIPS))
        ),
        timeout=30,
    )
    kubectl(plane, "get", "vnpunodes", "-o", "wide")
    kubectl(plane, "get", "resourceslices")
    show_pool(plane)
    per = devices_per_chip(plane)
    for chip in range(CHIPS):
        if per[(chip, SMALL)] != 4:
            raise DemoError(f"chip {chip} offers {per[(chip, SMALL)]} x {SMALL}, not 4")
    if not get(plane, names.NODE_PLURAL, NODE).get("status", {}).get("dra"):
        raise DemoError(f"the VNPUNode {NODE} does not say dra: true")
    sample = next(d for d in pool_devices(plane) if attr(d, names.DRA_ATTR_TEMPLATE) == SMALL)
    say("one device as the scheduler sees it (kubectl get resourceslices -o yaml, abridged);")
    say("a claim's CEL selector reads its attributes:")
    print(indented_yaml({"name": sample["name"], **sample}), end="", flush=True)
    if sample.get("bindingConditions") != [names.DRA_COND_READY]:
        raise DemoError(f"device {sample['name']} has no binding condition {names.DRA_COND_READY}")

    banner(
        "starting the operator",
        """Besides annotated pods it watches ResourceClaims of driver vnpu.io: for each
        allocated device it writes a VNPUAllocation, and once the agent made that vNPU it
        sets the device's binding condition, which the scheduler waits for.""",
    )
    operator = OperatorProcess(plane, workdir / "operator")
    procs["operator"] = operator
    operator.start()

    claims_story(plane, agent)
    cordon_story(plane)
    refusals_story(plane)
    end_story(plane, agent)


def indented_yaml(obj: dict[str, Any]) -> str:
    text = yaml.safe_dump(obj, sort_keys=False, default_flow_style=None, width=100)
    return "".join(f"    {line}\n" for line in text.splitlines())


def claims_story(plane: LocalPlane, agent: AgentProcess) -> None:
    banner(
        "two pods ask for a vNPU through a ResourceClaimTemplate",
        f"""The template's CEL selector picks the vNPU template {SMALL}. The
        controller-manager makes each pod a ResourceClaim of its own; the scheduler
        allocates it a device of the pool and waits (PreBind) on the device's binding
        condition {names.DRA_COND_READY}; the operator writes the VNPUAllocation, the agent
        creates the vNPU, the operator sets the condition True, and only then is the pod
        bound. No annotation, gate or webhook mutation is involved.""",
    )
    kubectl(plane, "create", "namespace", NS)
    wait_for(
        f"ServiceAccount default in {NS}",
        lambda: plane.get_json("serviceaccount", "default", "-n", NS) is not None,
        timeout=60,
    )
    kubectl(plane, "create", "-n", NS, "-f", "-", stdin=CLAIM_TEMPLATE_YAML)
    pods = ["train-1", "train-2"]
    kubectl(plane, "create", "-n", NS, "-f", "-", stdin="---\n".join(pod_yaml(p) for p in pods))
    wait_bound(plane, pods)
    kubectl(plane, "get", "resourceclaims", "-n", NS)
    kubectl(plane, "get", "resourceclaims", "-n", NS, "-o", CLAIM_COLUMNS)
    kubectl(plane, "get", "vnpuallocations", "-n", NS, "-o", "wide")
    kubectl(plane, "get", "pods", "-n", NS, "-o", BOUND_COLUMNS)

    rows, ids = [], set()
    for p in pods:
        claim = claim_of(plane, p)
        alloc = allocation_of(plane, p)
        cond = ready_condition(claim)
        if alloc is None or not claim:
            raise DemoError(f"{p} has no claim or no allocation")
        spec = alloc["spec"]
        want = (claim["metadata"]["name"], claim_device(claim), NODE, SMALL)
        got = (spec["claim"]["name"], spec["claim"]["device"], spec["nodeName"], spec["template"])
        if got != want:
            raise DemoError(f"{p}'s allocation serves {got}, not {want}")
        if alloc.get("status", {}).get("phase") != names.PHASE_READY:
            raise DemoError(f"{p}'s allocation is {alloc.get('status', {}).get('phase')}")
        if cond is None or cond.get("status") != "True":
            raise DemoError(f"{p}'s claim has no {names.DRA_COND_READY}=True: {cond}")
        ready, bound = str(cond["lastTransitionTime"]), scheduled_at(plane, p)
        if bound < ready:
            raise DemoError(f"{p} was bound at {bound}, before its vNPU was ready at {ready}")
        ids.add((spec["chip"], spec["vnpuId"]))
        rows.append([p, claim_device(claim) or "", str(spec["vnpuId"]), ready, bound])
    if len(ids) != len(pods):
        raise DemoError(f"the pods share a vNPU: {ids}")
    say("when each vNPU was ready and when its pod was bound (lastTransitionTime):")
    table(rows, ["POD", "DEVICE", "VNPU", f"{names.DRA_COND_READY}=True", "PodScheduled=True"])
    wait_for("the vNPUs on the driver", lambda: sim_count(agent) == len(pods), timeout=30)
    say("the agent created them on the simulated driver, each declared by its allocation:")
    demo.show_sim(plane, agent)


def cordon_story(plane: LocalPlane) -> None:
    alloc = allocation_of(plane, "train-1")
    assert alloc is not None  # claims_story checked it
    chip = int(alloc["spec"]["chip"])
    other = 1 - chip
    banner(
        "a cordoned chip offers no device, whatever a pod tolerates",
        f"""An admin cordons chip {chip} (train-1's) with a reason: the VNPUNode's
        spec.cordonedChips, as `kubectl vnpu cordon {NODE} {chip} --reason R` writes it.
        The agent withdraws the chip's devices from the pool (a device taint would not do:
        a request may tolerate every taint); its counter set stays, and the claims already
        allocated there keep their vNPUs. train-3 tolerates everything and still lands on
        chip {other}, although chip {chip} has room.""",
    )
    cordon = {"spec": {"cordonedChips": [{"chip": chip, "reason": "fan failing"}]}}
    kubectl(plane, "patch", "vnpunode", NODE, "--type=merge", "-p", json.dumps(cordon))
    wait_for(
        f"chip {chip}'s devices withdrawn",
        lambda: {c for c, _ in devices_per_chip(plane)} == {other},
        timeout=30,
    )
    wait_for(
        "the cordon in the VNPUNode's columns",
        lambda: get(plane, names.NODE_PLURAL, NODE).get("status", {}).get("cordoned") == str(chip),
        timeout=30,
    )
    kubectl(plane, "get", "vnpunodes")
    show_pool(plane)
    if len(counter_sets(plane)) != CHIPS:
        raise DemoError("the cordoned chip's counter set was withdrawn too")
    kubectl(plane, "create", "-n", NS, "-f", "-", stdin=pod_yaml("train-3", tolerate_all=True))
    wait_bound(plane, ["train-3"])
    kubectl(plane, "get", "vnpuallocations", "-n", NS, "-o", "wide")
    got = allocation_of(plane, "train-3")
    if got is None or int(got["spec"]["chip"]) != other:
        raise DemoError(f"train-3 got chip {got and got['spec']['chip']}, not {other}")
    for p in ("train-1", "train-2"):
        held = allocation_of(plane, p)
        if demo.phase_of(plane, p) != "Running" or held is None:
            raise DemoError(f"{p} was disturbed by the cordon")
        if held.get("status", {}).get("phase") != names.PHASE_READY:
            raise DemoError(f"{p}'s allocation is no longer Ready after the cordon")
    say(f"train-3 is on chip {other}; train-1 and train-2 keep their vNPUs")


def refusals_story(plane: LocalPlane) -> None:
    banner(
        "two requests the ledger cannot serve are refused",
        f"""Admin access would give a claim a vNPU of its own that no counter and no quota
        charges; even in a namespace an admin opened to admin access (label {ADMIN_LABEL},
        without which the API server refuses it itself), the chart's policy refuses it for
        vNPUs. And every DeviceClass is also an extended resource (KEP-5004): a pod asking
        for {RESOURCE} in its limits would get a vNPU with no claim and no quota charge.
        Both are refused when they are created, for every user.""",
    )
    wait_for("the dra-admission policies enforced", lambda: policies_enforced(plane), timeout=30)
    kubectl(plane, "label", "namespace", NS, f"{ADMIN_LABEL}=true")
    out = kubectl(plane, "create", "-n", NS, "-f", "-", stdin=ADMIN_CLAIM_YAML, expect_fail=True)
    if ADMIN_ACCESS not in out.stderr or "ValidatingAdmissionPolicy" not in out.stderr:
        raise DemoError("the adminAccess claim was refused, but not by the chart's policy")
    out = kubectl(plane, "create", "-n", NS, "-f", "-", stdin=EXTENDED_POD_YAML, expect_fail=True)
    if EXTENDED not in out.stderr:
        raise DemoError(f"the pod asking for {RESOURCE} was refused, but not by the policy")
    if plane.get_json("resourceclaim", "peek", "-n", NS) or demo.pod(plane, "by-class"):
        raise DemoError("a refused object exists")
    kubectl(plane, "label", "namespace", NS, f"{ADMIN_LABEL}-")


def end_story(plane: LocalPlane, agent: AgentProcess) -> None:
    banner(
        "deleting the pods releases everything",
        """The controller-manager deletes each pod's claim with it; the operator deletes
        the claim's allocation, the agent destroys the vNPU and removes the finalizer. The
        pool stays as it was: it describes empty chips.""",
    )
    before = counter_sets(plane)
    kubectl(plane, "delete", "pods", "--all", "-n", NS, "--timeout=60s")
    for what, check in (
        ("claims gone", lambda: not items(plane, "resourceclaims", "-n", NS)),
        ("allocations released", lambda: not demo.allocations(plane)),
        ("vNPUs destroyed", lambda: sim_count(agent) == 0),
        ("inventory empty", lambda: demo.inventory_vnpus(plane) == 0),
    ):
        try:
            wait_for(what, check, timeout=30)
        except AssertionError:
            raise DemoError(f"not {what} 30s after the pods went") from None
    kubectl(plane, "get", "resourceclaims", "-n", NS)
    kubectl(plane, "get", "vnpuallocations", "-A")
    kubectl(plane, "get", "vnpunodes")
    say(f"vNPUs left on the simulated chips: {sim_count(agent)}")
    if counter_sets(plane) != before:
        raise DemoError("the pool's counters changed with the pods")


if __name__ == "__main__":
    sys.exit(demo.main(story, (__doc__ or "").splitlines()[0]))
