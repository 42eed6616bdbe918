"""Every name the system puts on the wire: the one place to look them up.

The operator, the agent, the CRD generator, the chart tests and the demo all
import from here, so a renamed key cannot drift between components.
"""

from __future__ import annotations

import re
from typing import Final

# API group and version of our resources.
GROUP: Final = "vnpu.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
CATEGORY: Final = "vnpu"

# Resources: (kind, plural, singular, short name).
ALLOCATION_KIND: Final = "VNPUAllocation"
ALLOCATION_PLURAL: Final = "vnpuallocations"
ALLOCATION_SINGULAR: Final = "vnpuallocation"
ALLOCATION_SHORT: Final = "vnpua"

NODE_KIND: Final = "VNPUNode"
NODE_PLURAL: Final = "vnpunodes"
NODE_SINGULAR: Final = "vnpunode"
NODE_SHORT: Final = "vnpun"

# Pod annotations a user sets.
ANN_TEMPLATE: Final = f"{GROUP}/template"
ANN_COUNT: Final = f"{GROUP}/count"
ANN_CHIP_MODEL: Final = f"{GROUP}/chip-model"
ANN_CONTAINERS: Final = f"{GROUP}/containers"

# Extended resources: the webhook charges each vNPU pod its template's AICore,
# device memory (MB, as the driver counts it) and vNPU count in container
# requests, and the operator advertises each node's totals in Node status, so
# that ResourceQuota (requests.vnpu.io/...) and Kueue count vNPUs with no API of
# our own. Only the webhook sets them; a pod that asks for no vNPUs may not.
RESOURCE_PREFIX: Final = f"{GROUP}/"
RES_AICORE: Final = f"{GROUP}/aicore"
RES_MEMORY_MB: Final = f"{GROUP}/memory-mb"
RES_VNPUS: Final = f"{GROUP}/vnpus"
EXTENDED_RESOURCES: Final = (RES_AICORE, RES_MEMORY_MB, RES_VNPUS)
QUOTA_PREFIX: Final = "requests."  # ResourceQuota's key for a request: requests.vnpu.io/aicore

# What the system sets on a pod. The label marks every pod the webhook admitted,
# so the operator can list exactly those (its caches' convergence check).
LABEL_MANAGED: Final = f"{GROUP}/managed"
ANN_VISIBLE_DEVICES: Final = f"{GROUP}/visible-devices"
SCHEDULING_GATE: Final = f"{GROUP}/allocation"
POD_FINALIZER: Final = f"{GROUP}/release"
# The node of a preempting pod's claim, written by the operator in the same status
# write as status.nominatedNodeName: a nomination it restores after a restart must
# carry it (anybody with pods/status can write a nomination; only the operator this).
ANN_NOMINATED_NODE: Final = f"{GROUP}/nominated-node"
ENV_VISIBLE_DEVICES: Final = "ASCEND_VISIBLE_DEVICES"
ENV_RUNTIME_OPTIONS: Final = "ASCEND_RUNTIME_OPTIONS"
RUNTIME_OPTIONS_VIRTUAL: Final = "VIRTUAL"
# Makes the Ascend runtime create a vNPU itself, behind every ledger: every container
# of a vNPU pod gets it empty, and no pod may set it (docs/SECURITY.md).
ENV_VNPU_SPECS: Final = "ASCEND_VNPU_SPECS"

# Admission webhooks: configuration objects, webhook names (FQDNs, as the API
# server requires) and the HTTP paths the operator serves them on.
WEBHOOK_CONFIG_NAME: Final = "vnpu-operator"
WEBHOOK_MUTATE_NAME: Final = f"mutate.pods.{GROUP}"
WEBHOOK_VALIDATE_NAME: Final = f"validate.pods.{GROUP}"
WEBHOOK_MUTATE_PATH: Final = "/mutate"
WEBHOOK_VALIDATE_PATH: Final = "/validate"
WEBHOOK_HEALTH_PATH: Final = "/healthz"

# Labels on VNPUAllocation objects; the agent's watch selects on LABEL_NODE.
LABEL_NODE: Final = f"{GROUP}/node"
LABEL_POD_UID: Final = f"{GROUP}/pod-uid"

# Finalizer the agent removes once the vNPU is destroyed.
ALLOCATION_FINALIZER: Final = f"{GROUP}/vnpu-destroy"

