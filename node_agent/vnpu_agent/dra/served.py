"""Which of the agent's nodes served DRA when it last ran: a marker file per
node in its state directory (`<state dir>/<node>/dra/pool`), written by an
agent with --dra before it publishes, removed once an agent without --dra
has deleted the node's pool.

Why a file and not a look at the API: an agent without --dra usually has no
right to read ResourceSlices at all (the chart grants them only with DRA on),
and a request it is not allowed to make is a 403 in the audit log on every
start of every annotation agent. The marker says where a pool may be left;
only there does the agent ask.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path


def marker(state_dir: Path, node: str) -> Path:
    return state_dir / node / "dra" / "pool"


def mark(state_dir: Path, nodes: Iterable[str]) -> None:
    """These nodes serve DRA now (an agent with --dra, before it publishes)."""
    for node in nodes:
        path = marker(state_dir, node)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()


def marked(state_dir: Path, nodes: Iterable[str]) -> list[str]:
    """The nodes that served DRA when the agent last ran, and may have a pool."""
    return [n for n in nodes if marker(state_dir, n).exists()]


def unmark(state_dir: Path, nodes: Iterable[str]) -> None:
    """Their pools are gone."""
    for node in nodes:
        with contextlib.suppress(FileNotFoundError):
            marker(state_dir, node).unlink()
