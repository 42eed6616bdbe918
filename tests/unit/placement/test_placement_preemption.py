"""Preemption planning and the claims of preempting pods (nominations), on
plain ledgers: which pods a higher-priority request evicts, on which node,
and how a nominee's claim closes the node to others until it is placed."""

from __future__ import annotations

from dataclasses import replace

import pytest
from placement_helpers import chip, node, nofit, placed, request

from localplane.pods import vnpu_pod
from vnpu_operator.placement import (
    InvalidRequestError,
    Ledger,
    NodeInventory,
    NoFit,
    Placement,
    PodRequest,
    Policy,
    Reason,
)
from vnpu_operator.placement.nofit_memo import NoFitMemo
from vnpu_operator.placement.preemption import Candidate, Plan, plan, worth_trying

SMALL, BIG = "vir05_1c_16g", "vir10_3c_32g"  # 4 or 2 fill a 910B3 chip
BINPACK, NONE = Policy.BINPACK, frozenset[str]()


def req(name: str, priority: int, template: str = SMALL, **kw: object) -> PodRequest:
    return replace(request(name, template, **kw), priority=priority)


class World:
    """A ledger and the pods holding vNPUs on it, as the controller knows them."""

    def __init__(self, *inventories: NodeInventory) -> None:
        self.ledger = Ledger.rebuild(inventories, ())
        self.pods: dict[str, Candidate] = {}

    def run(self, name: str, priority: int, template: str = SMALL, *, on: str = "") -> None:
        """A pod placed and running (pinned to `on` if given)."""
        r = req(name, priority, template, node_selector={"name": on} if on else None)
        placed(self.ledger.place(r))
        self.pods[r.uid] = Candidate(r.uid, f"default/{name}", priority)

    def terminate(self, name: str) -> None:
        self.pods[f"uid-{name}"] = replace(self.pods[f"uid-{name}"], terminating=True)

    def plan(self, r: PodRequest, **kw: object) -> Plan | None:
        return plan(self.ledger, r, self.pods, **kw)


def victims(p: Plan | None) -> list[str]:
    assert p is not None
    return [v.key.split("/")[1] for v in p.victims]


def labelled(name: str, chips: int = 1) -> NodeInventory:
    return node(name, n_chips=chips, labels={"name": name})


def full_chip(priorities: list[int], name: str = "n", template: str = SMALL) -> World:
    w = World(labelled(name))
    for i, p in enumerate(priorities):
        w.run(f"{name}{i}", p, template, on=name)
    return w


# ------------------------------------------------------------------ victims


def test_the_fewest_lower_priority_pods_that_make_room_are_chosen() -> None:
    w = full_chip([0, 0, 0, 0])
    assert victims(w.plan(req("hi", 10))) == ["n3"]
    # Twice the size: two of them, not three or four.
    assert len(victims(w.plan(req("hi", 10, BIG)))) == 2


def test_the_least_important_pods_are_the_victims() -> None:
    w = full_chip([3, 1, 4, 2])
    assert victims(w.plan(req("hi", 10))) == ["n1"]
    assert victims(w.plan(req("hi", 10, BIG))) == ["n3", "n1"]  # priorities 2 and 1


def test_of_equal_priority_the_pod_holding_least_is_reprieved_first() -> None:
    w = World(labelled("n"))
    w.run("big", 0, BIG, on="n")
    w.run("s1", 0, on="n")
    w.run("s2", 0, on="n")
    # kube-scheduler's order: reprieve what it can, the smaller first.
    assert victims(w.plan(req("hi", 1))) == ["big"]


def test_equal_or_higher_priority_is_never_evicted() -> None:
    w = full_chip([10, 10, 20, 20])
    assert w.plan(req("same", 10)) is None
    assert w.plan(req("lower", 5)) is None
    # Only the two of priority 10 may go for a pod of 15, and two make room for BIG.
    assert sorted(victims(w.plan(req("mid", 15, BIG)))) == ["n0", "n1"]
    assert w.plan(req("mid", 11, BIG, count=2)) is None  # all four needed, two are 20


