"""The pod watch selects `vnpu.io/managed=true` (watches.pod_informer): a
pod whose label someone removed reaches it as DELETED. One that still
carries our finalizer cannot be gone, so it is kept and relabelled, not
released under its running containers; one the server no longer has is
forgotten as any deleted pod."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client
from test_controller import World, pod

from vnpu_common.wire import names
from vnpu_operator.config import OperatorSettings
from vnpu_operator.podstate import Write
from vnpu_operator.slim import identity
from vnpu_operator.watches import pod_informer, still_ours


def without_finalizer(obj: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "metadata": {**obj["metadata"], "finalizers": []}}


async def running(w: World) -> dict[str, Any]:
    w.add_node("n1")
    w.controller.mark_synced()
    p = pod("p", "u1")
    w.controller.pod_event("ADDED", p)
    await w.settle()
    w.echo_created(names.PHASE_READY)
    await w.settle()
    return p


async def test_what_the_watch_reports_deleted_is_told_apart() -> None:
    w = World()
    p = await running(w)
    # A label change: the event carries the previous content, our finalizer on.
    assert still_ours(w.controller, p)
    # A deletion: the last content, after our finalizer came off.
    assert not still_ours(w.controller, without_finalizer(p))
    # A re-list reports it by identity only: the cached copy decides...
    assert still_ours(w.controller, identity(p))
    assert not still_ours(w.controller, identity(pod("q", "u-unknown")))
    # ...unless the operator removed the finalizer. A pod already deleted with
    # grace 0 goes in that very update, and the watch reports the content
    # before it: our finalizer still on.
    w.controller.expect.sent(Write.UNFINALIZE, "u1")
    assert not still_ours(w.controller, identity(p))
    assert not still_ours(w.controller, p)


async def test_a_pod_that_lost_its_label_is_relabelled_and_keeps_its_vnpus() -> None:
    w = World()
    await running(w)
    w.controller.pod_unlabelled("u1")
    await w.settle()
    assert w.api.of("relabel_pod") == ["p"]
    assert "u1" in w.controller.pods
    assert w.api.of("delete_allocation") == []
    w.controller.pod_unlabelled("u1")  # the next time, once more
    await w.settle()
    assert w.api.of("relabel_pod") == ["p", "p"]


async def test_a_pod_the_server_no_longer_has_is_released() -> None:
    w = World()
    await running(w)
    w.api.gone.add("p")
    w.controller.pod_unlabelled("u1")
    await w.settle()
    assert "u1" not in w.controller.pods
    assert len(w.api.of("delete_allocation")) == 1


async def test_a_standby_relabels_nothing_until_it_leads() -> None:
    w = World()
    await running(w)
    w.controller.leading = lambda: False
    w.controller.pod_unlabelled("u1")
    await w.settle()
    assert w.api.of("relabel_pod") == []
    w.controller.leading = lambda: True
    w.controller.lead()
    await w.settle()
    assert w.api.of("relabel_pod") == ["p"]


async def test_a_pod_its_finalizer_removal_deleted_is_not_relabelled_when_the_watch_is_first() -> (
    None
):
    """The finalizer removal of a deleting pod deletes it, and the watch may
    report that (our finalizer still in the event's content) before the
    removal's answer comes: about one pod in six in make bench. It is a
    deletion, not a lost label: no relabel patch (a 404), and nothing kept
    of the pod."""
    w = World()
    p = await running(w)
    deleting = {**p, "metadata": {**p["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    deleting["spec"] = {k: v for k, v in p["spec"].items() if k != "schedulingGates"}
    handle = pod_informer(client.ApiClient(), w.controller, OperatorSettings())._handler
    answered = w.api.remove_pod_finalizer

    async def watch_first(obj: dict[str, Any]) -> bool:
        await handle("DELETED", deleting)
        return await answered(obj)

    w.api.remove_pod_finalizer = watch_first  # type: ignore[method-assign,assignment]
    w.controller.pod_event("MODIFIED", deleting)
    await w.settle()
    for body in w.created():
        w.controller.allocation_gone(body)
    await w.settle()
    assert w.api.of("remove_pod_finalizer") == ["p"]
    assert w.api.of("relabel_pod") == []
    assert "u1" not in w.controller.pods
    assert not w.controller.expect.pending(Write.UNFINALIZE, "u1")
