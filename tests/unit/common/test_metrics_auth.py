"""Authenticated /metrics (vnpu_common.process.metrics_auth, http.serve_http): the token
check's verdicts and cache, and the served port: TLS, 401/403 before any series,
probes in plain HTTP on their own port. The API server's own review of real
tokens is tests/integration/test_metrics_auth_plane.py."""

from __future__ import annotations

import socket
import ssl
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter

from vnpu_common.process.http import serve_http
from vnpu_common.process.metrics_auth import TokenCheck, Verdict, self_signed_context

GOOD, OTHER = "token-of-the-scraper", "token-of-a-tenant"


class Reviews:
    """The API server's answers by token, counting the reviews asked."""

    def __init__(self, answers: dict[str, Verdict]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def __call__(self, token: str) -> Verdict:
        self.asked.append(token)
        return self.answers.get(token, Verdict(401, "the token is not valid"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_request_without_a_bearer_token_is_refused_unasked() -> None:
    reviews = Reviews({GOOD: Verdict(200, "allowed")})
    check = TokenCheck(reviews)
    for header in (None, "", "Basic dXNlcjpwdw==", "Bearer ", "Bearer"):
        verdict = await check.check(header)
        assert verdict.status == 401, header
    assert reviews.asked == []


async def test_verdicts_are_kept_a_while_then_asked_again() -> None:
    now = [0.0]
    reviews = Reviews({GOOD: Verdict(200, "allowed"), OTHER: Verdict(403, "no")})
    check = TokenCheck(reviews, ttl=60, clock=lambda: now[0])
    assert (await check.check(f"Bearer {GOOD}")).allowed
    assert (await check.check(f"bearer {GOOD}")).allowed
    assert (await check.check(f"Bearer {OTHER}")).status == 403
    assert (await check.check(f"Bearer {OTHER}")).status == 403
    assert reviews.asked == [GOOD, OTHER]
    # The binding was removed meanwhile: a minute later the token is refused.
    now[0] = 61
    reviews.answers[GOOD] = Verdict(403, "no longer")
    assert (await check.check(f"Bearer {GOOD}")).status == 403
    assert reviews.asked == [GOOD, OTHER, GOOD]


async def test_an_api_server_that_did_not_answer_is_asked_again_next_time() -> None:
    reviews = Reviews({GOOD: Verdict(503, "the API server did not review the token (500)")})
    check = TokenCheck(reviews)
    assert (await check.check(f"Bearer {GOOD}")).status == 503
    reviews.answers[GOOD] = Verdict(200, "allowed")
    assert (await check.check(f"Bearer {GOOD}")).allowed
    assert reviews.asked == [GOOD, GOOD]


async def test_the_cache_is_bounded() -> None:
    reviews = Reviews({})
    check = TokenCheck(reviews, entries=4)
    for i in range(20):
        await check.check(f"Bearer made-up-{i}")
    assert len(check._kept) <= 4
    # A token seen before and pushed out is reviewed again, never answered from a stale entry.
    await check.check("Bearer made-up-0")
    assert reviews.asked.count("made-up-0") == 2


@pytest.fixture
async def served() -> AsyncIterator[tuple[int, int, Reviews]]:
    registry = CollectorRegistry()
    Counter("vnpu_test_scrapes", "A series only an allowed scraper sees.", registry=registry).inc()
    reviews = Reviews({GOOD: Verdict(200, "allowed"), OTHER: Verdict(403, "no access")})
    port, probe_port = free_port(), free_port()
    runner = await serve_http(
        "127.0.0.1",
        port,
        registry,
        lambda: True,
        "not ready",
        probe_port=probe_port,
        tls=self_signed_context("vnpu-test"),
        auth=TokenCheck(reviews),
    )
    yield port, probe_port, reviews
    await runner.cleanup()


async def test_metrics_need_a_token_the_api_server_allows_over_tls(
    served: tuple[int, int, Reviews],
) -> None:
    port, probe_port, _ = served
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    url = f"https://127.0.0.1:{port}/metrics"
    async with aiohttp.ClientSession() as session:
        async with session.get(url, ssl=insecure) as resp:
            assert resp.status == 401
            assert resp.headers["WWW-Authenticate"] == "Bearer"
            assert "vnpu_test_scrapes" not in await resp.text()
        headers = {"Authorization": f"Bearer {OTHER}"}
        async with session.get(url, ssl=insecure, headers=headers) as resp:
            assert resp.status == 403
            assert "vnpu_test_scrapes" not in await resp.text()
        headers = {"Authorization": f"Bearer {GOOD}"}
        async with session.get(url, ssl=insecure, headers=headers) as resp:
            assert resp.status == 200
            assert "vnpu_test_scrapes_total 1.0" in await resp.text()
        # Plain HTTP on the TLS port gets no series either.
        with pytest.raises(aiohttp.ClientError):
            async with session.get(f"http://127.0.0.1:{port}/metrics", headers=headers) as resp:
                await resp.text()
        # The kubelet's probes: plain HTTP on the probe port, no token, no /metrics there.
        for path in ("/healthz", "/readyz"):
            async with session.get(f"http://127.0.0.1:{probe_port}{path}") as resp:
                assert resp.status == 200, path
        async with session.get(f"http://127.0.0.1:{probe_port}/metrics") as resp:
            assert resp.status == 404
