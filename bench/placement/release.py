"""`python -m bench.placement.release`: the placement CPU of the benchmark's
fill release, with no control plane.

`python -m bench`'s fill books every node full with pods of 4 x
`vir10_3c_32g`, leaves a tenth of the nodes' count of alike pods waiting,
then frees as many pods. Each freed allocation grows capacity, and the
operator retries the oldest waiting pods of the shape (`WaitingLine.width`
of them) unless the line's probe finds each would get the answer it was
told. This replays that with the operator's own `Ledger` and `NoFitMemo` and
prints the placement CPU of the release: what the operator's event loop
spends before the last waiting pod is placed, the reading of each NoFit's
reason and message included, apart from its watch events and API calls.
Each place call stands for a reconcile of a waiting pod in the operator.
"""

from __future__ import annotations

import argparse
import time

from bench.load import FILL
from bench.placement.workload import inventories
from vnpu_operator.placement import Ledger, Placement, PodRequest, Policy
from vnpu_operator.placement.nofit_memo import NoFitMemo
from vnpu_operator.waiting import WIDTH


def request(name: str) -> PodRequest:
    template, count = FILL
    return PodRequest(namespace="bench", name=name, uid=name, template=template, count=count)


def release(nodes: int, policy: Policy) -> dict[str, float]:
    """The fill and the release at `nodes` nodes: ms of placement CPU."""
    ledger, memo = Ledger.rebuild(inventories(nodes), []), NoFitMemo()
    started = time.perf_counter()
    placed = [request(f"fill-{i}") for i in range(2 * nodes)]
    for r in placed:
        got = memo.place(ledger, r, policy, avoid=frozenset(), first_index=0)
        if not isinstance(got, Placement):
            raise SystemExit(f"{r.name} did not fit: the fill's arithmetic is off")
    fill_ms = (time.perf_counter() - started) * 1000
    waiting = [request(f"wait-{i}") for i in range(max(2, nodes // 10))]
    told: dict[str, str] = {}
    for pod in waiting:
        got = memo.place(ledger, pod, policy, avoid=frozenset(), first_index=0)
        told[pod.uid] = got.message if not isinstance(got, Placement) else ""
    head, calls, spent = 0, 0, 0.0
    for freed in placed[: len(waiting)]:
        for alloc in ledger.allocations_for(freed.uid):
            ledger.remove_allocation(alloc.key, destroyed=True)
            started = time.perf_counter()
            memo.capacity_grew()
            for pod in waiting[head : head + WIDTH]:
                # The waiting line's probe (Placer.still_waits): a pod that
                # would find what it was told is not retried.
                peeked = memo.peek(ledger, pod, policy, avoid=frozenset())
                if peeked is not None and peeked.message == told[pod.uid]:
                    continue
                calls += 1
                got = memo.place(ledger, pod, policy, avoid=frozenset(), first_index=0)
                if isinstance(got, Placement):
                    head += 1
                    break
                # What the operator reads of a pod's NoFit (steps/place.py):
                # its waiting reason, metric label and event key, and message.
                _ = got.primary_reason, got.primary_reason, got.primary_reason, got.message
                told[pod.uid] = got.message
            spent += time.perf_counter() - started
    if head != len(waiting):
        raise SystemExit(f"only {head} of {len(waiting)} waiting pods were placed")
    return {
        "nodes": nodes,
        "fill_ms_per_pod": round(fill_ms / len(placed), 3),
        "waiting": len(waiting),
        "place_calls": calls,
        "release_ms": round(spent * 1000, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="200,1000", help="node counts, comma-separated")
    p.add_argument("--policy", default=Policy.BINPACK.value, choices=[x.value for x in Policy])
    args = p.parse_args()
    for n in (int(x) for x in args.nodes.split(",")):
        r = release(n, Policy(args.policy))
        print(
            f"{r['nodes']:>5} nodes: fill {r['fill_ms_per_pod']} ms per pod; release of "
            f"{r['waiting']} pods, {r['place_calls']} place calls: {r['release_ms']} ms"
        )


if __name__ == "__main__":
    main()
