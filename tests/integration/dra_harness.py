"""Manifests the DRA tests share: the chart's DeviceClass, a ResourceClaim, a
ResourceClaimTemplate choosing a vNPU template by CEL, and pods that use them."""

from __future__ import annotations

from typing import Any

from vnpu_common import names


def device_class() -> dict[str, Any]:
    """What the chart installs (templates/deviceclass.yaml)."""
    return {
        "apiVersion": names.RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": names.DRA_DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{names.DRA_DRIVER}"'}}]},
    }


def claim_template(namespace: str, name: str, template: str, count: int = 1) -> dict[str, Any]:
    selector = f'device.attributes["{names.DRA_DRIVER}"].{names.DRA_ATTR_TEMPLATE} == "{template}"'
    return {
        "apiVersion": names.RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "npu",
                            "exactly": {
                                "deviceClassName": names.DRA_DEVICE_CLASS,
                                "count": count,
                                "selectors": [{"cel": {"expression": selector}}],
                            },
                        }
                    ]
                }
            }
        },
    }


def claim_pod(namespace: str, name: str, template_claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "npu"}]}}
            ],
            "resourceClaims": [{"name": "npu", "resourceClaimTemplateName": template_claim}],
            "tolerations": [{"operator": "Exists"}],
            "nodeSelector": {"type": "kwok"},
        },
    }


def resource_claim(namespace: str, name: str) -> dict[str, Any]:
    """A claim for one device of the class, any template."""
    return {
        "apiVersion": names.RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "npu", "exactly": {"deviceClassName": names.DRA_DEVICE_CLASS}}
                ]
            }
        },
    }
