"""An informer with nothing cached hands its first list on page by page
(`stream_first_list`): the whole list held at once was most of a cold
start's memory. With something cached it lists whole first, so that what
is gone is handed on before what is listed."""

from __future__ import annotations

from typing import Any

from tests.unit.operator.test_convergence import Answer

from vnpu_common.kube.informer import DELETED, SYNC, Informer


class Pages:
    """A list in pages of `limit`; with `expire`, the first continue token
    is refused once (410) and the list then holds `after` instead."""

    def __init__(self, names: list[str], expire: bool = False, after: list[str] | None = None):
        self.names, self.expire, self.after = names, expire, after
        self.asked: list[int] = []

    async def __call__(self, **kwargs: Any) -> Answer:
        start = int(kwargs.get("_continue") or 0)
        self.asked.append(start)
        if start and self.expire:
            self.expire = False
            self.names = self.after if self.after is not None else self.names
            return Answer(410, {"reason": "Expired"})
        size = int(kwargs["limit"])
        items = [{"metadata": {"name": n, "namespace": "ns"}} for n in self.names]
        more = start + size < len(items)
        meta = {"resourceVersion": "7", **({"continue": str(start + size)} if more else {})}
        return Answer(200, {"metadata": meta, "items": items[start : start + size]})


def informer(lister: Pages, events: list[tuple[str, str, int]]) -> Informer:
    async def handle(kind: str, obj: dict[str, Any]) -> None:
        # Which pages had been asked for when the object was handed on.
        events.append((kind, obj["metadata"]["name"], len(lister.asked)))

    return Informer("things", lister, handle, page_size=2, stream_first_list=True)


async def test_the_first_list_is_handed_on_before_its_next_page_is_read() -> None:
    events: list[tuple[str, str, int]] = []
    things = informer(Pages(["a", "b", "c", "d", "e"]), events)
    await things._list()
    assert events == [(SYNC, "a", 1), (SYNC, "b", 1), (SYNC, "c", 2), (SYNC, "d", 2),
                      (SYNC, "e", 3)]  # fmt: skip
    assert sorted(things.cache) == ["ns/a", "ns/b", "ns/c", "ns/d", "ns/e"]
    assert things.resource_version == "7"
    assert things.synced.is_set()


async def test_a_first_list_started_again_hands_on_as_gone_what_only_the_first_try_had() -> None:
    events: list[tuple[str, str, int]] = []
    lister = Pages(["a", "b", "c"], expire=True, after=["b", "c"])
    things = informer(lister, events)
    await things._list()
    assert lister.asked == [0, 2, 0]
    handed = [(kind, name) for kind, name, _ in events]
    assert handed == [(SYNC, "a"), (SYNC, "b"), (SYNC, "b"), (SYNC, "c"), (DELETED, "a")]
    assert sorted(things.cache) == ["ns/b", "ns/c"]


async def test_with_something_cached_the_gone_are_handed_on_first() -> None:
    events: list[tuple[str, str, int]] = []
    lister = Pages(["a", "b", "c"])
    things = informer(lister, events)
    await things._list()
    events.clear()
    lister.names, lister.asked = ["b", "c", "d"], []
    await things._list()
    # Whole first: every page read before anything is handed on.
    assert events == [(DELETED, "a", 2), (SYNC, "b", 2), (SYNC, "c", 2), (SYNC, "d", 2)]
