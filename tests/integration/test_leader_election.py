"""High availability (issue 35; docs/HELM.md, "High availability"): two
operator replicas on the real control plane, behind the stand-in for the
webhook Service (localplane.webhookproxy). One leads (the Lease
vnpu-operator-leader), the other keeps warm caches and answers the webhook.

- the leader SIGKILLed again and again during a churn: every pod is placed
  and released, nothing double-booked, leaked or stuck, no pod refused;
- the leader frozen (SIGSTOP) past its lease: the other takes over, and once
  resumed the old one writes nothing that lands;
- one replica alone works as before, and a restarted one takes its own Lease
  back at once;
- a new leader releases what went during the outage before it places what
  came: a namespace never holds more real vNPUs than its quota allows.

The same churn at 200 nodes, with the figures the docs report, is `python
-m bench.failover` (bench/results-failover.json).

Timing here: lease 4 s, renew deadline 3 s, retry 0.5 s, the defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import http.client
import json
import signal
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp import web
from bench import load
from bench.failover import (
    LEASE as LEADER_LEASE,
)
from bench.failover import (
    Replicas,
    audit_allocations,
    churn_with_kills,
    election_settings,
)
from kubernetes_asyncio import client
from kubernetes_asyncio import config as kube_config
from operator_harness import (
    apply_quota,
    audit_since,
    delete_vnpu_pods,
    get_json,
    purge_foreign,
)

from localplane import LocalPlane, NodeSpec
from localplane.components import AGENT_NAMESPACE, AgentProcess, OperatorProcess, vnpu_ids
from localplane.plane import PlaneError
from localplane.pods import vnpu_pod
from localplane.waiting import wait_for
from vnpu_common.kube.apiclient import api_client
from vnpu_common.wire import names
from vnpu_operator.election import Timing
from vnpu_operator.leader import Leadership

pytestmark = pytest.mark.plane

NODES = [NodeSpec(name=f"ha-{i}", chips={"910B3": 2}) for i in range(3)]
LEASE, DEADLINE, RETRY = 4, 3.0, 0.5
SETTINGS = election_settings(LEASE, DEADLINE, RETRY)
TEMPLATE = "vir05_1c_16g"


@pytest.fixture(scope="module")
def agent(plane: LocalPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    workdir = Path(tmp_path_factory.mktemp("leader_election"))
    if plane.kubectl("get", "namespace", AGENT_NAMESPACE, check=False).returncode != 0:
        plane.kubectl("create", "namespace", AGENT_NAMESPACE, check=False)
    plane.add_nodes(NODES)
    purge_foreign(plane, [n.name for n in NODES])
    a = AgentProcess(plane, workdir / "agent", [n.name for n in NODES]).start()
    wait_for(
        "VNPUNodes published",
        lambda: all(get_json(plane, "vnpunode", n.name) for n in NODES),
        timeout=30,
    )
    yield a
    a.kill(signal.SIGTERM)
    for n in NODES:
        plane.kubectl("delete", "node", n.name, "--wait=false", check=False)


@pytest.fixture
def replicas(
    plane: LocalPlane, agent: AgentProcess, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Replicas]:
    count = getattr(request, "param", 2)
    r = Replicas(plane, tmp_path, count, SETTINGS)
    try:
        r.start()
        yield r
        delete_vnpu_pods(plane, timeout=90)
    finally:
        r.stop()


def create(plane: LocalPlane, namespace: str, name: str) -> None:
    pod = vnpu_pod(name, namespace, template=TEMPLATE)
    plane.kubectl("create", "-f", "-", input=yaml.safe_dump(pod))


def create_as_a_controller_would(plane: LocalPlane, namespace: str, name: str) -> int:
    """Creates the pod, again after a webhook call that timed out (as a
    Deployment's controller would); returns the attempts that failed. The
    API server keeps its connections open: one to a frozen replica, made
    before the freeze, hangs until the call's timeout (docs/HELM.md)."""
    for failed in range(4):
        try:
            create(plane, namespace, name)
            return failed
        except PlaneError as exc:
            if "failed calling webhook" not in str(exc):
                raise
    raise AssertionError(f"pod {name} refused 4 times")


def ungated(plane: LocalPlane, namespace: str, name: str, timeout: float = 30) -> None:
    def check() -> bool:
        pod = get_json(plane, "pod", "-n", namespace, name) or {}
        gates = (pod.get("spec") or {}).get("schedulingGates") or []
        return bool(pod) and all(g.get("name") != names.SCHEDULING_GATE for g in gates)

    wait_for(f"pod {name} placed", check, timeout=timeout, interval=0.2)


def no_vnpus_left(agent: AgentProcess) -> bool:
    return all(not vnpu_ids(agent.sim(n.name)) for n in NODES)


def test_one_leads_the_other_is_warm_and_answers(
    plane: LocalPlane, replicas: Replicas, namespace: str
) -> None:
    leader = replicas.wait_leader()
    standby = next(o for o in replicas.ops if o is not leader)
    assert replicas.metric(leader, "vnpu_operator_leader ") == 1
    assert replicas.metric(standby, "vnpu_operator_leader ") == 0
    assert standby.ready(), "a standby is Ready once synced: the webhook Service sends it requests"
    event = wait_for(
        "a LeaderElected Event on the Lease",
        lambda: [
            e
            for e in (get_json(plane, "events", "-n", AGENT_NAMESPACE) or {}).get("items", [])
            if e.get("reason") == "LeaderElected" and leader.identity in e.get("message", "")
        ],
        timeout=20,
    )
    assert event
    create(plane, namespace, "ha-first")
    ungated(plane, namespace, "ha-first")
    # The standby's caches hold what the leader wrote, and it wrote nothing itself.
    assert replicas.metric(standby, "vnpu_operator_fenced_writes_total") == 0
    assert "leading: reconciling" not in standby.log_tail(400)


def test_leader_killed_during_churn(
    plane: LocalPlane, agent: AgentProcess, replicas: Replicas, namespace: str
) -> None:
    # The size: 10 kills during a 200-pod churn (each kill waits for the
    # takeover's first placement and the killed replica back as the standby).
    pods = load.mix_pods("ha", 200)
    for p in pods:
        p.template, p.count = TEMPLATE, 1
    result = asyncio.run(
        churn_with_kills(
            plane, replicas, namespace, pods,
            rate=1.25, hold=8.0, kills=10, first_kill_after=4.0, settle_timeout=120,
            say=print,
        )
    )  # fmt: skip
    summary = result.summary()
    print(summary)
    assert len(result.kills) == 10
    # The standby answers throughout; what a SIGKILL can still fail is a webhook
    # call in flight on the killed replica's connection at that instant (the API
    # server does not retry a POST on a broken connection): at most one per kill,
    # usually none (docs/HELM.md, "High availability").
    assert len(result.refusals) <= len(result.kills), result.refusals
    assert result.other_errors() == []
    assert result.stuck == []
    refused = {e.split(":")[0].removeprefix("create ") for e in result.refusals}
    pods = [p for p in pods if p.name not in refused]
    # Held longer than a takeover: every pod is placed before it is deleted.
    assert all(p.ungated is not None for p in pods), "every pod placed"
    # Each takeover within the lease and a few retries (a cold replica
    # would relist first; a warm one only waits for the Lease).
    assert max(result.placements()) < LEASE + 8, summary
    audit = audit_allocations(plane, namespace)
    assert audit["double_booked"] == []
    wait_for(
        "no allocation left",
        lambda: not audit_allocations(plane, namespace)["allocations"],
        timeout=60,
    )
    wait_for("no vNPU left on any node", lambda: no_vnpus_left(agent), timeout=60)


def test_rolling_restart_during_churn(
    plane: LocalPlane, agent: AgentProcess, replicas: Replicas, namespace: str
) -> None:
    """What a rollout or a drain does to each replica in turn (SIGTERM; the
    chart's preStop aside): the leader hands the Lease back as it stops, the
    standby takes it at its next try instead of after the lease."""
    pods = load.mix_pods("roll", 24)
    for p in pods:
        p.template, p.count = TEMPLATE, 1
    result = asyncio.run(
        churn_with_kills(
            plane, replicas, namespace, pods,
            rate=0.5, hold=10.0, kills=2, first_kill_after=4.0, settle_timeout=120,
            sig=signal.SIGTERM, say=print,
        )
    )  # fmt: skip
    summary = result.summary()
    print(summary)
    assert len(result.kills) == 2
    assert result.refusals == [], replicas.proxy.events
    assert result.stuck == []
    assert all(p.ungated is not None for p in pods), "every pod placed"
    # Every stop was followed by a takeover. How soon is printed, not asserted: the
    # hand-back comes at the end of the replica's shutdown, which on 2 busy cores
    # took up to 4.3 s once, as long as this test's 4 s lease, so the time cannot
    # tell a hand-back from an expiry here (docs/HELM.md has the measured figures).
    assert all(k.took_over is not None for k in result.kills), summary
    assert audit_allocations(plane, namespace)["double_booked"] == []


def _real_vnpus(agent: AgentProcess) -> int:
    return sum(len(vnpu_ids(agent.sim(n.name))) for n in NODES)


def _hold_the_lease(plane: LocalPlane) -> None:
    """An outage as long as the test needs: the leader Lease held by no
    replica, renewed just now, for an hour. The standby keeps answering the
    webhook and writes nothing."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    spec = {"holderIdentity": "outage", "renewTime": now, "acquireTime": now,
            "leaseDurationSeconds": 3600}  # fmt: skip
    plane.kubectl(
        "patch", "lease", "-n", AGENT_NAMESPACE, LEADER_LEASE, "--type=merge",
        "-p", json.dumps({"spec": spec}),
    )  # fmt: skip


def test_a_new_leader_releases_before_it_places_within_the_quota(
    plane: LocalPlane, agent: AgentProcess, replicas: Replicas, namespace: str
) -> None:
    """Issue 58: while no replica leads, a tenant deletes its pods (grace 0:
    their containers are known stopped, so the quota stops counting them) and
    creates as many new ones, which the standby's webhook admits against the
    freed quota. The new leader must destroy the old vNPUs before it creates
    the new: the nodes never hold more of the namespace's vNPUs than the
    quota allows. Sampled every few milliseconds; the window seen before the
    fix was about 190 ms."""
    quota = 4
    apply_quota(plane, namespace, {f"requests.{names.RES_VNPUS}": str(quota)})
    old = [f"old-{i}" for i in range(quota)]
    for name in old:
        create(plane, namespace, name)
    for name in old:
        ungated(plane, namespace, name)
    wait_for("the old pods' vNPUs", lambda: _real_vnpus(agent) == quota, timeout=30)

    leader = replicas.wait_leader()
    standby = next(o for o in replicas.ops if o is not leader)
    leader.kill(signal.SIGKILL)
    _hold_the_lease(plane)
    plane.kubectl(
        "delete", "pod", "-n", namespace, *old, "--grace-period=0", "--force", "--wait=false"
    )

    def used() -> str:
        status = (get_json(plane, "resourcequota", "-n", namespace, "vnpu") or {}).get("status")
        return str(((status or {}).get("used") or {}).get(f"requests.{names.RES_VNPUS}"))

    wait_for("the quota freed by the deletions", lambda: used() == "0", timeout=30)
    new = [f"new-{i}" for i in range(quota)]
    for name in new:
        # A SIGKILLed replica's connections may still take the first call.
        create_as_a_controller_would(plane, namespace, name)
    assert _real_vnpus(agent) == quota  # nothing was released or placed meanwhile

    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _real_vnpus(agent))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        plane.kubectl("delete", "lease", "-n", AGENT_NAMESPACE, LEADER_LEASE)
        assert replicas.wait_leader(other_than=leader) is standby
        for name in new:
            ungated(plane, namespace, name)
        wait_for("the new pods' vNPUs", lambda: _real_vnpus(agent) == quota, timeout=30)
    finally:
        done.set()
        sampler.join()
    assert peak[0] <= quota, f"{peak[0]} real vNPUs under a quota of {quota}"
    assert "before placing in their namespace" in standby.log_tail(400)
    leader.start(ready_timeout=replicas.ready_timeout)


def _health(conn: http.client.HTTPSConnection) -> tuple[int, str]:
    """GET the webhook's health path on `conn`: the status and its Connection header."""
    conn.request("GET", names.WEBHOOK_HEALTH_PATH)
    response = conn.getresponse()
    response.read()
    return response.status, str(response.getheader("Connection") or "").lower()


def _readyz(op: OperatorProcess) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{op.port}/readyz", timeout=2) as r:
            return int(r.status), r.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode().strip()


def test_a_stopping_replica_answers_its_open_webhook_connections_then_closes_them(
    plane: LocalPlane, replicas: Replicas
) -> None:
    """SIGTERM: the Lease handed back, /readyz 503, and the webhook still answering
    the API server's kept-alive connections, each answer its connection's last, before
    the replica stops serving and exits (docs/DECISIONS.md, "High availability")."""
    leader = replicas.wait_leader()
    assert leader.proc is not None
    insecure = ssl._create_unverified_context()
    kept = http.client.HTTPSConnection("127.0.0.1", leader.webhook_port, context=insecure)
    status, connection = _health(kept)
    assert status == 200
    assert connection != "close"
    leader.proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    wait_for(
        "/readyz to say the replica is stopping",
        lambda: _readyz(leader) == (503, "stopping"),
        timeout=15,
        interval=0.05,
    )
    assert replicas.holder() != leader.identity, "the Lease is handed back before the drain"
    # The kept-alive connection is answered, and told to go.
    assert _health(kept) == (200, "close")
    # A connection opened meanwhile (its endpoint not gone yet) is served likewise.
    late = http.client.HTTPSConnection("127.0.0.1", leader.webhook_port, context=insecure)
    assert _health(late) == (200, "close")
    leader.proc.wait(timeout=30)
    print(f"SIGTERM -> exit: {time.monotonic() - sent:.1f} s")
    assert "stopping: the webhook answers" in leader.log_tail(200)
    leader.start(ready_timeout=60)
    replicas.wait_served()


def test_a_frozen_leader_writes_nothing_that_lands(
    plane: LocalPlane, replicas: Replicas, namespace: str
) -> None:
    old = replicas.wait_leader()
    other = next(o for o in replicas.ops if o is not old)
    assert old.proc is not None
    # Work in flight when it freezes: pods it has seen and not finished.
    for i in range(4):
        create(plane, namespace, f"ha-before-{i}")
    old.proc.send_signal(signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        replicas.wait_leader(other_than=old, timeout=LEASE + 10)
        for i in range(4):
            ungated(plane, namespace, f"ha-before-{i}")
        timed_out = 0
        for i in range(3):
            timed_out += create_as_a_controller_would(plane, namespace, f"ha-during-{i}")
            ungated(plane, namespace, f"ha-during-{i}")
        print(f"webhook calls that timed out on a connection to the frozen replica: {timed_out}")
        # Frozen well past its lease: it believes it still leads.
        time.sleep(max(0.0, frozen_at + 2 * LEASE - time.monotonic()))
        offset = plane.audit_log.stat().st_size
    finally:
        old.proc.send_signal(signal.SIGCONT)
    resumed = time.monotonic()
    # It sees the new pods now, and its own half-done work: none of it is sent.
    for i in range(3):
        create(plane, namespace, f"ha-after-{i}")
        ungated(plane, namespace, f"ha-after-{i}")
    time.sleep(max(0.0, resumed + 2 * RETRY + 2 - time.monotonic()))
    tag = f"({old.identity})"
    tried = [e for e in audit_since(plane, offset) if tag in str(e.get("userAgent", ""))]
    landed = [e for e in tried if (e.get("responseStatus") or {}).get("code", 0) < 300]
    assert landed == [], [(e.get("verb"), e.get("requestURI")) for e in landed]
    # Not even tried: the fence keeps every write unsent, and the Lease is read
    # (not written) by a replica whose renew deadline has passed.
    assert tried == [], [(e.get("verb"), e.get("requestURI")) for e in tried]
    assert replicas.leader() is other
    assert replicas.metric(old, "vnpu_operator_leader ") == 0
    assert "stopped leading" in old.log_tail(400)
    assert audit_allocations(plane, namespace)["double_booked"] == []


@pytest.mark.parametrize("replicas", [1], indirect=True)
def test_one_replica_alone(plane: LocalPlane, replicas: Replicas, namespace: str) -> None:
    (only,) = replicas.ops
    create(plane, namespace, "solo-0")
    ungated(plane, namespace, "solo-0")
    # Its container restarted (same pod name, so the same identity): it
    # takes its own Lease back once synced, without waiting for it to run out.
    transitions = (replicas.lease().get("spec") or {}).get("leaseTransitions")
    only.kill(signal.SIGKILL)
    killed = time.monotonic()
    only.start(ready_timeout=60)
    replicas.wait_served()
    create(plane, namespace, "solo-1")
    ungated(plane, namespace, "solo-1")
    assert (replicas.lease().get("spec") or {}).get("leaseTransitions") == transitions
    assert replicas.holder() == only.identity
    print(f"single replica: SIGKILL -> restarted and placing in {time.monotonic() - killed:.1f}s")


async def _leading(lead: Leadership) -> None:
    for _ in range(100):
        if lead.leading():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("never led an unheld Lease")


async def _hand_back(lead: Leadership, task: asyncio.Task[None]) -> None:
    await lead.release()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _leads_through_a_busy_loop(plane: LocalPlane, name: str, *, threaded: bool) -> bool:
    """Runs a Leadership in this process for the Lease `name`, blocks this
    event loop past the renew deadline once it leads (as a 2000-node sync on
    a loaded machine did), and says whether it still leads right after."""
    await kube_config.load_kube_config(config_file=str(plane.kubeconfig))
    api = api_client("vnpu-test/leader-busy-loop")
    lead = Leadership(
        client.CoordinationV1Api(api), "default", f"busy-{name}",
        timing=Timing(LEASE, DEADLINE, RETRY), name=name,
        thread_api=(lambda: api_client("vnpu-test/leader-busy-loop-thread")) if threaded else None,
    )  # fmt: skip
    task = asyncio.create_task(lead.run())
    try:
        await _leading(lead)
        # The loop blocked on purpose, as a long synchronous step would.
        time.sleep(DEADLINE + 2)  # noqa: ASYNC251
        return lead.leading()
    finally:
        await _hand_back(lead, task)
        await api.close()
        plane.kubectl("delete", "lease", name, "-n", "default", "--ignore-not-found")


def test_a_busy_controller_loop_costs_no_renewal(plane: LocalPlane) -> None:
    """The Lease is renewed from a thread of its own: a controller loop busy
    past the renew deadline does not make a healthy leader step down. On the
    loop itself (the control) the same block costs the lead."""
    assert not asyncio.run(_leads_through_a_busy_loop(plane, "busy-loop-inline", threaded=False))
    assert asyncio.run(_leads_through_a_busy_loop(plane, "busy-loop-thread", threaded=True))


class SlowApiServer:
    """The API server as a saturated one answers: a plain-HTTP stand-in in
    front of it that holds each request `delay` seconds before passing it
    on (with the plane's admin credentials), so the write lands that much
    after it was sent."""

    def __init__(self, upstream: client.Configuration) -> None:
        host, cert = upstream.host, upstream.cert_file
        assert host, "no API server in the plane's kubeconfig"
        assert cert, "the plane's admin signs in with a client certificate"
        self.upstream = host.rstrip("/")
        context = ssl.create_default_context(cafile=upstream.ssl_ca_cert)
        context.load_cert_chain(cert, upstream.key_file)
        self.context = context
        self.delay = 0.0
        self.runner: web.AppRunner | None = None
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> str:
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.context))
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    async def _forward(self, request: web.Request) -> web.Response:
        assert self.session is not None
        await asyncio.sleep(self.delay)
        headers = {
            k: v for k, v in request.headers.items() if k.lower() in ("content-type", "accept")
        }
        async with self.session.request(
            request.method, self.upstream + request.path_qs, data=await request.read(),
            headers=headers,
        ) as answer:  # fmt: skip
            return web.Response(
                body=await answer.read(), status=answer.status,
                content_type=answer.content_type,
            )  # fmt: skip

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        if self.session is not None:
            await self.session.close()


