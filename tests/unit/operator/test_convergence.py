"""Which cached objects a fresh listing proves deleted."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_operator.convergence import Convergence, Kind, Listing, stale
from vnpu_operator.slim import resource_version


def obj(name: str, rv: str | None, namespace: str | None = "ns") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if rv is not None:
        meta["resourceVersion"] = rv
    return {"metadata": meta}


def key(o: dict[str, Any]) -> str:
    m = o["metadata"]
    return f"{m['namespace']}/{m['name']}" if m.get("namespace") else m["name"]


def test_absent_from_a_newer_list_is_deleted_but_not_from_an_older_one() -> None:
    cache = {"a": obj("a", "10"), "b": obj("b", "30"), "c": obj("c", "12")}
    listing = Listing(20, frozenset({"ns/c"}))
    # a: last seen at 10, the list (20) is newer and lacks it -> deleted.
    # b: seen at 30, after the list was taken: it may be newer than the list.
    assert [o["metadata"]["name"] for o in stale(cache, listing, key)] == ["a"]


def test_copies_without_a_version_need_two_listings_without_them() -> None:
    cache = {"n1": obj("n1", None, namespace=None), "n2": obj("n2", None, namespace=None)}
    first = Listing(50, frozenset({"n2"}))
    assert stale(cache, first, key) == []
    second = Listing(60, frozenset({"n2"}))
    assert stale(cache, second, key, missing_before=frozenset({"n1"})) == [cache["n1"]]


def test_unreadable_versions_never_prove_a_deletion() -> None:
    cache = {"a": obj("a", "not-a-number")}
    assert stale(cache, Listing(None, frozenset()), key) == []
    assert stale(cache, Listing(99, frozenset()), key) == []
    assert resource_version({"metadata": {"resourceVersion": 7}}) == 7
    assert resource_version({}) is None


class Answer:
    """What kubernetes-asyncio hands back with _preload_content=False."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status, self.reason = status, ""
        self.headers: dict[str, str] = {}
        self._body = orjson.dumps(body)

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        pass


class PagedServer:
    """Serves a list in pages of two; the first continue token it gave out
    expires once (410), as the API server's do after compaction."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.requests: list[dict[str, str]] = []
        self.expired_once = False

    async def call_api(self, path: str, method: str, **kwargs: Any) -> Answer:
        query = dict(kwargs["query_params"])
        self.requests.append(query)
        start = int(query.get("continue", "0"))
        if start and not self.expired_once:
            self.expired_once = True
            return Answer(410, {"reason": "Expired"})
        size = int(query["limit"])
        items = [{"metadata": {"name": n, "namespace": "ns"}} for n in self.names]
        page = items[start : start + size]
        more = start + size < len(items)
        meta = {"resourceVersion": "42", **({"continue": str(start + size)} if more else {})}
        return Answer(200, {"metadata": meta, "items": page})


async def test_a_list_is_read_page_by_page_and_restarted_when_its_token_expires() -> None:
    server = PagedServer(["a", "b", "c", "d", "e"])
    convergence = Convergence(server, [], interval=1, retry_max=1, page_size=2)  # type: ignore[arg-type]
    kind = Kind("thing", "/things", dict, lambda _obj: None, label_selector="x=y")
    listing = await convergence.list_keys(kind)
    assert listing == Listing(42, frozenset(f"ns/{n}" for n in "abcde"))
    # First page, its continuation refused, then all three pages again.
    assert [q.get("continue") for q in server.requests] == [None, "2", None, "2", "4"]
    assert all(q["limit"] == "2" and q["labelSelector"] == "x=y" for q in server.requests)


async def test_an_error_on_the_first_page_is_raised_not_retried() -> None:
    class Down(PagedServer):
        async def call_api(self, path: str, method: str, **kwargs: Any) -> Answer:
            self.requests.append(dict(kwargs["query_params"]))
            return Answer(410, {})

    server = Down([])
    convergence = Convergence(server, [], interval=1, retry_max=1)  # type: ignore[arg-type]
    with pytest.raises(ApiException) as exc:
        await convergence.list_keys(Kind("thing", "/things", dict, lambda _obj: None))
    assert exc.value.status == 410
    assert len(server.requests) == 1


async def test_a_pass_spreads_its_requests_over_a_share_of_the_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two kinds of five objects, pages of two: three requests each. The
    # caches predict that (five cached, 5 // 2 + 1 = 3), so the six requests
    # are spaced evenly over a quarter of the 60 s interval, and no two of
    # them go out back to back.
    server = PagedServer(["a", "b", "c", "d", "e"])
    server.expired_once = True
    cached = {n: obj(n, "1") for n in "abcde"}
    kinds = [Kind(k, f"/{k}", lambda: cached, lambda _obj: None) for k in ("one", "two")]
    convergence = Convergence(server, kinds, interval=60, retry_max=1, page_size=2, spread=0.25)  # type: ignore[arg-type]
    slept: list[float] = []
    clock = 0.0
    sent_at: list[float] = []
    real_call = server.call_api

    async def sleep(seconds: float) -> None:
        nonlocal clock
        slept.append(seconds)
        clock += seconds

    async def call_api(path: str, method: str, **kwargs: Any) -> Answer:
        sent_at.append(clock)
        return await real_call(path, method, **kwargs)

    monkeypatch.setattr("vnpu_operator.convergence.asyncio.sleep", sleep)
    monkeypatch.setattr(server, "call_api", call_api)
    assert convergence.gap() == pytest.approx(15 / 6)
    assert await convergence.converge() == 0
    assert len(sent_at) == 6
    assert sent_at == pytest.approx([i * 15 / 6 for i in range(6)])
    assert sum(slept) <= 60 * 0.25


def test_the_gap_follows_the_caches_and_bounds_the_pass() -> None:
    small = {n: obj(n, "1") for n in "ab"}
    big = {str(i): obj(str(i), "1") for i in range(1000)}
    kind = lambda cache: Kind("k", "/k", lambda: cache, lambda _obj: None)  # noqa: E731
    few = Convergence(None, [kind(small)], interval=60, retry_max=1, page_size=200)  # type: ignore[arg-type]
    many = Convergence(None, [kind(big), kind(big)], interval=60, retry_max=1, page_size=200)  # type: ignore[arg-type]
    # One request: the whole share is its gap (never slept: nothing follows).
    assert few.gap() == pytest.approx(15.0)
    # 1000 cached in pages of 200: six requests a kind (the last page may be
    # short or empty), twelve in all over 15 s.
    assert many.gap() == pytest.approx(15 / 12)