# Condition types.
COND_READY: Final = "Ready"
COND_HEALTHY: Final = "Healthy"
# VNPUNode condition, by the agent: False while the driver reports a chip unhealthy
# (reasons REASON_CHIP_UNHEALTHY / REASON_CHIP_HEALTHY, as on allocations).
COND_CHIPS_HEALTHY: Final = "ChipsHealthy"
# VNPUNode spec.cordonedChips[].reason: one line for `kubectl get -o wide`.
CORDON_REASON_MAX_LEN: Final = 256
# Pod condition the operator sets while a pod waits for capacity.
POD_COND_ALLOCATED: Final = f"{GROUP}/Allocated"

# Allocation phases.
PHASE_PENDING: Final = "Pending"
PHASE_READY: Final = "Ready"
PHASE_RELEASING: Final = "Releasing"
PHASE_FAILED: Final = "Failed"

# Event and condition reasons, as `kubectl describe` shows them. The lists in
# docs/USAGE.md are checked against these tuples.
# On pods, by the operator (Events, and the vnpu.io/Allocated condition):
REASON_VNPUS_READY: Final = "VNPUsReady"
REASON_WAITING: Final = "WaitingForCapacity"
REASON_INVALID_REQUEST: Final = "InvalidRequest"
REASON_PLACEMENT_CONFLICT: Final = "PlacementConflict"
REASON_PINNING_FAILED: Final = "PinningFailed"
REASON_ALLOCATION_FAILED: Final = "AllocationFailed"
REASON_NODE_NOT_LIVE: Final = "NodeNotLive"
REASON_RELEASED_EXTERNALLY: Final = "VNPUReleasedExternally"
REASON_VNPUS_RELEASED: Final = "VNPUsReleased"
REASON_HAND_EDIT: Final = "ChangedByHand"  # an exempt admin edited what the system decided
REASON_ALLOCATED: Final = "Allocated"  # the condition once the pod is pinned
# The operator's writes for the pod keep failing: the API server refused them
# (a policy, RBAC, validation: 400, 401, 403, 422) or failed to answer.
REASON_WRITE_REFUSED: Final = "WriteRefused"
REASON_API_ERROR: Final = "APIError"
# Preemption (off unless enabled): on the pod that preempts, while it waits
# for its victims' vNPUs to go, or when a PodDisruptionBudget refused them;
# on each victim, as kube-scheduler names its own.
REASON_PREEMPTING: Final = "Preempting"
REASON_PREEMPTION_BLOCKED: Final = "PreemptionBlocked"
REASON_PREEMPTED: Final = "Preempted"
# Its vNPUs are ready, but the node is full in kube-scheduler's sum until pods
# leaving it are deleted (vnpu_operator.leaving): it stays gated until then.
REASON_WAITING_FOR_LEAVING: Final = "WaitingForLeavingPods"
POD_EVENT_REASONS: Final = (
    REASON_VNPUS_READY,
    REASON_WAITING,
    REASON_INVALID_REQUEST,
    REASON_PLACEMENT_CONFLICT,
    REASON_PINNING_FAILED,
    REASON_ALLOCATION_FAILED,
    REASON_NODE_NOT_LIVE,
    REASON_RELEASED_EXTERNALLY,
    REASON_VNPUS_RELEASED,
    REASON_HAND_EDIT,
    REASON_WRITE_REFUSED,
    REASON_API_ERROR,
    REASON_PREEMPTING,
    REASON_PREEMPTION_BLOCKED,
    REASON_PREEMPTED,
    REASON_WAITING_FOR_LEAVING,
)
# On allocations, by the agent (Events and the Ready/Healthy conditions);
# driver failures add the reason of their error class (DriverError.reason).
REASON_CREATED: Final = "Created"
REASON_ADOPTED: Final = "Adopted"
REASON_RECREATED: Final = "Recreated"
REASON_MISMATCH: Final = "VNPUMismatch"
REASON_CHIP_HEALTHY: Final = "ChipHealthy"
REASON_CHIP_UNHEALTHY: Final = "ChipUnhealthy"
REASON_DESTROY_DEFERRED: Final = "DestroyDeferred"
# A new allocation names a vNPU that exists and is open, or held by another
# allocation (live, or being deleted with its destroy deferred), or left behind
# by an allocation that went without its destroy: never handed over; Failed
# after retries, so that the operator places the pod anew.
REASON_VNPU_HELD: Final = "VNPUHeld"
# On allocations, by the operator: one no agent will ever serve (no node label,
# label and spec.nodeName differ, node gone with no agent serving it).
REASON_UNSERVABLE: Final = "Unservable"
ALLOCATION_EVENT_REASONS: Final = (
    REASON_UNSERVABLE,
    REASON_RECREATED,
    REASON_MISMATCH,
    REASON_CHIP_HEALTHY,
    REASON_CHIP_UNHEALTHY,
    REASON_DESTROY_DEFERRED,
    REASON_VNPU_HELD,
)
# On VNPUNode status, by the agent: the Ready condition when the driver answers.
REASON_DRIVER_READY: Final = "DriverReady"

