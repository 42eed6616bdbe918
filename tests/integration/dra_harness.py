"""Manifests the DRA tests share: the chart's DeviceClass, a ResourceClaim, a
ResourceClaimTemplate choosing a vNPU template by CEL, and pods that use them."""

from __future__ import annotations

from typing import Any

from vnpu_common.wire import names


def device_class() -> dict[str, Any]:
    """What the chart installs (templates/deviceclass.yaml)."""
    return {
        "apiVersion": names.RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": names.DRA_DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{names.DRA_DRIVER}"'}}]},
    }


def template_class(template: str) -> dict[str, Any]:
    """The chart's DeviceClass for vnpu.io/<template> (templates/deviceclass.yaml;
    test_chart_render checks the chart renders exactly this)."""
    selector = f'device.attributes["{names.DRA_DRIVER}"].{names.DRA_ATTR_TEMPLATE} == "{template}"'
    return {
        "apiVersion": names.RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": names.template_device_class(template)},
        "spec": {
            "selectors": [
                {"cel": {"expression": f'device.driver == "{names.DRA_DRIVER}" && {selector}'}}
            ],
            "extendedResourceName": names.template_resource(template),
        },
    }


def limits_pod(namespace: str, name: str, counts: dict[str, int], **spec: Any) -> dict[str, Any]:
    """A pod asking for vNPUs the one way that works on every cluster: one
    container per entry of `counts` (template -> N), each with
    limits: {vnpu.io/<template>: N}."""
    containers = [
        {
            "name": f"c{i}",
            "image": "busybox",
            "resources": {"limits": {names.template_resource(t): str(n)}},
        }
        for i, (t, n) in enumerate(counts.items())
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": containers,
            "tolerations": [{"operator": "Exists"}],
            "nodeSelector": {"type": "kwok"},
            **spec,
        },
    }


def limits_deployment(
    namespace: str,
    name: str,
    template: str,
    count: int = 1,
    *,
    image: str = "busybox",
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The manifest a user writes once for every cluster (docs/USAGE.md, "One
    request"): a Deployment of one replica whose container asks
    limits: {vnpu.io/<template>: count}, with no claim and no annotation."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "nodeSelector": dict(node_selector or {}),
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            "command": [
                                "sh", "-c", 'trap "exit 0" TERM; while true; do sleep 1; done'
                            ],
                            "resources": {
                                "limits": {names.template_resource(template): str(count)}
                            },
                        }
                    ],
                },
            },
        },
    }  # fmt: skip


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
