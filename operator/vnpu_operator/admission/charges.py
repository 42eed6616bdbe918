"""What a vNPU pod is charged in extended resources, so that quota counts it.

The webhook writes the charge into one container's requests and limits
(extended resources need both, and equal). ResourceQuota and Kueue then count
`requests.vnpu.io/aicore`, `requests.vnpu.io/memory-mb`,
`requests.vnpu.io/vnpus` and `requests.vnpu.io/<template>` the way they count
CPU; the last is also what a pod on a DRA node is counted in when it asks
`limits: {vnpu.io/<template>: N}`, so one quota counts the pod on both paths.
The charge is exactly what the ledger books for the pod: count x the
template's AICore and memory on the chip model it will run on, so the
scheduler's sum of requests on a node never exceeds the totals the operator
advertises there (vnpu_operator.advertise).
"""

from __future__ import annotations

from dataclasses import dataclass

from vnpu_common.wire import names
from vnpu_operator.admission.offered import OfferedTemplates
from vnpu_operator.annotations import quote


@dataclass(frozen=True)
class Charge:
    aicore: int
    memory_mb: int
    vnpus: int
    # The template of the vNPUs: charged as vnpu.io/<template> = vnpus.
    template: str = ""

    def amounts(self) -> dict[str, int]:
        """Resource name -> amount."""
        out = {
            names.RES_AICORE: self.aicore,
            names.RES_MEMORY_MB: self.memory_mb,
            names.RES_VNPUS: self.vnpus,
        }
        if self.template:
            out[names.template_resource(self.template)] = self.vnpus
        return out

    def resources(self) -> dict[str, str]:
        """Resource name -> quantity, as the webhook writes it."""
        return {resource: str(amount) for resource, amount in self.amounts().items()}


def charge_for(
    template: str, count: int, chip_model: str | None, offered: OfferedTemplates
) -> Charge | str:
    """The charge of `count` vNPUs of `template`, or why there is none."""
    size = offered.size(template, chip_model)
    if size is not None:
        aicore, memory_mb = size
        return Charge(
            aicore=aicore * count, memory_mb=memory_mb * count, vnpus=count, template=template
        )
    sizes = offered.sizes_by_model(template)
    if len(set(sizes.values())) > 1:
        listed = "; ".join(f"{m}: {a} AICore, {mb} MB" for m, (a, mb) in sorted(sizes.items()))
        return (
            f"{names.ANN_TEMPLATE} {quote(template)} takes different resources on the chip "
            f"models offering it ({listed}): name one with {names.ANN_CHIP_MODEL}, so that "
            f"the pod's quota charge ({names.RES_AICORE}, {names.RES_MEMORY_MB}) is what it takes"
        )
    return f"{names.ANN_TEMPLATE} {quote(template)} is not offered by any node"
