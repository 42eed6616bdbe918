"""The chart's install hook for podSecurity.manageNamespace: the release
namespace's Pod Security labels, then proof that the agent's pods are admitted.

`helm install` and `helm upgrade` run it (as `python -m
vnpu_operator.pod_security` in the chart's image) before anything else of the
release. It writes the `pod-security.kubernetes.io/<mode>` labels the values
name, then asks the API server to admit, in a dry run, a pod with the agent's
own security context and host path. A dry run passes every admission step a
real create would (Pod Security at the namespace's effective level, a
cluster-wide default included, and any other policy engine), so a refusal here
is the refusal the agent's DaemonSet would meet, said before the install
rather than as FailedCreate events afterwards. Exit 1 with the API server's
reason then, and the install fails with nothing else created.

Environment (the chart sets it): VNPU_NAMESPACE, VNPU_POD_SECURITY_LABELS (a
JSON object of the labels) and VNPU_AGENT_PROBE_POD (a JSON pod spec like the
agent's).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any, cast

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common import __version__
from vnpu_common.kube.apiclient import api_client
from vnpu_common.process.startup import load_kube_config
from vnpu_common.wire import names
from vnpu_common.wire.patches import MERGE

PROG = "vnpu-pod-security"
PROBE_NAME = "vnpu-pod-security-probe"


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except ValueError:
        return str(exc.body or exc.reason)


async def run(namespace: str, labels: dict[str, str], probe: dict[str, Any]) -> int:
    # The pod's ServiceAccount, as the components load theirs.
    await load_kube_config(PROG, None)
    connection = api_client(f"{names.USER_AGENT_OPERATOR}/{__version__} (pod-security hook)")
    api = client.CoreV1Api(connection)
    try:
        if labels:
            patch: Any = {"metadata": {"labels": labels}}
            # The generated signature leaves out the content type it accepts.
            await cast(Any, api).patch_namespace(namespace, patch, _content_type=MERGE)
            print(f"namespace {namespace}: labelled {json.dumps(labels, sort_keys=True)}")
        ns: Any = await api.read_namespace(namespace)
        current = {
            k: v
            for k, v in sorted((ns.metadata.labels or {}).items())
            if k.startswith("pod-security.kubernetes.io/")
        }
        pod: Any = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": PROBE_NAME, "namespace": namespace},
            "spec": probe,
        }
        try:
            await api.create_namespaced_pod(namespace, pod, dry_run="All")
        except ApiException as exc:
            if exc.status in (400, 403, 422):
                print(
                    f"namespace {namespace} refuses a pod like the agent's "
                    f"(Pod Security labels {json.dumps(current, sort_keys=True) or 'none'}; "
                    f"without an enforce label the cluster's default applies): {_message(exc)}\n"
                    "Set podSecurity.enforce=privileged (docs/HELM.md, Pod Security), or "
                    "exempt this namespace from the policy that refused it.",
                    file=sys.stderr,
                )
                return 1
            raise
        print(
            f"namespace {namespace}: a pod like the agent's is admitted "
            f"(Pod Security labels {json.dumps(current, sort_keys=True) or 'none'})"
        )
        return 0
    finally:
        await connection.close()


def main() -> int:
    try:
        namespace = os.environ["VNPU_NAMESPACE"]
        labels = json.loads(os.environ.get("VNPU_POD_SECURITY_LABELS") or "{}")
        probe = json.loads(os.environ["VNPU_AGENT_PROBE_POD"])
    except (KeyError, ValueError) as exc:
        print(f"pod-security hook: bad environment: {exc!r}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(run(namespace, labels, probe))
    except ApiException as exc:
        print(f"pod-security hook: HTTP {exc.status}: {_message(exc)}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"pod-security hook: cannot reach the API server: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
