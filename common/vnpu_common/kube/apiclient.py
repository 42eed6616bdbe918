"""The API client both components use: kubernetes-asyncio's, minus two
thread hops on every request.

kubernetes-asyncio opens its aiohttp session with `trust_env=True`, so aiohttp
looks up a proxy in the environment and reads `~/.netrc` for every request,
each in a worker thread: at 200 nodes that was two thread hand-offs per API
call, a twentieth of the operator's CPU. The answer cannot change while the
process runs, so it is looked up once here: a proxy the environment names for
the API server is kept (as `HTTPS_PROXY` would apply), netrc is not read (the
API server takes tokens and certificates, never netrc's basic auth).

Its connections are capped at `CONNECTIONS`, kubernetes-asyncio's own 100:
a burst of writes waits for a free connection, and a cap of 32 (tried in
round 5 of issue 14 for memory: each TLS connection holds a 256 KiB read
buffer, few of whose pages are ever touched) held a release of 100 pods at
1000 nodes: the waiting pods' creates queued seconds behind the release's
deletes (allocations gone -> waiting pods placed p99 8.8 s with 32, 3.6 s
with 100; operator peak RSS 299 and 264 MB, within run-to-run noise).
"""

from __future__ import annotations

import copy

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client
from yarl import URL

from vnpu_common.kube.apiwrites import send_fence

# Watches hold one each for good (at most four per component), writes share the rest.
CONNECTIONS = 100


def api_client(
    user_agent: str,
    *,
    connections: int = CONNECTIONS,
    configuration: client.Configuration | None = None,
    fenced: bool = False,
) -> client.ApiClient:
    """A client for the loaded configuration (kube config or in-cluster), or
    a copy of `configuration`, with at most `connections` open to the API
    server. `fenced`: a fenced write made through it asks its fence again
    just before it is sent (`apiwrites.send_fence`)."""
    if configuration is None:
        configuration = client.Configuration.get_default_copy()
    else:
        configuration = copy.deepcopy(configuration)
    configuration.connection_pool_maxsize = connections
    api = client.ApiClient(configuration)
    api.user_agent = user_agent
    rest = api.rest_client
    old: aiohttp.ClientSession = rest.pool_manager
    if not rest.proxy:
        try:
            proxy, auth = get_env_proxy_for_url(URL(api.configuration.host or ""))
        except LookupError:
            pass
        else:
            rest.proxy = str(proxy)
            if auth is not None:
                rest.proxy_headers = {"Proxy-Authorization": auth.encode()}
    # The old session was never used: dropping it leaves nothing open (the
    # connector, which holds the connections, is shared).
    rest.pool_manager = aiohttp.ClientSession(
        connector=old.connector,
        trust_env=False,
        read_bufsize=2**21,  # as kubernetes-asyncio's: large objects in watch lines
        trace_configs=[send_fence()] if fenced else None,
    )
    old.detach()
    return api
