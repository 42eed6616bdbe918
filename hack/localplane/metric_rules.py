"""The naming rules every metric our components export follows (Prometheus'
naming practice; docs/DECISIONS.md, issue 16). Checked on the registries in
a unit test and on a real scrape of both components in an integration test,
so a metric added without following them fails a test."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from prometheus_client.metrics_core import Metric

PREFIXES: Final = ("vnpu_operator_", "vnpu_agent_")
# The client library's own collectors (process, platform, GC): named by
# Prometheus' conventions already, and exactly as every Python exporter names them.
STANDARD_PREFIXES: Final = ("process_", "python_")
STANDARD_FAMILIES: Final = frozenset(
    {
        "process_cpu_seconds",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
        "python_info",
        "python_gc_collections",
    }
)

_NAME = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
BASE_UNITS: Final = ("seconds", "bytes")
# Units that are not base units, and spellings of a unit nobody should have to guess.
NON_BASE_UNITS: Final = frozenset(
    {
        "ms", "msec", "milliseconds", "us", "microseconds", "ns", "nanoseconds", "minutes",
        "hours", "days", "mb", "kb", "gb", "mib", "kib", "gib", "megabytes", "kilobytes",
        "gigabytes", "percent", "pct", "sec", "secs",
    }
)  # fmt: skip
# Label names that say a metric mixes quantities or units (resource, kind,
# unit, type), or that break a join: kube-state-metrics calls a pod `pod`,
# npu-exporter a vNPU `v_dev_id`; `name` says nothing about what is named.
FORBIDDEN_LABELS: Final = frozenset(
    {"resource", "kind", "unit", "type", "pod_name", "name", "vnpu_id", "chip_id"}
)
# Label values that carry a unit or say which quantity a sample is.
_UNIT_VALUE = re.compile(r"(^|[_\-.])(mb|kb|gb|mib|kib|gib|bytes|seconds|ms)$", re.IGNORECASE)
QUANTITY_VALUES: Final = frozenset({"total", "used", "free", "limit", "capacity"})


def is_ours(name: str) -> bool:
    return name.startswith(PREFIXES)


def violations(families: Iterable[Metric]) -> list[str]:
    """Every rule a family breaks, one line each naming family and rule."""
    out: list[str] = []
    for family in families:
        if family.name.startswith(STANDARD_PREFIXES):
            continue
        out += [f"{family.name}: {problem}" for problem in _family_problems(family)]
    return out


def _family_problems(family: Metric) -> list[str]:
    name, kind = family.name, family.type
    problems: list[str] = []
    if not is_ours(name):
        problems.append(f"does not start with {' or '.join(PREFIXES)}")
    if not _NAME.match(name):
        problems.append("is not snake_case")
    if not family.documentation.strip():
        problems.append("has no help text")
    if kind not in ("counter", "gauge", "histogram", "info"):
        problems.append(f"is of type {kind}, not counter, gauge, histogram or info")
    tokens = name.split("_")
    problems += [f"has the non-base unit {t!r}" for t in tokens if t in NON_BASE_UNITS]
    units = [t for t in tokens if t in BASE_UNITS]
    if units and (len(units) > 1 or tokens[-1] != units[0]):
        problems.append("does not end in its one unit")
    if "timestamp" in tokens and tokens[-2:] != ["timestamp", "seconds"]:
        problems.append("is a timestamp not ending in _timestamp_seconds")
    if kind == "histogram" and not units:
        problems.append("is a histogram without a unit")
    if name.endswith("_total"):
        problems.append("has _total in its family name (a counter's samples add it)")
    if name.endswith("_info") and kind != "info":
        problems.append("ends in _info but is not an info metric")
    for sample in family.samples:
        problems += _sample_problems(kind, sample.name, sample.labels)
    return list(dict.fromkeys(problems))


def _sample_problems(kind: str, sample: str, labels: dict[str, str]) -> list[str]:
    problems: list[str] = []
    if kind == "counter" and not sample.endswith(("_total", "_created")):
        problems.append(f"counter sample {sample} does not end in _total")
    if kind != "counter" and sample.endswith("_total"):
        problems.append(f"{kind} sample {sample} ends in _total")
    if kind == "info" and not sample.endswith("_info"):
        problems.append(f"info sample {sample} does not end in _info")
    for label, value in labels.items():
        if label in ("le", "quantile"):
            continue
        if not _NAME.match(label):
            problems.append(f"label {label!r} is not snake_case")
        if label in FORBIDDEN_LABELS:
            problems.append(f"has the label {label!r}")
        if _UNIT_VALUE.search(value):
            problems.append(f"label {label}={value!r} carries a unit")
        if value in QUANTITY_VALUES:
            problems.append(f"label {label}={value!r} names a quantity")
    if "pod" in labels and "namespace" not in labels:
        problems.append("labels a pod without its namespace")
    if "chip" in labels and not {"node", "id"} <= labels.keys():
        problems.append("labels a chip without node and id (npu-exporter's physical id)")
    return problems