async def _lead_through_slow_answers(
    plane: LocalPlane, name: str, delay: float, seconds: float
) -> tuple[list[str], float]:
    """Leads the Lease `name` with every request answered `delay` seconds
    late for `seconds`: what the listeners heard, and how old the Lease's
    renewTime was at the end (as stored, read without the delay)."""
    await kube_config.load_kube_config(config_file=str(plane.kubeconfig))
    direct = client.Configuration.get_default_copy()
    slow = SlowApiServer(direct)
    slow_config = copy.deepcopy(direct)
    slow_config.host = await slow.start()
    timing = Timing(LEASE, DEADLINE, RETRY)
    api = api_client(
        "vnpu-test/leader-slow", configuration=slow_config,
        connections=timing.connections,
    )  # fmt: skip
    lead = Leadership(
        client.CoordinationV1Api(api), "default", f"slow-{name}", timing=timing, name=name
    )
    heard: list[str] = []
    lead.on_change(lambda: heard.append("started"), lambda: heard.append("stopped"))
    task = asyncio.create_task(lead.run())
    try:
        await _leading(lead)
        slow.delay = delay
        await asyncio.sleep(seconds)
        slow.delay = 0.0
        lease = get_json(plane, "lease", name, "-n", "default")
        renewed = datetime.datetime.fromisoformat(lease["spec"]["renewTime"])
        age = (datetime.datetime.now(datetime.UTC) - renewed).total_seconds()
        # Before the hand-back below, which the listeners hear as a stop.
        return list(heard), age
    finally:
        await _hand_back(lead, task)
        await api.close()
        await slow.stop()
        plane.kubectl("delete", "lease", name, "-n", "default", "--ignore-not-found")


def test_a_leader_answered_slowly_but_within_the_deadline_keeps_leading(
    plane: LocalPlane,
) -> None:
    """Every request answered 1.4 s late, under the 3 s renew deadline: the
    leader sends its renewals 0.5 s apart without waiting for the answers,
    so each success extends the lead before the last one runs out, and it
    never steps down (one renewal at a time, 1.4 + 0.5 + 1.4 s between two
    successes' sends and answers is past the deadline: it stepped down at
    every second renewal). Answered 3.5 s late, past the deadline, it does
    step down: the fence still holds."""
    heard, age = asyncio.run(_lead_through_slow_answers(plane, "slow-within", 1.4, 12.0))
    assert heard == ["started"], heard
    # Renewals kept landing: the last one stored less than a delay and a retry ago.
    assert age < 1.4 + RETRY + 1.0, age
    heard, _ = asyncio.run(_lead_through_slow_answers(plane, "slow-past", 3.5, 8.0))
    assert heard[:2] == ["started", "stopped"], heard
