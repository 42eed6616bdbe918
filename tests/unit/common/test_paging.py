"""The pages of one list, and a list restarted when its continue token expired."""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common.kube.paging import Fetch, Raw, pages


def server(pages_: list[Raw], *, expire: str | None = None) -> tuple[list[str | None], Fetch]:
    """A list of `pages_` (each page's continue token is its index); the
    token `expire` is refused once with 410."""
    asked: list[str | None] = []
    expired: list[str] = []

    async def fetch(token: str | None) -> Raw:
        asked.append(token)
        if token is not None and token == expire and not expired:
            expired.append(token)
            raise ApiException(status=410, reason="Expired")
        index = int(token or 0)
        page = dict(pages_[index])
        if index + 1 < len(pages_):
            page["metadata"] = {"continue": str(index + 1)}
        return page

    return asked, fetch


async def test_every_page_in_order_the_first_fresh() -> None:
    asked, fetch = server([{"items": [1]}, {"items": [2]}, {"items": [3]}])
    got = [(fresh, page["items"]) async for fresh, page in pages(fetch, "things")]
    assert got == [(True, [1]), (False, [2]), (False, [3])]
    assert asked == [None, "1", "2"]


async def test_an_expired_token_starts_the_list_again_fresh() -> None:
    asked, fetch = server([{"items": [1]}, {"items": [2]}, {"items": [3]}], expire="2")
    got = [(fresh, page["items"]) async for fresh, page in pages(fetch, "things")]
    assert got == [(True, [1]), (False, [2]), (True, [1]), (False, [2]), (False, [3])]
    assert asked == [None, "1", "2", None, "1", "2"]


async def test_other_errors_and_a_refused_first_page_are_raised() -> None:
    async def gone(token: str | None) -> Raw:
        raise ApiException(status=410, reason="Gone")

    with pytest.raises(ApiException):
        async for _ in pages(gone, "things"):
            pass
