"""`helm uninstall`'s pre-delete hook of the vnpu-operator chart: an uninstall
that cannot strand pods.

1. Refuses (exit 1, the uninstall fails and nothing is deleted) while any
   VNPUAllocation exists: with the operator and the agents gone, nobody would
   remove the finalizers of those pods and allocations (stuck Terminating)
   or destroy their vNPUs. `uninstall.force=true` goes on regardless.
2. Scales the operator's Deployment to 0 and waits for its pods to go, so
   that nothing advertises the vNPU resources again behind step 3.
3. Removes the vNPU extended resources the operator advertised on every Node
   (vnpu.io/aicore, vnpu.io/memory-mb, vnpu.io/vnpus in status.capacity and
   status.allocatable): nothing requests them once the chart is gone.

Standard library only: it runs as `python -c` in the chart's image, as the
`helm test` script does, with its ServiceAccount's token.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

# The names the operator uses (vnpu_common.wire.names); a unit test keeps them equal.
ALLOCATIONS = "/apis/vnpu.io/v1alpha1/vnpuallocations"
RESOURCES = ("vnpu.io/aicore", "vnpu.io/memory-mb", "vnpu.io/vnpus")
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
MERGE_PATCH = "application/merge-patch+json"


class ApiError(Exception):
    pass


def request(method: str, path: str, body: Any = None, content_type: str = MERGE_PATCH) -> Any:
    """One call as this pod's ServiceAccount; the answer's JSON, ApiError on a non-2xx."""
    sa_dir = os.environ.get("VNPU_SA_DIR", SERVICE_ACCOUNT_DIR)
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ["KUBERNETES_SERVICE_PORT"]
    if ":" in host:
        host = f"[{host}]"
    with open(os.path.join(sa_dir, "token"), encoding="utf-8") as f:
        token = f.read().strip()
    context = ssl.create_default_context(cafile=os.path.join(sa_dir, "ca.crt"))
    req = urllib.request.Request(
        f"https://{host}:{port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": content_type},
    )
    try:
        with urllib.request.urlopen(req, context=context, timeout=30) as response:
            return json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            message = json.loads(raw or b"{}").get("message", "")
        except ValueError:
            message = raw.decode(errors="replace")
        raise ApiError(f"{method} {path}: HTTP {exc.code}: {message}") from None


def allocations() -> list[str]:
    """namespace/name (pod) of every VNPUAllocation."""
    out = []
    for item in request("GET", ALLOCATIONS).get("items") or []:
        meta = item.get("metadata") or {}
        pod = (item.get("spec") or {}).get("podName") or "?"
        out.append(f"{meta.get('namespace')}/{meta.get('name')} (pod {pod})")
    return sorted(out)


def node_patch(node: dict[str, Any]) -> dict[str, Any] | None:
    """The merge patch that removes our resources from a Node, or None."""
    status = node.get("status") or {}
    patch: dict[str, dict[str, None]] = {}
    for section in ("capacity", "allocatable"):
        ours = [r for r in RESOURCES if r in (status.get(section) or {})]
        if ours:
            patch[section] = dict.fromkeys(ours)
    return {"status": patch} if patch else None


def stop_operator(namespace: str, deployment: str, timeout: float) -> None:
    """Scales the operator to 0 and waits until none of its pods is left."""
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{deployment}"
    try:
        obj = request("GET", path)
    except ApiError as exc:
        if "HTTP 404" in str(exc):
            print(f"operator Deployment {namespace}/{deployment} not found", flush=True)
            return
        raise
    request("PATCH", path, {"spec": {"replicas": 0}})
    labels = (obj.get("spec") or {}).get("selector", {}).get("matchLabels") or {}
    selector = urllib.parse.quote(",".join(f"{k}={v}" for k, v in sorted(labels.items())))
    pods = f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}"
    deadline = time.monotonic() + timeout
    while left := request("GET", pods).get("items"):
        if time.monotonic() >= deadline:
            raise ApiError(f"{len(left)} operator pod(s) still there after {timeout:g}s")
        time.sleep(1)
    print(f"operator {namespace}/{deployment} scaled to 0", flush=True)


def remove_resources() -> list[str]:
    done = []
    for node in request("GET", "/api/v1/nodes").get("items") or []:
        patch = node_patch(node)
        if patch is None:
            continue
        name = node["metadata"]["name"]
        request("PATCH", f"/api/v1/nodes/{urllib.parse.quote(name)}/status", patch)
        done.append(name)
    return done


def main() -> int:
    force = os.environ.get("VNPU_FORCE", "false").lower() == "true"
    namespace = os.environ["VNPU_RELEASE_NAMESPACE"]
    deployment = os.environ["VNPU_OPERATOR_DEPLOYMENT"]
    timeout = float(os.environ.get("VNPU_TIMEOUT_SECONDS", "120"))
    try:
        held = allocations()
        if held and not force:
            print(
                f"REFUSED: {len(held)} VNPUAllocation(s) exist: {', '.join(held[:10])}"
                f"{' ...' if len(held) > 10 else ''}. Uninstalling now would leave their pods "
                "and allocations stuck Terminating and their vNPUs on the nodes. Delete the "
                "pods that use vNPUs, wait until `kubectl get vnpuallocations -A` is empty and "
                "uninstall again, or set uninstall.force=true (helm upgrade --reuse-values --set "
                "uninstall.force=true) and uninstall (docs/HELM.md, Uninstall).",
                flush=True,
            )
            return 1
        if held:
            print(f"uninstall.force=true: going on with {len(held)} VNPUAllocation(s)", flush=True)
        stop_operator(namespace, deployment, timeout)
        nodes = remove_resources()
    except (ApiError, OSError, ValueError) as exc:
        print(f"FAIL: {exc}", flush=True)
        return 1
    print(
        f"vNPU resources removed from {len(nodes)} node(s)"
        + (f": {', '.join(nodes)}" if nodes else ""),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
