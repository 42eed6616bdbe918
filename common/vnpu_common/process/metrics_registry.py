"""The metrics registry each component starts from: the client library's
process, platform (Python version) and garbage-collector collectors, and a
`<prefix>_build_info` naming the version that runs, so a dashboard can tell
a memory leak from a deploy and an alert can name the release it fired on."""

from __future__ import annotations

from typing import Final

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Info,
    disable_created_metrics,
)
from prometheus_client.core import GaugeMetricFamily

from vnpu_common import __version__

MIB: Final = 1024 * 1024
# Every chip series of both components: our index (`chip`, as in a
# VNPUAllocation) and the physical `id` Ascend's npu-exporter labels chips
# with, so the two join.
CHIP_LABELS: Final = ("node", "chip", "id", "model")


def component_registry(prefix: str) -> CollectorRegistry:
    """A fresh registry (never the library's global one: tests run several
    components in one process) with the standard collectors and
    `<prefix>_build_info{version}`. The standard collectors are the library's
    process-wide instances: a new GC collector per registry would hook the
    garbage collector once more every time."""
    # No `_created` series: in the text format each counter and histogram
    # would get a second, gauge-typed family of start times nobody queries,
    # one per label set (per node for the agent's counters).
    disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry()
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    Info(f"{prefix}_build", "The running version (value 1).", registry=registry).info(
        {"version": __version__}
    )
    return registry


def chip_gauge(prefix: str, name: str, doc: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
    """`<prefix>_chip_<name>`, labelled CHIP_LABELS and then `extra`."""
    return GaugeMetricFamily(f"{prefix}_chip_{name}", doc, labels=[*CHIP_LABELS, *extra])
