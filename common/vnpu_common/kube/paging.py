"""The pages of one API list (`limit`/`continue`), for every paged list both
components make.

The pages of a list share the first page's snapshot (one resourceVersion). A
continue token the server no longer honours (410 Gone, once its history was
compacted) starts the list again from the first page: what the caller
gathered from the pages before must be dropped then, so each page comes with
`fresh`, True on the first page of a (re)started list.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common.wire.types import Raw

log = logging.getLogger(__name__)

# continue token (None for the first page) -> that page, as plain JSON.
Fetch = Callable[[str | None], Awaitable[Raw]]


async def pages(fetch: Fetch, what: str) -> AsyncIterator[tuple[bool, Raw]]:
    """(fresh, page) for every page of the list `fetch` reads; API errors
    other than an expired continue token are raised."""
    token: str | None = None
    fresh = True
    while True:
        try:
            page = await fetch(token)
        except ApiException as exc:
            if exc.status == 410 and token:
                log.info("%s list expired mid-way; listing again", what)
                token, fresh = None, True
                continue
            raise
        yield fresh, page
        fresh = False
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return
