"""Reading the cluster as kubectl does: the user's kubeconfig (--kubeconfig,
else $KUBECONFIG, else ~/.kube/config; --context, else the current one),
one LIST per kind, every failure turned into a sentence (CliError)."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException, load_kube_config

from vnpu_cli.errors import CliError
from vnpu_common.kube.rawcall import call_json
from vnpu_common.wire import names
from vnpu_common.wire.types import Raw

# Per request; a cluster that answers nothing in this long is not there.
REQUEST_TIMEOUT_SECONDS = 30


@dataclass(frozen=True)
class Target:
    kubeconfig: str | None = None
    context: str | None = None


@dataclass
class Connection:
    api: client.ApiClient
    host: str
    namespace: str  # the context's namespace, else "default"


def kubeconfig_path(target: Target) -> str:
    """The kubeconfig kubectl would read; CliError when none of its files exists."""
    path = target.kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube/config")
    if not any(Path(p).expanduser().exists() for p in path.split(os.pathsep) if p):
        raise CliError(f"no kubeconfig at {path} (set KUBECONFIG or pass --kubeconfig)")
    return path


async def connect(target: Target) -> Connection:
    path = kubeconfig_path(target)
    configuration = client.Configuration()
    try:
        loader = await load_kube_config(
            config_file=path,
            context=target.context,
            client_configuration=configuration,
            persist_config=False,
        )
    except (ConfigException, KeyError, ValueError, OSError) as exc:
        raise CliError(f"cannot use kubeconfig {path}: {exc}") from exc
    context = loader.current_context or {}
    namespace = (context.get("context") or {}).get("namespace") or "default"
    return Connection(client.ApiClient(configuration), str(configuration.host), str(namespace))


async def _call(
    conn: Connection, what: str, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any
) -> Any:
    try:
        return await call_json(fn, *args, _request_timeout=REQUEST_TIMEOUT_SECONDS, **kwargs)
    except ApiException as exc:
        if exc.status == 403:
            raise CliError(f"not allowed to {what}: {_message(exc)}") from exc
        raise
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise CliError(
            f"cannot reach the cluster at {conn.host}: {str(exc) or type(exc).__name__}"
        ) from exc


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or b"").get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


async def list_items(
    conn: Connection, what: str, fn: Callable[..., Awaitable[Any]], *args: Any
) -> list[Raw]:
    return list((await _call(conn, what, fn, *args)).get("items") or [])


async def vnpu_objects(conn: Connection, plural: str, namespace: str | None = None) -> list[Raw]:
    custom = client.CustomObjectsApi(conn.api)
    try:
        if namespace is None:
            return await list_items(
                conn, f"list {plural}", custom.list_cluster_custom_object,
                names.GROUP, names.VERSION, plural,
            )  # fmt: skip
        return await list_items(
            conn, f"list {plural} in {namespace}", custom.list_namespaced_custom_object,
            names.GROUP, names.VERSION, namespace, plural,
        )  # fmt: skip
    except ApiException as exc:
        if exc.status == 404:
            raise CliError(
                f"the {names.GROUP} resources are not installed in this cluster "
                f"({plural} not found); install the vnpu-operator chart or its CRDs"
            ) from exc
        raise


async def nodes(conn: Connection) -> list[Raw]:
    return await list_items(conn, "list nodes", client.CoreV1Api(conn.api).list_node)


async def leases(conn: Connection, namespace: str) -> list[Raw]:
    """The agents' Leases. A namespace that does not exist just has none."""
    api = client.CoordinationV1Api(conn.api)
    try:
        return await list_items(
            conn, f"list leases in {namespace}", api.list_namespaced_lease, namespace
        )
    except ApiException as exc:
        if exc.status == 404:
            return []
        raise


async def vnpu_pods(conn: Connection, namespace: str | None) -> list[Raw]:
    """Pods the admission webhook marked as asking for vNPUs."""
    api = client.CoreV1Api(conn.api)
    selector = f"{names.LABEL_MANAGED}=true"
    if namespace is None:
        every = partial(api.list_pod_for_all_namespaces, label_selector=selector)
        return await list_items(conn, "list pods", every)
    one = partial(api.list_namespaced_pod, namespace, label_selector=selector)
    return await list_items(conn, f"list pods in {namespace}", one)


async def resource_quotas(conn: Connection, namespace: str | None) -> list[Raw]:
    """ResourceQuotas, which cap a namespace's vNPU requests (requests.vnpu.io/...)."""
    api = client.CoreV1Api(conn.api)
    if namespace is None:
        return await list_items(
            conn, "list resourcequotas", api.list_resource_quota_for_all_namespaces
        )
    one = partial(api.list_namespaced_resource_quota, namespace)
    return await list_items(conn, f"list resourcequotas in {namespace}", one)


async def pod(conn: Connection, namespace: str, name: str) -> Raw:
    api = client.CoreV1Api(conn.api)
    try:
        result: Raw = await _call(
            conn, f"get pod {name} in {namespace}", api.read_namespaced_pod, name, namespace
        )
    except ApiException as exc:
        if exc.status == 404:
            raise CliError(f'pod "{name}" not found in namespace "{namespace}"') from exc
        raise
    return result


async def vnpunode(conn: Connection, name: str) -> Raw:
    custom = client.CustomObjectsApi(conn.api)
    try:
        result: Raw = await _call(
            conn, f"get vnpunode {name}", custom.get_cluster_custom_object,
            names.GROUP, names.VERSION, names.NODE_PLURAL, name,
        )  # fmt: skip
    except ApiException as exc:
        if exc.status == 404:
            raise CliError(
                f'VNPUNode "{name}" not found: no vnpu agent serves a node of that name'
            ) from exc
        raise
    return result


async def patch_vnpunode(conn: Connection, name: str, body: Raw | list[Raw]) -> None:
    """A merge patch (a dict; ApiException 409 when its resourceVersion is stale)
    or a JSON Patch (a list; 422 when one of its `test`s fails)."""
    custom = client.CustomObjectsApi(conn.api)
    kind = "merge-patch" if isinstance(body, dict) else "json-patch"
    await _call(
        conn, f"patch vnpunode {name}", custom.patch_cluster_custom_object,
        names.GROUP, names.VERSION, names.NODE_PLURAL, name, body,
        _content_type=f"application/{kind}+json",
    )  # fmt: skip
