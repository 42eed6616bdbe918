"""`helm test` of the vnpu-operator chart: does the admission webhook answer?

Asks the API server for a server-side dry-run create of a pod that names a vNPU
template nothing offers. Passes only when a vnpu-operator webhook refuses it;
fails when the pod would be admitted (the webhook is not in the path) and when
the webhook cannot be reached (the API server then refuses for that reason,
which proves nothing about the webhook). Keeps asking for a while, as the
operator may still be starting. Standard library only: it runs as `python -c`
in the chart's image, whose Python has no client library on its path for it.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from typing import Any

# The names the operator uses (vnpu_common.wire.names); a unit test keeps them equal.
TEMPLATE_ANNOTATION = "vnpu.io/template"
WEBHOOKS = ("mutate.pods.vnpu.io", "validate.pods.vnpu.io")
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def probe_pod(template: str) -> dict[str, Any]:
    """The pod whose creation the webhook must refuse: it asks for `template`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "vnpu-webhook-probe-",
            "annotations": {TEMPLATE_ANNOTATION: template},
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "probe", "image": "registry.invalid/never-pulled"}],
        },
    }


def judge(status: int, body: Any, template: str) -> tuple[bool, str]:
    """(passed, what to tell the admin) for the API server's answer to the dry run."""
    message = body.get("message", "") if isinstance(body, dict) else ""
    if 200 <= status < 300:
        return False, (
            f"a pod naming {TEMPLATE_ANNOTATION}={template} was admitted (dry run): no "
            "vnpu-operator webhook refused it; are the MutatingWebhookConfiguration and "
            "ValidatingWebhookConfiguration vnpu-operator installed?"
        )
    for name in WEBHOOKS:
        if f'admission webhook "{name}" denied the request' in message:
            if template not in message:
                return False, f"webhook {name} refused the pod, but not for its template: {message}"
            return True, f"webhook {name} refused a pod naming {template}: {message}"
    if any(f'"{name}"' in message for name in WEBHOOKS):
        return False, f"the vnpu-operator webhook did not answer (HTTP {status}): {message}"
    return False, f"refused before the webhook judged it (HTTP {status}): {message}"


def dry_run_create(namespace: str, pod: dict[str, Any]) -> tuple[int, Any]:
    """POSTs `pod` with dryRun=All as this pod's ServiceAccount; (status, body)."""
    sa_dir = os.environ.get("VNPU_TEST_SA_DIR", SERVICE_ACCOUNT_DIR)
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ["KUBERNETES_SERVICE_PORT"]
    if ":" in host:
        host = f"[{host}]"
    with open(os.path.join(sa_dir, "token"), encoding="utf-8") as f:
        token = f.read().strip()
    context = ssl.create_default_context(cafile=os.path.join(sa_dir, "ca.crt"))
    request = urllib.request.Request(
        f"https://{host}:{port}/api/v1/namespaces/{namespace}/pods?dryRun=All",
        data=json.dumps(pod).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw or b"{}")
        except ValueError:
            return exc.code, {"message": raw.decode(errors="replace")}


def main() -> int:
    template = os.environ.get("VNPU_TEST_TEMPLATE", "no-such-template")
    namespace = os.environ["VNPU_TEST_NAMESPACE"]
    deadline = time.monotonic() + float(os.environ.get("VNPU_TEST_TIMEOUT_SECONDS", "60"))
    while True:
        try:
            status, body = dry_run_create(namespace, probe_pod(template))
            passed, verdict = judge(status, body, template)
        except (OSError, ValueError) as exc:
            passed, verdict = False, f"the API server could not be asked: {exc}"
        if passed or time.monotonic() >= deadline:
            print(("PASS: " if passed else "FAIL: ") + verdict, flush=True)
            return 0 if passed else 1
        print(f"not yet: {verdict}", flush=True)
        time.sleep(3)


if __name__ == "__main__":
    sys.exit(main())
