"""Every benchmark result a document names is in the tree, and bench/ keeps no run logs
or profiles: a figure's source must resolve, and the tree holds code and results only
(bench/README.md, bench/runs/README.md)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# Where results are cited: the docs, the benchmark's own code and maps, the Makefile.
CITING = sorted(
    {
        ROOT / "README.md",
        ROOT / "Makefile",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "bench").rglob("*.md"),
        *(ROOT / "bench").rglob("*.py"),
        *(ROOT / "tests").rglob("*.py"),
    }
)
_RESULT = re.compile(r"bench/(?:runs/[\w.-]+/?(?:[\w.-]+\.json)?|results[\w.-]*\.json)")


def cited_results() -> dict[str, list[str]]:
    """Each cited results path (a file or a run folder) and the files citing it."""
    cited: dict[str, list[str]] = {}
    for path in CITING:
        if path == Path(__file__):
            continue
        for m in _RESULT.finditer(path.read_text()):
            cited.setdefault(m.group(0), []).append(str(path.relative_to(ROOT)))
    return cited


def test_every_cited_result_exists() -> None:
    cited = cited_results()
    assert "bench/results-scale.json" in cited, "the pattern no longer finds the citations"
    missing = {p: where for p, where in cited.items() if not (ROOT / p).exists()}
    assert not missing, f"results cited but not in the tree: {missing}"


def test_every_run_folder_is_in_the_index() -> None:
    index = (ROOT / "bench" / "runs" / "README.md").read_text()
    folders = [p.name for p in (ROOT / "bench" / "runs").iterdir() if p.is_dir()]
    assert folders
    assert [f for f in folders if f"]({f}/)" not in index] == []


def test_bench_keeps_no_logs_or_profiles() -> None:
    kept = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "bench").rglob("*")
        if p.suffix in {".log", ".pprof", ".prof", ".svg"}
    ]
    assert kept == []
