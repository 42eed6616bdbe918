"""The `sim` backend: a simulator of the Ascend vNPU driver (engine.py says
what it reproduces).

    `engine`    SimDriver: the Driver interface over the state, one locked
                transaction per call
    `rules`     the driver's rules as pure functions over the state: layouts,
                capacity, id ranges, faults, config-recover replay
    `state`     the JSON state file, its types and its lock
    `recover`   the config-recover file (vnpu.cfg) the simulated driver keeps
    `cli`       the command line tests and people use to act on a state from
                outside; `python -m vnpu_agent.drivers.sim` (__main__.py) runs it

Importing the package loads the engine only, never the command line, so
that `python -m` runs each module once.
"""

from __future__ import annotations

from vnpu_agent.drivers.sim.engine import (
    MAX_CHIPS,
    NULL_DEVICE,
    RebootReport,
    SimDriver,
    parse_layout,
)

__all__ = ["MAX_CHIPS", "NULL_DEVICE", "RebootReport", "SimDriver", "parse_layout"]
