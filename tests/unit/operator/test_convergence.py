"""Which cached objects a fresh listing proves deleted."""

from __future__ import annotations

from typing import Any

from vnpu_operator.convergence import Listing, stale
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
