"""Driver layer: one interface (base.Driver), three backends.

    sim      simulator with a JSON state file (sim/)
    npu-smi  the Ascend CLI (npu_smi.py)
    dcmi     libdcmi.so through ctypes (dcmi.py)

Backends are imported on demand, so that loading this package stays cheap
and `python -m vnpu_agent.drivers.sim` does not import itself twice. The
backends' table (kinds, constructors, settings, check's flags) is backends.py.

- `base`: the interface every backend implements, and its typed errors.
- `backends`: the backends, one row each: the table every other place reads.
- `catalog`: templates per chip model, id ranges, the capacity rule
  (docs/ASCEND.md).
- `npu_smi`, `npu_smi_parse`: the CLI driven; its output parsed, an error
  rather than a wrong number.
- `dcmi`, `dcmi_types`: libdcmi.so bound with ctypes; its structs, as the
  public header has them.
- `diagnose`: a real driver's refusal made a typed error by looking at the
  chip, its code table the fallback.
- `sim/`: the simulator.
"""

from __future__ import annotations

import inspect
from typing import Any

from vnpu_agent.drivers import backends
from vnpu_agent.drivers.backends import DRIVER_KINDS
from vnpu_agent.drivers.base import (
    ANY_VNPU_ID,
    VNPU,
    CapacityError,
    ChipInfo,
    Driver,
    DriverError,
    DriverFailure,
    InUseError,
    InvalidIdError,
    InvalidTemplateError,
    MalformedOutputError,
    NotFoundError,
    TemplateSpec,
)

__all__ = [
    "ANY_VNPU_ID",
    "DRIVER_KINDS",
    "VNPU",
    "CapacityError",
    "ChipInfo",
    "Driver",
    "DriverError",
    "DriverFailure",
    "InUseError",
    "InvalidIdError",
    "InvalidTemplateError",
    "MalformedOutputError",
    "NotFoundError",
    "TemplateSpec",
    "make_driver",
]


def make_driver(kind: str, **options: Any) -> Driver:
    """A driver of `kind` built with the backend's keyword options:

    sim:     state_path (required), layout ({"910B3": 4} or "910B3=4"), recover_path
    npu-smi: executable ("npu-smi"), timeout (seconds), env (extra variables)
    dcmi:    library ("libdcmi.so")

    Raises ValueError for an unknown kind or option; backend errors
    (a state for other chips, a library that does not load) are DriverErrors.
    """
    cls = backends.constructor(kind)
    signature = inspect.signature(cls)
    try:
        signature.bind(**options)
    except TypeError as exc:
        accepted = ", ".join(signature.parameters)
        raise ValueError(
            f"bad options for the {kind} driver ({exc}); it takes: {accepted}"
        ) from exc
    driver: Driver = cls(**options)
    return driver
