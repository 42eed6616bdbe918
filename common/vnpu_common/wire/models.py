"""API models of vnpu.io/v1alpha1: the one definition of our resources.

The CRD YAML in `crds/` is generated from these classes (see `crdgen`), the
operator and the agent parse and build objects with them, so the schema the
API server enforces and the one the code assumes cannot drift apart.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from vnpu_common.wire import names

ConditionStatus = Literal["True", "False", "Unknown"]
Phase = Literal["Pending", "Ready", "Releasing", "Failed"]
Health = Literal["Healthy", "Unhealthy", "Unknown"]

# metav1.Condition's own validation, copied so that our CRD enforces the same.
_CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
_CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


def list_map(key: str) -> dict[str, Any]:
    """A list the API server merges by `key` (x-kubernetes-list-type map)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [key]}


LIST_MAP_BY_TYPE: dict[str, Any] = list_map("type")


class ApiModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields ignored so
    that an older component reads objects written by a newer one."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        frozen=False,
    )

    def to_api(self) -> dict[str, Any]:
        """The JSON-ready dict the API server expects (aliases, no nulls)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def now() -> datetime:
    """Condition timestamps: metav1.Time has whole-second precision."""
    return datetime.now(UTC).replace(microsecond=0)


class Condition(ApiModel):
    """One aspect of the object's state (shape and validation of metav1.Condition)."""

    type: str = Field(
        max_length=316,
        pattern=_CONDITION_TYPE_PATTERN,
        description="Which aspect this condition reports, e.g. Ready; one condition per type.",
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="metadata.generation of the object when this condition was set.",
    )
    last_transition_time: datetime = Field(
        description="When status last changed (not when the condition was last written)."
    )
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=_CONDITION_REASON_PATTERN,
        description="Why the status is what it is, one CamelCase word for programs.",
    )
    message: str = Field(max_length=32768, description="Why, in words for people; may be empty.")


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str = "",
    observed_generation: int | None = None,
) -> list[Condition]:
    """Returns conditions with `type_` set; keeps lastTransitionTime unless
    the status changes, as metav1 conventions require."""
    old = find_condition(conditions, type_)
    new = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        observed_generation=observed_generation,
        last_transition_time=old.last_transition_time
        if old is not None and old.status == status
        else now(),
    )
    if old is None:
        return [*conditions, new]
    return [new if c.type == type_ else c for c in conditions]


