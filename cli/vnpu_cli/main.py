"""`kubectl vnpu` (the executable `kubectl-vnpu` on PATH): argument parsing,
the read-only commands (status, why, usage, defrag) and cordon/uncordon.
Exit 0 with the report, 1 with `error: ...` on stderr when the cluster, the
pod or the request is not there, 2 for a malformed command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Awaitable, Sequence
from typing import Any, get_args

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_cli import cordon, defrag, kube, status, usage, why
from vnpu_cli.errors import CliError
from vnpu_cli.snapshot import Snapshot
from vnpu_common import __version__
from vnpu_common.kube.rawcall import describe
from vnpu_common.wire import names
from vnpu_common.wire.types import Raw
from vnpu_operator.config import OperatorSettings, PolicyName
from vnpu_operator.placement import Policy
from vnpu_operator.placement.defrag import DEFAULT_MAX_MOVES

DEFAULT_AGENT_NAMESPACE = "vnpu-system"


def _parser() -> argparse.ArgumentParser:
    # Global flags are accepted before and after the command, as kubectl's
    # are: `kubectl vnpu why p -n team-a -o json`. SUPPRESS keeps a
    # subcommand's unset flag from overwriting one given before it.
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    common.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)"
    )
    common.add_argument("--context", help="kubeconfig context (default: the current one)")
    common.add_argument(
        "-o", "--output", choices=("text", "json"), help="text tables (default) or JSON"
    )
    common.add_argument(
        "--agent-namespace",
        help=f"namespace of the vnpu agents' Leases (default: ${_AGENT_NS_ENV} or "
        f"{DEFAULT_AGENT_NAMESPACE})",
    )
    parser = argparse.ArgumentParser(
        prog="kubectl vnpu",
        description="vNPUs at a glance: capacity per chip, why a pod waits, use per "
        "namespace, which pods to reschedule to defragment; cordon and uncordon a chip.",
        parents=[common],
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"kubectl-vnpu {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "status",
        parents=[common],
        help="every node's chips: model, health, cordon, AICore/memory/AICPU, vNPUs and pods",
    )
    why_cmd = commands.add_parser(
        "why",
        parents=[common],
        help="a pod's request, its vnpu.io/Allocated condition, and where its vNPUs are or "
        "why each node cannot host it",
    )
    why_cmd.add_argument("pod", metavar="POD")
    why_cmd.add_argument("-n", "--namespace", help="the pod's namespace (default: the context's)")
    usage_cmd = commands.add_parser(
        "usage", parents=[common], help="per namespace: vNPUs, AICore and memory in use, waiting"
    )
    scope = usage_cmd.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help="one namespace (default: all)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    defrag_cmd = commands.add_parser(
        "defrag",
        parents=[common],
        help="which running vNPU pods, rescheduled, would gather scattered free capacity "
        "onto whole chips, and how many more of the largest template would then fit; "
        "it evicts nothing",
        description="Suggests which running vNPU pods to reschedule (delete and create "
        "again) so that scattered free capacity becomes whole free chips, and how many "
        "more of the largest template would then fit. It only reads: nothing is evicted, "
        "cordoned or moved.",
    )
    defrag_cmd.add_argument(
        "--max-moves",
        type=_positive,
        default=DEFAULT_MAX_MOVES,
        help=f"most pods to reschedule in all (default {DEFAULT_MAX_MOVES})",
    )
    defrag_cmd.add_argument("--node", help="only empty chips of this node (default: any)")
    defrag_cmd.add_argument(
        "--policy",
        choices=get_args(PolicyName),
        default=DEFAULT_POLICY,
        help="the operator's placement policy (its --policy, chart value operator.policy; "
        f"default {DEFAULT_POLICY})",
    )
    cordon_cmd = commands.add_parser(
        "cordon",
        parents=[common],
        help="take one chip of a node out of service for new vNPUs (those on it stay)",
    )
    uncordon_cmd = commands.add_parser(
        "uncordon", parents=[common], help="put a cordoned chip back in service"
    )
    for cmd in (cordon_cmd, uncordon_cmd):
        cmd.add_argument("node", metavar="NODE")
        cmd.add_argument("chip", metavar="CHIP", type=int, help="chip index, as status shows it")
    cordon_cmd.add_argument("--reason", required=True, help="why, for other admins")
    return parser


_AGENT_NS_ENV = "VNPU_AGENT_NAMESPACE"
# The operator's own default, so the plugin simulates what an unconfigured operator runs.
DEFAULT_POLICY = str(OperatorSettings.model_fields["policy"].default)


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    target = kube.Target(getattr(args, "kubeconfig", None), getattr(args, "context", None))
    agent_ns = getattr(args, "agent_namespace", None) or os.environ.get(
        _AGENT_NS_ENV, DEFAULT_AGENT_NAMESPACE
    )
    conn = await kube.connect(target)
    async with conn.api:
        if args.command == "why":
            namespace = getattr(args, "namespace", None) or conn.namespace
            # The pod first: a wrong name fails before the cluster-wide lists.
            pod = await kube.pod(conn, namespace, args.pod)
            claims_of = namespace if why.needs_claims(pod) else None
            snapshot = await _snapshot(conn, agent_ns, claims_of=claims_of)
            return why.build(pod, snapshot)
        if args.command == "usage":
            namespace = getattr(args, "namespace", None)
            snapshot = await _snapshot(conn, agent_ns, pods_of=namespace or "")
            return usage.build(snapshot, namespace)
        if args.command == "defrag":
            snapshot = await _snapshot(conn, agent_ns, pods_of="")
            return defrag.build(
                snapshot, policy=Policy(args.policy), max_moves=args.max_moves, node=args.node
            )
        if args.command in ("cordon", "uncordon"):
            reason = args.reason if args.command == "cordon" else None
            return await _cordon(conn, args.node, args.chip, reason)
        return status.build(await _snapshot(conn, agent_ns))


async def _cordon(
    conn: kube.Connection, node: str, chip: int, reason: str | None
) -> dict[str, Any]:
    """Read, change, patch guarded by what was read (cordon.patch_body); a
    conflict (someone changed the cordons meanwhile) reads again."""
    for attempt in range(cordon.ATTEMPTS):
        if attempt:
            await asyncio.sleep(cordon.retry_pause(attempt))
        vnpu_node = await kube.vnpunode(conn, node)
        before = cordon.current(vnpu_node)
        after = cordon.changed(before, chip, reason)
        message = cordon.outcome(node, chip, reason, before)
        if after != before:
            try:
                await kube.patch_vnpunode(conn, node, cordon.patch_body(vnpu_node, after))
            except ApiException as exc:
                if exc.status in (409, 422):  # someone else changed the cordons meanwhile
                    continue
                raise CliError(f"cannot patch VNPUNode {node}: {exc.status} {exc.reason}") from exc
        chips = {c.get("index") for c in (vnpu_node.get("status") or {}).get("chips") or []}
        if chip not in chips:
            message += f" (the node reports no chip {chip} yet)"
        return cordon.report(node, chip, message, after)
    raise CliError(f"VNPUNode {node} kept changing under {cordon.ATTEMPTS} attempts; try again")


async def _snapshot(
    conn: kube.Connection,
    agent_namespace: str,
    *,
    pods_of: str | None = None,
    claims_of: str | None = None,
) -> Snapshot:
    """Every list in parallel, one per kind. `pods_of`: also the vNPU pods
    of that namespace ("" for all); `claims_of`: also the ResourceClaims of
    that namespace."""
    lists: list[Awaitable[Any]] = [
        kube.vnpu_objects(conn, names.NODE_PLURAL),
        kube.nodes(conn),
        kube.leases(conn, agent_namespace),
        kube.vnpu_objects(conn, names.ALLOCATION_PLURAL),
    ]
    if pods_of is not None:
        lists.append(kube.vnpu_pods(conn, pods_of or None))
        lists.append(kube.resource_quotas(conn, pods_of or None))
    if claims_of is not None:
        lists.append(_resource_claims(conn, claims_of))
    results = await asyncio.gather(*lists)
    claims, claims_problem = results[-1] if claims_of is not None else ([], None)
    return Snapshot(
        vnpunodes=results[0],
        nodes=results[1],
        leases=results[2],
        allocations=results[3],
        pods=results[4] if pods_of is not None else [],
        quotas=results[5] if pods_of is not None else [],
        claims=claims,
        claims_problem=claims_problem,
        agent_namespace=agent_namespace,
    )


async def _resource_claims(conn: kube.Connection, namespace: str) -> tuple[list[Raw], str | None]:
    """The namespace's ResourceClaims, or why they cannot be read. Not an
    error: a user who may read pods but not claims still gets the rest of
    the report, the claim's VNPUAllocations included."""
    api = client.ResourceV1Api(conn.api)
    what = f"list resourceclaims in {namespace}"
    try:
        claims = await kube.list_items(conn, what, api.list_namespaced_resource_claim, namespace)
    except CliError as exc:
        denied = exc.__cause__
        if isinstance(denied, ApiException) and denied.status == 403:
            return [], (
                f"{exc}; shown: the claim's VNPUAllocations, not its binding conditions "
                "(those need list on resourceclaims.resource.k8s.io)"
            )
        raise
    except ApiException as exc:
        if exc.status == 404:
            return [], f"the cluster serves no {names.RESOURCE_API} ResourceClaims"
        raise
    return claims, None


def render(command: str, report: dict[str, Any], output: str) -> str:
    if output == "json":
        return json.dumps(report, indent=2, sort_keys=True) + "\n"
    module = {
        "status": status,
        "why": why,
        "usage": usage,
        "defrag": defrag,
        "cordon": cordon,
        "uncordon": cordon,
    }[command]
    text: str = module.text(report)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="warning: %(message)s", stream=sys.stderr)
    logging.getLogger("kubernetes_asyncio").setLevel(logging.ERROR)
    try:
        report = asyncio.run(_run(args))
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ApiException as exc:
        # What no command turned into a sentence of its own (401, 5xx, ...).
        print(f"error: the API server answered {describe(exc)}", file=sys.stderr)
        return 1
    sys.stdout.write(render(args.command, report, getattr(args, "output", "text")))
    return 0


def entrypoint() -> None:
    sys.exit(main())
