"""`python -m bench.placement.churn`: the placement CPU per pod of the
scaling run's churn (`make bench-scale`), with no control plane.

The scaling run's churn books pods of the benchmark's mix (six request
shapes) and releases each a little later, with about 50 alive at once. This
replays it with the operator's own `Ledger` and `NoFitMemo` at each node
count, for a churn as short as the scaling run's and for a long one, and
prints per pod the nodes asked (one node's answer for one shape) and the
fits computed, and the ms of placement CPU.

What it shows: the first placement of a request shape asks one node of
each class alike in what the answer reads (placement.candidates, the
ledger's node classes), and after that a placement asks only the nodes
changed since its shape's last one: the same few at every node count. An
answer is computed once for all nodes alike in what fitting reads
(capacity.fingerprint), so the fits computed stay flat as nodes are added;
what still grows is each node's chips print, worked out once per node.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import deque

from bench.load import MIX
from bench.placement.workload import inventories
from vnpu_operator.placement import Ledger, Placement, PodRequest, Policy
from vnpu_operator.placement import ledger as ledger_module
from vnpu_operator.placement.nofit_memo import NoFitMemo

ALIVE = 50  # pods alive at once: the scaling run's 5/s held 10 s


def churn(nodes: int, pods: int, policy: Policy = Policy.BINPACK) -> dict[str, float]:
    """`pods` of the mix placed and released at `nodes` nodes."""
    ledger, memo = Ledger.rebuild(inventories(nodes), []), NoFitMemo()
    asks = fits = 0
    # The ledger calls fit_node by the name it imported: counted there.
    ledger_names = vars(ledger_module)
    ask, fit = ledger._fit, ledger_names["fit_node"]

    def asked(*args: object, **kwargs: object) -> object:
        nonlocal asks
        asks += 1
        return ask(*args, **kwargs)  # type: ignore[arg-type]

    def fitted(*args: object, **kwargs: object) -> object:
        nonlocal fits
        fits += 1
        return fit(*args, **kwargs)

    ledger._fit = asked  # type: ignore[assignment,method-assign]
    ledger_names["fit_node"] = fitted
    try:
        rng = random.Random(7)
        weights = [w for _, _, w in MIX]
        alive: deque[Placement] = deque()
        started = time.process_time()
        for i in range(pods):
            template, count, _ = rng.choices(MIX, weights=weights)[0]
            name = f"c-{i}"
            r = PodRequest(namespace="bench", name=name, uid=name, template=template, count=count)
            got = memo.place(ledger, r, policy, avoid=frozenset(), first_index=0)
            if not isinstance(got, Placement):
                raise SystemExit(f"{r.name} did not fit: {got.message}")
            alive.append(got)
            if len(alive) > ALIVE:
                for alloc in alive.popleft().allocations:
                    ledger.remove_allocation(alloc.key, destroyed=True)
                    memo.capacity_grew()
        spent = time.process_time() - started
    finally:
        ledger_names["fit_node"] = fit
    return {
        "nodes": nodes,
        "pods": pods,
        "asks_per_pod": round(asks / pods, 2),
        "fits_per_pod": round(fits / pods, 2),
        "ms_per_pod": round(spent * 1000 / pods, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="250,500,1000,2000", help="node counts, comma-separated")
    p.add_argument("--pods", default="300,6000", help="churn lengths, comma-separated")
    args = p.parse_args()
    for n in (int(x) for x in args.nodes.split(",")):
        for pods in (int(x) for x in args.pods.split(",")):
            r = churn(n, pods)
            print(
                f"{n:>5} nodes, {pods:>5} pods, per pod: {r['asks_per_pod']:>6} nodes asked, "
                f"{r['fits_per_pod']:>5} fits computed, {r['ms_per_pod']} ms of placement CPU"
            )


if __name__ == "__main__":
    main()
