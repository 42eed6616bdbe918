"""The driver backends, one row each: the table every other place reads.

A row names the backend, its constructor (imported on demand), the agent's
settings it reads and how they become the constructor's keywords, and the
flags of `vnpu-agent check` with what check builds from them. The agent's
settings (config.AgentSettings: DriverKind, the backend's fields),
`make_driver`, the agent's `build_driver` and check's parser all come from
here, so a new backend is its module and its row (plus its settings'
fields in config.py, when it reads new ones).

It knows no cluster: the one thing a backend may need from the Node (the sim
driver's chip layout, the sim.vnpu.io/chips annotation) the agent reads and
hands in (`AgentInputs.layout`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, get_args

from vnpu_agent.drivers.base import Driver

# A Literal, not a str, so that pydantic rejects an unknown --driver at start
# and mypy checks the settings' default; BACKENDS must have a row per kind
# (checked below).
DriverKind = Literal["sim", "npu-smi", "dcmi"]


@dataclass(frozen=True)
class Flag:
    """One flag of `vnpu-agent check`, --<name>. With a `setting` it is the
    agent's setting of that name: its default is the agent's, read from the
    same VNPU_<SETTING> variable, so check loads what the agent would."""

    name: str
    help: str
    setting: str | None = None
    type: Callable[[str], Any] = str
    # check's default when the variable is unset or empty and the agent has
    # none to give (a fresh sim state needs some chips).
    fallback: str | None = None

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")


@dataclass(frozen=True)
class AgentInputs:
    """What the agent hands a backend for one node."""

    settings: Mapping[str, Any]  # the backend's settings (Backend.settings), by name
    node_dir: Path  # <state dir>/<node>, the node's own state
    layout: str | None  # the node's simulated chips, for a backend with a layout_setting


@dataclass(frozen=True)
class Backend:
    kind: DriverKind
    load: Callable[[], type[Any]]  # the constructor, imported on first use
    settings: tuple[str, ...]  # the fields of config.AgentSettings the agent's driver reads
    agent_options: Callable[[AgentInputs], dict[str, Any]]
    check_flags: tuple[Flag, ...]
    # check's keywords from its parsed flags (by dest) and a scratch directory.
    check_options: Callable[[Mapping[str, Any], Path], dict[str, Any]]
    # The setting whose layout applies to a node without a sim.vnpu.io/chips
    # annotation; None: the backend's chips are real, no Node is read.
    layout_setting: str | None = None
    # Its templates are the catalog's (it cannot list any): check lists none
    # for a chip model the catalog lacks.
    catalog_templates: bool = False


def _sim() -> type[Any]:
    from vnpu_agent.drivers.sim import SimDriver

    return SimDriver


def _npu_smi() -> type[Any]:
    from vnpu_agent.drivers.npu_smi import NpuSmiDriver

    return NpuSmiDriver


def _dcmi() -> type[Any]:
    from vnpu_agent.drivers.dcmi import DcmiDriver

    return DcmiDriver


def _sim_agent(given: AgentInputs) -> dict[str, Any]:
    state = given.node_dir / "sim" / "state.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    return {
        "state_path": state,
        "layout": given.layout,
        "device_dir": given.settings["sim_device_dir"],
    }


def _sim_check(args: Mapping[str, Any], scratch: Path) -> dict[str, Any]:
    if args["sim_state"] is not None:
        return {"state_path": args["sim_state"]}
    return {"state_path": scratch / "state.json", "layout": args["sim_chips"]}


_TIMEOUT = Flag(
    "driver-timeout-seconds", "longest one call may take", "driver_timeout_seconds", float
)

BACKENDS: Final[Mapping[str, Backend]] = {
    b.kind: b
    for b in (
        Backend(
            "sim",
            _sim,
            ("sim_chips", "sim_device_dir"),
            _sim_agent,
            (
                Flag(
                    "sim-state",
                    "the simulator's state file (an agent's: <state dir>/<node>/sim/state.json); "
                    "default a fresh one of --sim-chips",
                    type=Path,
                ),
                Flag(
                    "sim-chips",
                    "the chip layout of a fresh state, e.g. 910B3=2,310P3=1",
                    "sim_chips",
                    fallback="910B3=1",
                ),
            ),
            _sim_check,
            layout_setting="sim_chips",
        ),
        Backend(
            "npu-smi",
            _npu_smi,
            ("npu_smi_path", "driver_timeout_seconds"),
            lambda given: {
                "executable": given.settings["npu_smi_path"],
                "timeout": given.settings["driver_timeout_seconds"],
            },
            (Flag("npu-smi-path", "the executable", "npu_smi_path"), _TIMEOUT),
            lambda args, _: {
                "executable": args["npu_smi_path"],
                "timeout": args["driver_timeout_seconds"],
            },
        ),
        Backend(
            "dcmi",
            _dcmi,
            ("dcmi_library",),
            lambda given: {"library": given.settings["dcmi_library"]},
            (Flag("dcmi-library", "the driver's libdcmi.so", "dcmi_library"),),
            lambda args, _: {"library": args["dcmi_library"]},
            catalog_templates=True,
        ),
    )
}

DRIVER_KINDS: Final = tuple(BACKENDS)

if get_args(DriverKind) != DRIVER_KINDS:
    raise AssertionError(f"DriverKind {get_args(DriverKind)} and BACKENDS {DRIVER_KINDS} differ")


def backend(kind: str) -> Backend:
    """The row of `kind`; ValueError naming the kinds for any other."""
    try:
        return BACKENDS[kind]
    except KeyError:
        raise ValueError(
            f"unknown driver kind {kind!r}; use one of: {', '.join(DRIVER_KINDS)}"
        ) from None


def constructor(kind: str) -> Callable[..., Driver]:
    """The backend's class, as a callable returning a Driver."""
    cls: Callable[..., Driver] = backend(kind).load()
    return cls
