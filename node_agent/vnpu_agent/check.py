"""`vnpu-agent check`: the node's chips as the agent would see them, held
against the template catalog (drivers/catalog.py), before anything is
installed.

It loads the driver the agent would load (the same `VNPU_*` variables: run
inside the agent's pod it checks what the agent runs with), lists chips,
their templates and the vNPUs already there, prints them and says what does
not match the catalog, which the operator places by:

- a chip whose model the catalog does not know (the operator can place
  nothing there; dcmi cannot even list its templates);
- a template whose sizes differ from the catalog's, or one only one side
  offers;
- a vNPU whose template its chip does not offer.

Exit status: 0 all matches, 1 a mismatch, 2 the driver could not be loaded
or did not answer. Chip totals that differ from the catalog's are printed as
notes, not failures: the capacity is what the driver reports.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vnpu_agent.config import AgentSettings
from vnpu_agent.drivers import DRIVER_KINDS, make_driver
from vnpu_agent.drivers.backends import BACKENDS, Flag, backend
from vnpu_agent.drivers.base import VNPU, ChipInfo, Driver, DriverError, TemplateSpec
from vnpu_agent.drivers.catalog import ChipModel, find_model, known_models

OK, MISMATCH, UNUSABLE = 0, 1, 2


@dataclass
class ChipReport:
    chip: ChipInfo
    model: ChipModel | None
    templates: list[TemplateSpec] = field(default_factory=list)
    vnpus: list[VNPU] = field(default_factory=list)


@dataclass
class Findings:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _default(flag: Flag) -> Any:
    """The flag's default as the agent would have it: VNPU_<SETTING>, else
    the agent's default (config.AgentSettings), else check's own."""
    if flag.setting is None:
        return None
    variable = f"VNPU_{flag.setting.upper()}"
    if os.environ.get(variable):
        return flag.type(os.environ[variable])
    if flag.fallback is not None:
        return flag.type(flag.fallback)
    if variable in os.environ:
        return flag.type(os.environ[variable])
    return AgentSettings.model_fields[flag.setting].default


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vnpu-agent check",
        description="Load the driver, list chips, templates and vNPUs as the agent sees them "
        "and compare them with the template catalog; exits 1 on a mismatch, 2 when the "
        "driver cannot be loaded or does not answer.",
    )
    default_kind = AgentSettings.model_fields["driver"].default
    parser.add_argument(
        "--driver",
        choices=DRIVER_KINDS,
        default=os.environ.get("VNPU_DRIVER", default_kind),
        help=f"driver backend (VNPU_DRIVER; default {default_kind})",
    )
    seen: set[str] = set()
    for row in BACKENDS.values():
        for flag in row.check_flags:
            if flag.name in seen:
                continue  # a flag two backends read is one flag
            seen.add(flag.name)
            variable = f" (VNPU_{flag.setting.upper()})" if flag.setting else ""
            parser.add_argument(
                f"--{flag.name}",
                type=flag.type,
                default=_default(flag),
                help=f"{row.kind}: {flag.help}{variable}",
            )
    return parser


def load(args: argparse.Namespace, scratch: Path) -> Driver:
    """The driver as the agent builds it; raises DriverError or ValueError."""
    options = backend(args.driver).check_options(vars(args), scratch)
    return make_driver(args.driver, **options)


def survey(driver: Driver) -> list[ChipReport]:
    """Every chip with its templates and vNPUs; raises DriverError."""
    reports = []
    for chip in driver.list_chips():
        report = ChipReport(chip, find_model(chip.model))
        reports.append(report)
        row = BACKENDS.get(driver.name)
        if report.model is None and row is not None and row.catalog_templates:
            report.vnpus = driver.list_vnpus(chip.index)
            continue
        report.templates = driver.list_templates(chip.index)
        report.vnpus = driver.list_vnpus(chip.index)
    return reports


def _sizes(t: TemplateSpec) -> str:
    return f"{t.aicore} AICore, {t.memory_mb} MB, {t.aicpu} AICPU, {t.media} media"


def compare(reports: Sequence[ChipReport]) -> Findings:
    found = Findings()
    if not reports:
        found.problems.append("the driver reports no chips")
    for r in reports:
        chip = r.chip
        where = f"chip {chip.index} ({chip.model})"
        if r.model is None:
            found.problems.append(
                f"{where}: model {chip.model!r} is not in the catalog (known: "
                f"{', '.join(known_models())}); the operator places nothing on it"
            )
        else:
            catalog = {t.name: t for t in r.model.templates}
            offered = {t.name: t for t in r.templates}
            for name in sorted(catalog.keys() | offered.keys()):
                want, have = catalog.get(name), offered.get(name)
                if want is None:
                    found.problems.append(f"{where}: the driver offers {name}, the catalog not")
                elif have is None:
                    found.problems.append(f"{where}: the catalog has {name}, the driver not")
                elif want != have:
                    found.problems.append(
                        f"{where}: template {name} is {_sizes(have)} in the driver, "
                        f"{_sizes(want)} in the catalog"
                    )
            for what, have_total, want_total in (
                ("AICore", chip.aicore_total, r.model.aicore),
                ("memory MB", chip.memory_total_mb, r.model.memory_mb),
            ):
                if have_total != want_total:
                    found.notes.append(
                        f"{where}: {have_total} {what} in total, the catalog says {want_total}"
                    )
        names = {t.name for t in r.templates} or (
            {t.name for t in r.model.templates} if r.model else set()
        )
        for v in r.vnpus:
            if v.template not in names:
                found.problems.append(
                    f"{where}: vNPU {v.id} is a {v.template}, a template the chip does not offer"
                )
        if not chip.healthy:
            found.notes.append(f"{where}: unhealthy; the operator places nothing on it")
    return found


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [list(map(str, headers)), *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def render(driver: str, reports: Sequence[ChipReport], found: Findings) -> str:
    chips = _table(
        ["CHIP", "PHY", "MODEL", "CATALOG", "HEALTH", "AICORE FREE", "MEMORY MB FREE", "IDS",
         "TEMPLATES", "VNPUS"],
        [
            [r.chip.index, r.chip.physical_id, r.chip.model,
             r.model.name if r.model else "unknown",
             "ok" if r.chip.healthy else "UNHEALTHY",
             f"{r.chip.aicore_free}/{r.chip.aicore_total}",
             f"{r.chip.memory_free_mb}/{r.chip.memory_total_mb}",
             f"{r.chip.vnpu_id_min}-{r.chip.vnpu_id_max}",
             ",".join(t.name for t in r.templates) or "-", len(r.vnpus)]
            for r in reports
        ],
    )  # fmt: skip
    out = [f"driver {driver}: {len(reports)} chip(s)", chips]
    vnpus = [(r.chip.index, v) for r in reports for v in r.vnpus]
    if vnpus:
        out += [
            "",
            _table(
                ["CHIP", "VNPU", "TEMPLATE", "IN USE"],
                [[c, v.id, v.template, "yes" if v.in_use else "no"] for c, v in vnpus],
            ),
        ]
    out.append("")
    out += [f"note: {n}" for n in found.notes]
    if found.problems:
        out += [f"MISMATCH: {p}" for p in found.problems]
        out.append(f"FAIL: {len(found.problems)} mismatch(es) with the catalog")
    else:
        out.append("OK: every chip's model and templates match the catalog")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vnpu-check-") as scratch:
        try:
            driver = load(args, Path(scratch))
        except (DriverError, ValueError, OSError) as exc:
            print(f"FAIL: cannot load the {args.driver} driver: {exc}", file=sys.stderr)
            return UNUSABLE
        try:
            reports = survey(driver)
        except DriverError as exc:
            print(f"FAIL: the {args.driver} driver did not answer: {exc}", file=sys.stderr)
            return UNUSABLE
    found = compare(reports)
    print(render(args.driver, reports, found))
    return MISMATCH if found.problems else OK