def test_a_request_that_does_not_fit_even_on_an_empty_node_evicts_nobody() -> None:
    w = full_chip([0, 0, 0, 0])
    assert w.plan(req("hi", 10, BIG, count=3)) is None
    assert w.plan(req("hi", 10, chip_model="910B4")) is None


def test_planning_books_nothing() -> None:
    w = full_chip([0, 0, 0, 0])
    before = (w.ledger.allocations(), w.ledger.capacity())
    assert w.plan(req("hi", 10, BIG)) is not None
    assert (w.ledger.allocations(), w.ledger.capacity()) == before
    assert w.ledger.nominations() == {}


def test_terminating_pods_count_as_gone_and_are_never_victims() -> None:
    w = full_chip([0, 0, 0, 0])
    w.terminate("n3")
    # What the terminating pod frees is enough: nobody is evicted.
    assert w.plan(req("hi", 10)) is None
    # Half of what BIG needs is on its way out: one victim more, not two.
    assert victims(w.plan(req("hi", 10, BIG))) == ["n2"]


def test_pods_a_disruption_budget_protects_are_left_alone() -> None:
    w = full_chip([0, 0, 0, 0])
    assert victims(w.plan(req("hi", 10), protected={"uid-n3"})) == ["n2"]
    everyone = {f"uid-n{i}" for i in range(4)}
    assert w.plan(req("hi", 10), protected=everyone) is None


def test_a_pod_the_controller_does_not_know_is_never_a_victim() -> None:
    w = full_chip([0, 0, 0, 0])
    del w.pods["uid-n3"]
    assert victims(w.plan(req("hi", 10))) == ["n2"]


@pytest.mark.parametrize(
    "inventory",
    [
        node("n", live=False, labels={"name": "n"}),
        node("n", labels={"name": "n"}, taints=[{"key": "k", "effect": "NoSchedule"}]),
    ],
)
def test_nodes_the_pod_may_not_use_are_not_freed_for_it(inventory: NodeInventory) -> None:
    w = full_chip([0, 0, 0, 0])
    w.ledger.upsert_node(inventory)
    assert w.plan(req("hi", 10)) is None
    w.ledger.upsert_node(labelled("n"))
    assert w.plan(req("hi", 10, node_selector={"name": "other"})) is None
    assert w.plan(req("hi", 10), avoid={"n"}) is None
    assert victims(w.plan(req("hi", 10))) == ["n3"]


# ------------------------------------------------------------ node choice


def two_nodes(a: list[int], b: list[int], template: str = SMALL) -> World:
    w = World(labelled("a"), labelled("b"))
    for name, priorities in (("a", a), ("b", b)):
        for i, p in enumerate(priorities):
            w.run(f"{name}{i}", p, template, on=name)
    return w


def test_the_node_whose_most_important_victim_is_least_important_wins() -> None:
    p = two_nodes([5, 5, 5, 5], [3, 3, 3, 3]).plan(req("hi", 10))
    assert p is not None
    assert p.node == "b"


def test_then_the_smallest_sum_of_priorities() -> None:
    p = two_nodes([3, 3, 9, 9], [3, 1, 9, 9]).plan(req("hi", 10, BIG))
    assert p is not None
    assert (p.node, victims(p)) == ("b", ["b0", "b1"])


def test_then_the_fewest_victims() -> None:
    w = World(labelled("a"), labelled("b"))
    for i in range(4):
        w.run(f"a{i}", 0, on="a")
    w.run("b0", 0, BIG, on="b")
    w.run("b1", 0, on="b")
    w.run("b2", 0, on="b")
    p = w.plan(req("hi", 1, BIG))
    assert p is not None
    assert (p.node, victims(p)) == ("b", ["b0"])


def test_then_the_node_name() -> None:
    p = two_nodes([0, 0, 0, 0], [0, 0, 0, 0]).plan(req("hi", 1))
    assert p is not None
    assert p.node == "a"


def test_a_node_where_terminating_pods_make_room_means_no_eviction_anywhere() -> None:
    w = two_nodes([0, 0, 0, 0], [0, 0, 0, 0])
    w.terminate("b2")
    assert w.plan(req("hi", 10)) is None