# Liveness of an agent: a Lease per node in the agent's namespace.
LEASE_PREFIX: Final = "vnpu-agent-"

# Node label the chart's DaemonSet selects NPU nodes by.
LABEL_NPU_NODE: Final = f"{GROUP}/npu"

# Simulated chips of a node for the sim driver, e.g. "910B3=4,310P3=2".
ANN_SIM_CHIPS: Final = f"sim.{GROUP}/chips"

# Kopf's own bookkeeping, renamed into our namespace of names.
KOPF_FINALIZER: Final = f"{GROUP}/operator"
KOPF_ANNOTATIONS_PREFIX: Final = f"operator.{GROUP}"

# Inclusive vNPU id range the driver accepts (MinVDevID..MaxVDevID-1).
VNPU_ID_MIN: Final = 100
VNPU_ID_MAX: Final = 1123

# Template names as the driver prints them: vir05_1c_16g, vir01, vir10_4c_16g_m.
TEMPLATE_PATTERN: Final = r"^vir[0-9]{2}(_[0-9a-z]+)*$"
TEMPLATE_MAX_LEN: Final = 31  # TEMPLATE_NAME_LEN 32 including the NUL.


# One request on every cluster (docs/USAGE.md, "One request"): a pod asks for
# `resources.limits: {vnpu.io/<template>: N}`, the template name verbatim
# (vnpu.io/vir05_1c_16g). A template name is a valid resource name as it is
# (letters, digits, "_"), and every one starts with "vir", so none is ever
# vnpu.io/vnpus, vnpu.io/aicore or vnpu.io/memory-mb, the charges quota counts.
TEMPLATE_RE: Final = re.compile(TEMPLATE_PATTERN)


def template_resource(template: str) -> str:
    """The extended resource a pod names to ask for vNPUs of `template`."""
    return f"{RESOURCE_PREFIX}{template}"


def template_of_resource(resource: str) -> str | None:
    """The template a resource name asks for (vnpu.io/vir02 -> vir02), else None."""
    if not resource.startswith(RESOURCE_PREFIX):
        return None
    template = resource[len(RESOURCE_PREFIX) :]
    if len(template) > TEMPLATE_MAX_LEN or not TEMPLATE_RE.match(template):
        return None
    return template


def template_device_class(template: str) -> str:
    """The DeviceClass serving vnpu.io/<template> on DRA nodes: an object name
    (no "_"), so vir05_1c_16g -> vir05-1c-16g.vnpu.io."""
    return f"{template.replace('_', '-')}.{GROUP}"


def device_path(vnpu_id: int) -> str:
    """Host device node of a vNPU."""
    return f"/dev/vdavinci{vnpu_id}"


def lease_name(node: str) -> str:
    return f"{LEASE_PREFIX}{node}"


# The operator replicas' leader election Lease (in the agent namespace).
LEADER_LEASE_NAME = "vnpu-operator-leader"


# User-Agent prefixes of our API clients: audit logs and the API server's
# metrics tell our components' requests apart by them.
USER_AGENT_OPERATOR: Final = "vnpu-operator"
USER_AGENT_AGENT: Final = "vnpu-agent"