def find_condition(conditions: list[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


class ObjectMeta(ApiModel):
    """The parts of metav1.ObjectMeta our components read."""

    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)
    owner_references: list[dict[str, Any]] = Field(default_factory=list)
    deletion_timestamp: datetime | None = None
    creation_timestamp: datetime | None = None


# --------------------------------------------------------------------------
# VNPUAllocation


class ClaimRef(ApiModel):
    """The DRA device a VNPUAllocation serves (docs/DRA.md): set on the
    allocations the operator writes for ResourceClaims, absent on those of
    annotated pods."""

    name: str = Field(min_length=1, max_length=253, description="ResourceClaim name.")
    uid: str = Field(min_length=1, max_length=64, description="ResourceClaim UID.")
    request: str = Field(
        min_length=1, max_length=253, description="Request of the claim the device answers."
    )
    device: str = Field(
        min_length=1, max_length=128, description="Device of the node's pool, as allocated."
    )


class VNPUAllocationSpec(ApiModel):
    """Declared ownership: this pod owns this vNPU on this chip of this node.
    Immutable: a different placement is a different allocation."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "spec is immutable"}
            ]
        }
    )

    pod_name: str = Field(
        min_length=1, max_length=253, description="Name of the pod that owns the vNPU."
    )
    pod_uid: str = Field(
        alias="podUID", min_length=1, max_length=64, description="UID of the owning pod."
    )
    node_name: str = Field(
        min_length=1, max_length=253, description="Node whose agent creates the vNPU."
    )
    chip: int = Field(ge=0, le=1023, description="Chip index on the node (npu-smi logical id).")
    template: str = Field(
        min_length=4,
        max_length=names.TEMPLATE_MAX_LEN,
        pattern=names.TEMPLATE_PATTERN,
        description="vNPU template, e.g. vir05_1c_16g.",
    )
    vnpu_id: int = Field(
        ge=names.VNPU_ID_MIN,
        le=names.VNPU_ID_MAX,
        description="vNPU id the agent must create (unique per node).",
    )
    claim: ClaimRef | None = Field(
        default=None,
        description="The ResourceClaim device this vNPU answers (DRA); the pod fields then "
        "name the pod the claim was first reserved for.",
    )


class VNPUAllocationStatus(ApiModel):
    """What the node agent last did with the allocation; written by the agent only."""

    phase: Phase | None = Field(
        default=None,
        description="Pending (vNPU not created yet), Ready (created, the pod may start), "
        "Releasing (being destroyed) or Failed (see message).",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra=LIST_MAP_BY_TYPE,
        max_length=8,
        description="Ready (the vNPU exists) and Healthy (its chip is healthy), by type.",
    )
    device_path: str | None = Field(default=None, description="Host device node of the vNPU.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the agent acted on last."
    )
    message: str | None = Field(
        default=None,
        max_length=32768,
        description="Why the allocation is Failed or still Pending, in words; empty when Ready.",
    )


class VNPUAllocation(ApiModel):
    api_version: str = names.API_VERSION
    kind: str = names.ALLOCATION_KIND
    metadata: ObjectMeta
    spec: VNPUAllocationSpec
    status: VNPUAllocationStatus = Field(default_factory=VNPUAllocationStatus)


# --------------------------------------------------------------------------
# VNPUNode


class TemplateResources(ApiModel):
    """A template a chip offers and what one vNPU of it takes."""

    name: str = Field(
        max_length=names.TEMPLATE_MAX_LEN,
        pattern=names.TEMPLATE_PATTERN,
        description="Template name as pods ask for it (vnpu.io/template), e.g. vir05_1c_16g.",
    )
    aicore: int = Field(ge=0, description="AI Cores one vNPU of this template takes.")
    memory_mb: int = Field(ge=0, description="Device memory one vNPU takes, in MiB.")
    aicpu: int = Field(ge=0, description="AI CPUs one vNPU takes.")
    media: int = Field(default=0, ge=0, description="Media (DVPP) units the template takes.")


class VNPUInfo(ApiModel):
    """A vNPU present on a chip and who owns it, by declaration."""

    id: int = Field(
        ge=names.VNPU_ID_MIN,
        le=names.VNPU_ID_MAX,
        description="vNPU id on the node (a VNPUAllocation's spec.vnpuId).",
    )
    template: str = Field(description="Template the vNPU was created with.")
    in_use: bool = Field(default=False, description="Driver's is_container_used flag.")
    allocation: str | None = Field(
        default=None, description="namespace/name of the owning allocation; none for orphans."
    )
    pod_uid: str | None = Field(
        default=None, alias="podUID", description="UID of the owning pod; none for orphans."
    )


class ChipStatus(ApiModel):
    """One NPU chip as the driver reports it: identity, health, capacity and its vNPUs."""

    index: int = Field(
        ge=0, description="Chip index on the node (npu-smi logical id); the key of this list."
    )
    physical_id: int = Field(ge=0, description="Physical chip id (npu-smi's Phy-ID).")
    card_id: int = Field(ge=0, description="NPU card (npu-smi's NPU ID) the chip is on.")
    device_id: int = Field(ge=0, description="Chip number on its card (npu-smi's Chip ID).")
    model: str = Field(min_length=1, description="Chip model, e.g. 310P3 or 910B3.")
    health: Health = Field(
        description="Healthy, Unhealthy or Unknown; no new vNPU goes to an unhealthy chip."
    )
    aicore_total: int = Field(ge=0, description="AI Cores of the whole chip.")
    aicore_free: int = Field(ge=0, description="AI Cores no vNPU takes.")
    memory_total_mb: int = Field(ge=0, description="Device memory of the whole chip, in MiB.")
    memory_free_mb: int = Field(ge=0, description="Device memory no vNPU takes, in MiB.")
    aicpu_total: int = Field(ge=0, description="AI CPUs of the whole chip.")
    aicpu_free: int = Field(ge=0, description="AI CPUs no vNPU takes.")
    media_total: int = Field(
        default=0, ge=0, description="Media (DVPP) units of the whole chip; 0 if not reported."
    )
    media_free: int = Field(default=0, ge=0, description="Media (DVPP) units no vNPU takes.")
    vnpu_id_min: int = Field(
        ge=names.VNPU_ID_MIN,
        le=names.VNPU_ID_MAX,
        description="Lowest vNPU id the driver accepts on this chip.",
    )
    vnpu_id_max: int = Field(
        ge=names.VNPU_ID_MIN,
        le=names.VNPU_ID_MAX,
        description="Highest vNPU id the driver accepts on this chip.",
    )
    # Absent (None) rather than empty when the model's list holds: [] is a
    # chip that offers nothing, which a driver reports for a chip it cannot
    # list.
    templates: list[TemplateResources] | None = Field(
        default=None,
        description="Templates this chip offers, where they differ from its model's in "
        "status.models; absent when they do not (VNPUNodeStatus.chip_templates).",
        json_schema_extra=list_map("name"),
    )
    vnpus: list[VNPUInfo] = Field(
        default_factory=list,
        description="vNPUs present on the chip now, with their owners, by id.",
        json_schema_extra=list_map("id"),
    )


class ModelTemplates(ApiModel):
    """The templates every chip of one model on the node offers."""

    model: str = Field(min_length=1, description="Chip model, as in status.chips[].model.")
    templates: list[TemplateResources] = Field(
        default_factory=list,
        description="Templates the model's chips offer and what one vNPU of each takes, by name.",
        json_schema_extra=list_map("name"),
    )


class VNPUNodeStatus(ApiModel):
    """What the node's agent sees on its chips; written by the agent only."""

    driver: str | None = Field(default=None, description="Driver backend: sim, npu-smi or dcmi.")
    dra: bool = Field(
        default=False,
        description="The agent publishes the node's chips as a DRA pool (--dra): vNPUs "
        "come from ResourceClaims only, never from pod annotations.",
    )
    chip_count: int = Field(default=0, ge=0, description="Number of NPU chips on the node.")
    vnpu_count: int = Field(default=0, ge=0, description="Number of vNPUs on all chips.")
    free_aicore: int = Field(
        default=0, ge=0, alias="freeAICore", description="AI Cores free on all chips together."
    )
    # Printer columns show one value of a list: these say "0,3" in one cell.
    # Empty rather than absent when none: the agent's merge patch of the
    # status would leave an absent field as it was.
    cordoned: str = Field(
        default="",
        max_length=4096,
        description="Chips of spec.cordonedChips, e.g. 0,3, as the agent last read them.",
    )
    unhealthy: str = Field(
        default="", max_length=4096, description="Chips the driver reports unhealthy, e.g. 1."
    )
    # Once per model, not per chip: every chip of a model offers the same
    # list, and repeated on 8 chips it was 60% of the object the API server
    # decodes, validates and encodes whole on every status write.
    models: list[ModelTemplates] = Field(
        default_factory=list,
        description="Templates each chip model on the node offers, by model.",
        json_schema_extra=list_map("model"),
    )
    chips: list[ChipStatus] = Field(
        default_factory=list,
        description="Every NPU chip of the node, by index.",
        json_schema_extra=list_map("index"),
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra=LIST_MAP_BY_TYPE,
        max_length=8,
        description="Ready (the driver answers) and ChipsHealthy (no chip is unhealthy), by type.",
    )

    def chip_templates(self, chip: ChipStatus) -> list[TemplateResources]:
        """What `chip` offers: its own list where it has one, else its model's."""
        if chip.templates is not None:
            return chip.templates
        return next((m.templates for m in self.models if m.model == chip.model), [])

    def resolve_templates(self) -> None:
        """Gives every chip its list (chip_templates), for readers that take
        a chip alone; an object resolved so is not one to write back."""
        for chip in self.chips:
            chip.templates = self.chip_templates(chip)


class CordonedChip(ApiModel):
    """A chip out of service: no new vNPU goes there; those on it stay."""

    chip: int = Field(ge=0, le=1023, description="Chip index on the node (as in status.chips).")
    reason: str = Field(
        min_length=1, max_length=names.CORDON_REASON_MAX_LEN, description="Why, for other admins."
    )


class VNPUNodeSpec(ApiModel):
    """What admins declare about a node; the agent writes only the status."""

    cordoned_chips: list[CordonedChip] = Field(
        default_factory=list,
        max_length=1024,
        description="Chips out of service for new vNPUs (kubectl vnpu cordon; docs/USAGE.md).",
        json_schema_extra=list_map("chip"),
    )


class VNPUNode(ApiModel):
    api_version: str = names.API_VERSION
    kind: str = names.NODE_KIND
    metadata: ObjectMeta
    spec: VNPUNodeSpec = Field(default_factory=VNPUNodeSpec)
    status: VNPUNodeStatus = Field(default_factory=VNPUNodeStatus)