def test_worth_trying_only_for_capacity() -> None:
    def of(*reasons: Reason) -> NoFit:
        return NoFit(SMALL, 1, {f"n{i}": r for i, r in enumerate(reasons)})

    assert not worth_trying(of(Reason.TEMPLATE_NOT_OFFERED, Reason.NODE_SELECTOR))
    assert not worth_trying(of())
    for reason in (Reason.INSUFFICIENT_AICORE, Reason.NO_FREE_VNPU_ID, Reason.NOMINATED):
        assert worth_trying(of(Reason.TAINT, reason))


# ------------------------------------------------------------ nominations


def nominated_world() -> tuple[World, PodRequest]:
    """One full chip of priority-0 pods; `hi` (BIG, priority 10) nominated
    there after evicting n0 and n1, whose allocations are still booked."""
    w = full_chip([0, 0, 0, 0])
    hi = req("hi", 10, BIG)
    w.ledger.nominate(hi, "n", victims={"uid-n0", "uid-n1"})
    return w, hi


def test_a_nominee_closes_the_node_to_equal_and_lower_priority_until_it_fits() -> None:
    w, hi = nominated_world()
    assert w.ledger.nomination(hi.uid) is not None
    w.ledger.release("uid-n0")  # one victim gone, BIG needs both
    for priority in (0, 10):
        result = nofit(w.ledger.place(req(f"p{priority}", priority)))
        assert result.node_reasons == {"n": Reason.NOMINATED}
        assert "1 capacity held for a preempting pod" in result.message
    # A pod of higher priority does not see the claim (as with the scheduler).
    assert placed(w.ledger.place(req("urgent", 11))).node == "n"


def test_once_the_nominee_fits_others_get_only_what_it_leaves() -> None:
    w = World(labelled("n", chips=2))
    for i in range(8):
        w.run(f"n{i}", 0, on="n")
    hi = req("hi", 10, BIG)
    w.ledger.nominate(hi, "n")
    for victim in ("uid-n0", "uid-n1", "uid-n4"):  # two on chip 0, one on chip 1
        w.ledger.release(victim)
    # BIG takes chip 0's freed half; the small pod gets chip 1's slot, not chip 0's.
    small = placed(w.ledger.place(req("small", 0)))
    assert [a.chip for a in small.allocations] == [1]
    assert nofit(w.ledger.place(req("small2", 0))).node_reasons == {"n": Reason.INSUFFICIENT_AICORE}
    got = placed(w.ledger.place(hi))
    assert [a.chip for a in got.allocations] == [0]
    assert w.ledger.nomination(hi.uid) is None  # placed: the claim is its own capacity now


def test_the_nominee_itself_is_not_held_back_by_its_claim() -> None:
    w, hi = nominated_world()
    assert nofit(w.ledger.place(hi)).node_reasons == {"n": Reason.INSUFFICIENT_AICORE}
    w.ledger.release("uid-n0")
    w.ledger.release("uid-n1")
    assert placed(w.ledger.place(hi)).node == "n"
    assert w.ledger.nominations() == {}


def test_nominees_hold_room_against_each_other_by_priority() -> None:
    w = full_chip([0, 0, 0, 0])
    first, second = req("first", 10, BIG), req("second", 20, BIG)
    w.ledger.nominate(first, "n")
    w.ledger.nominate(second, "n")
    for victim in ("uid-n0", "uid-n1"):
        w.ledger.release(victim)
    # Room for one BIG: the higher nominee's; the lower one gets what is left.
    assert nofit(w.ledger.place(first)).node_reasons == {"n": Reason.INSUFFICIENT_AICORE}
    assert placed(w.ledger.place(second)).node == "n"