# --------------------------------------------------------------------------
# Dynamic Resource Allocation (resource.k8s.io/v1, Kubernetes 1.36+;
# docs/DRA.md). A node is either a DRA node (its agent runs with --dra and
# publishes a ResourceSlice pool) or an annotation node, never both: the two
# front-ends never book the same chip (docs/DECISIONS.md, "One ledger, two
# front-ends").
DRA_DRIVER: Final = GROUP  # ResourceSlice spec.driver, DeviceClass selector, plugin name
DRA_DEVICE_CLASS: Final = GROUP  # the chart's DeviceClass (every vNPU device)
RESOURCE_API: Final = "resource.k8s.io/v1"
# Binding conditions every device declares: the scheduler binds the pod only
# once the operator has set DRA_COND_READY True on the claim's device status
# (its VNPUAllocation is Ready); DRA_COND_FAILED True gives the claim back.
DRA_COND_READY: Final = f"{GROUP}/vnpu-ready"
DRA_COND_FAILED: Final = f"{GROUP}/vnpu-failed"
# Device attributes (qualified with the driver's domain on the wire).
DRA_ATTR_TEMPLATE: Final = "template"
DRA_ATTR_MODEL: Final = "model"
DRA_ATTR_CHIP: Final = "chip"
DRA_ATTR_AICORE: Final = "aicore"
DRA_ATTR_MEMORY_MB: Final = "memoryMB"
# Counters of a chip's counter set (one set per chip, named dra_counter_set()).
DRA_COUNTER_AICORE: Final = "aicore"
DRA_COUNTER_MEMORY: Final = "memory-mb"
DRA_COUNTER_AICPU: Final = "aicpu"
DRA_COUNTER_MEDIA: Final = "media"
DRA_COUNTER_VNPUS: Final = "vnpus"
# Labels on a DRA allocation (besides LABEL_NODE): the claim it serves.
LABEL_CLAIM_UID: Final = f"{GROUP}/claim-uid"
# CDI kind of the specs the kubelet plugin writes per prepared claim device.
DRA_CDI_KIND: Final = f"{GROUP}/claim"
# The scheduler's own claim for a pod's extended-resource request backed by a
# DeviceClass (KEP-5004): `deviceclass.resource.kubernetes.io/<class>` in limits.
DRA_EXTENDED_RESOURCE_CLAIM_ANNOTATION: Final = "resource.kubernetes.io/extended-resource-claim"


def dra_counter_set(chip: int) -> str:
    """Counter set of one chip in its node's pool (a DNS label)."""
    return f"npu-{chip}"


def dra_device_name(chip: int, template: str, instance: int) -> str:
    """One template instance on a chip, e.g. npu-0-vir05-1c-16g-1 (a DNS label:
    the template's underscores become dashes)."""
    return f"npu-{chip}-{template.replace('_', '-')}-{instance}"


_DRA_DEVICE = re.compile(r"^npu-([0-9]+)-(vir[0-9]{2}(?:-[0-9a-z]+)*)-([0-9]+)$")


def parse_dra_device_name(device: str) -> tuple[int, str, int] | None:
    """(chip, template, instance) of a name dra_device_name made, else None."""
    match = _DRA_DEVICE.match(device)
    if match is None:
        return None
    return int(match[1]), match[2].replace("-", "_"), int(match[3])


def dra_allocation_name(claim_uid: str, device: str) -> str:
    """The VNPUAllocation of one allocated device of a claim: the claim UID
    makes it unique in the namespace and stable across operator restarts."""
    return f"{claim_uid}-{device}"[:253]


# --------------------------------------------------------------------------
# What a vNPU container sees (docs/DRA.md, "What the container sees"). CANN
# numbers the devices a container holds 0..n-1 in ascending vNPU id; the id
# itself (ASCEND_VISIBLE_DEVICES, /dev/davinci<id>) is never an index.
ENV_RT_VISIBLE_DEVICES: Final = "ASCEND_RT_VISIBLE_DEVICES"
# KEP-5304 device metadata, as k8s.io/dynamic-resource-allocation v0.37
# (api/metadata, kubeletplugin/metadata.go) lays it out: newest version first.
DRA_METADATA_API_VERSIONS: Final = (
    "metadata.resource.k8s.io/v1beta1",
    "metadata.resource.k8s.io/v1alpha1",
)
DRA_METADATA_KIND: Final = "DeviceMetadata"
DRA_METADATA_CONTAINER_DIR: Final = "/var/run/kubernetes.io/dra-device-attributes"
DRA_METADATA_CLAIMS_SUBDIR: Final = "resourceclaims"
DRA_METADATA_TEMPLATES_SUBDIR: Final = "resourceclaimtemplates"
DRA_METADATA_FILE: Final = f"{DRA_DRIVER}-metadata.json"
DRA_METADATA_HOST_SUBDIR: Final = "dra-device-metadata"
# Set on a claim made from a template: its name in the pod (pod.spec.resourceClaims[].name).
DRA_POD_CLAIM_NAME_ANNOTATION: Final = "resource.kubernetes.io/pod-claim-name"
DRA_ATTR_VNPU_ID: Final = "vnpuId"


def device_indexes(count: int) -> str:
    """ASCEND_RT_VISIBLE_DEVICES of a container holding `count` vNPUs: all of them."""
    return ",".join(str(i) for i in range(count))
