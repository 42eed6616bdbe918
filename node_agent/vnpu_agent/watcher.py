"""The agent's watches, selected by the `vnpu.io/node` label of its node(s):
the allocations it serves (plural `names.ALLOCATION_PLURAL`) and its own
VNPUNodes (`names.NODE_PLURAL`: what the server holds of the inventory it
publishes, so that a VNPUNode changed or removed by someone else is noticed,
NodeAgent.on_node_event). One class serves both; vnpu_common.kube.informer does
the listing, resuming and re-listing.

The garbage collector reads `synced` and collects nothing while it is
False: an allocation created while the watch was down must not look like an
orphan.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from kubernetes_asyncio import client

from vnpu_common.kube.informer import Handler, Informer
from vnpu_common.wire import names


def label_selector(nodes: Iterable[str]) -> str:
    node_list = sorted(set(nodes))
    if len(node_list) == 1:
        return f"{names.LABEL_NODE}={node_list[0]}"
    return f"{names.LABEL_NODE} in ({','.join(node_list)})"


class ListWatcher(Informer):
    """One label-selected list-then-watch of a vnpu.io resource, all
    namespaces (or cluster-scoped)."""

    def __init__(
        self,
        api: client.CustomObjectsApi,
        plural: str,
        nodes: Iterable[str],
        handler: Handler,
        *,
        timeout_seconds: int = 300,
        retry_max_seconds: float = 30.0,
    ) -> None:
        super().__init__(
            plural,
            partial(api.list_cluster_custom_object, names.GROUP, names.VERSION, plural),
            handler,
            label_selector=label_selector(nodes),
            timeout_seconds=timeout_seconds,
            retry_max_seconds=retry_max_seconds,
        )