def test_the_fit_cache_follows_nominations() -> None:
    w = World(labelled("n"), labelled("m"))
    for i in range(4):
        w.run(f"n{i}", 0, on="n")
    w.ledger.release("uid-n0")
    hi = req("hi", 10, BIG)
    low = req("low", 0, node_selector={"name": "n"})
    w.ledger.nominate(hi, "n")
    assert nofit(w.ledger.place(low)).node_reasons["n"] is Reason.NOMINATED
    # The claim moves to m: the cached answer for n must not outlive it.
    w.ledger.nominate(hi, "m")
    assert placed(w.ledger.place(low)).node == "n"
    # A claim dropped: likewise.
    w.ledger.release("uid-low")
    w.ledger.nominate(hi, "n")
    assert nofit(w.ledger.place(low)).node_reasons["n"] is Reason.NOMINATED
    assert w.ledger.clear_nomination(hi.uid) is not None
    assert placed(w.ledger.place(low)).node == "n"
    # A victim's release changes the nominee's fit, hence what others see.
    w.ledger.nominate(hi, "n")  # the chip is full: n1, n2, n3, low
    low2 = req("low2", 0, node_selector={"name": "n"})
    for victim, reason in (("uid-n1", Reason.NOMINATED), ("uid-n2", Reason.INSUFFICIENT_AICORE)):
        assert nofit(w.ledger.place(low2)).node_reasons["n"] is Reason.NOMINATED
        w.ledger.release(victim)
        assert nofit(w.ledger.place(low2)).node_reasons["n"] is reason
    w.ledger.release("uid-n3")
    assert placed(w.ledger.place(low2)).node == "n"


def test_a_plan_respects_other_nominees() -> None:
    w = full_chip([0, 0, 0, 0])
    w.ledger.nominate(req("first", 20, BIG), "n")
    # `first` will take half the chip: a second BIG of lower priority needs the
    # other half freed too, i.e. all four pods.
    assert len(victims(w.plan(req("second", 10, BIG)))) == 4
    assert w.plan(req("second", 10, BIG, count=2)) is None
    # One of higher priority ignores the claim.
    assert len(victims(w.plan(req("third", 30, BIG)))) == 2


def test_the_nofit_memo_keeps_priorities_and_nominees_apart() -> None:
    w, hi = nominated_world()
    memo = NoFitMemo()

    def ask(r: PodRequest) -> Placement | NoFit:
        return memo.place(w.ledger, r, BINPACK, avoid=NONE, first_index=0)

    w.ledger.release("uid-n0")
    w.ledger.release("uid-n1")
    # Asking as the nominee does, but without its claim: told no.
    twin = nofit(ask(req("twin", 10, BIG)))
    assert twin.node_reasons == {"n": Reason.INSUFFICIENT_AICORE}
    # The nominee asks alike and is never answered from that memory.
    assert placed(ask(hi)).node == "n"
    w.ledger.release(hi.uid)
    w.run("x", 0, on="n")  # 5 AICore free: the nominee does not fit yet
    w.ledger.nominate(hi, "n")
    assert nofit(ask(req("low", 0))).node_reasons == {"n": Reason.NOMINATED}
    # Same ask, higher priority than the claim: not answered from memory.
    assert placed(ask(req("urgent", 11))).node == "n"


def test_priority_is_read_from_the_pod() -> None:
    pod = vnpu_pod("p", "ns", uid="u", spec={"priority": 1000, "preemptionPolicy": "Never"})
    assert PodRequest.from_pod(pod).priority == 1000
    assert PodRequest.from_pod(vnpu_pod("p", "ns", uid="u")).priority == 0
    for bad in ("high", True, 1.5):
        with pytest.raises(InvalidRequestError, match=r"spec\.priority"):
            PodRequest.from_pod(vnpu_pod("p", "ns", uid="u", spec={"priority": bad}))


def test_the_working_copy_without_some_pods_frees_their_vnpus_too() -> None:
    w = full_chip([0, 0, 0, 0])
    # The agent's inventory lists the vNPUs until they are destroyed: those of
    # the pods left out must not turn into orphans holding the capacity.
    held = [(a.vnpu_id, a.template) for a in w.ledger.allocations_on("n")]
    w.ledger.upsert_node(node("n", [chip("910B3", 0, vnpus=held)], labels={"name": "n"}))
    state = w.ledger.state_without("n", {"uid-n0", "uid-n1"})
    assert state is not None
    assert (state.chips[0].used.aicore, state.chips[0].orphans) == (10, 0)
    assert state.chips[0].allocated == 2
    assert w.ledger.capacity("n")[0].used.aicore == 20  # the ledger itself unchanged
    assert w.ledger.state_without("gone", ()) is None
