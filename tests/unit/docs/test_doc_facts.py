"""What the documents say about the chart agrees with the chart (hack/docfacts): the
operator's replicas and rollout strategy, `lookup`, the Kubernetes versions, the
placement policies, the protection policies, the values table's defaults; benchmark
figures only in docs/PERFORMANCE.md; the release notes link to documents by URL.

The facts are read from values.yaml, the templates, Chart.yaml and the code;
tests/integration/test_chart_helm4.py checks them against the rendered chart.
"""

from __future__ import annotations

import re

import pytest
from test_doc_links import anchors

from docfacts import (
    CHART,
    DOCS_URL,
    DOCUMENTS,
    FIGURE_EXEMPT,
    LINE_CAPS,
    ROOT,
    TEMPLATES,
    chart_facts,
    claim_problems,
    figure_problems,
    notes_relative_paths,
    repeated_figures,
    values_table_problems,
)


def _report(doc: str, found: list[tuple[int, str, str]]) -> list[str]:
    return [f"{doc}:{line}: {claim}: {why}" for line, claim, why in found]


@pytest.mark.parametrize("doc", DOCUMENTS)
def test_statements_about_the_chart_are_true(doc: str) -> None:
    assert _report(doc, claim_problems((ROOT / doc).read_text(), chart_facts())) == []


def test_the_values_table_gives_the_values_defaults() -> None:
    doc = "docs/HELM.md"
    text = (ROOT / doc).read_text()
    assert _report(doc, values_table_problems(text, chart_facts().values)) == []


@pytest.mark.parametrize("doc", [d for d in DOCUMENTS if d not in FIGURE_EXEMPT])
def test_benchmark_figures_live_in_performance_md(doc: str) -> None:
    assert _report(doc, figure_problems((ROOT / doc).read_text())) == []


def test_no_figure_is_stated_in_two_documents() -> None:
    # A figure restated elsewhere goes stale when the run is redone; link to it instead.
    docs = [*DOCUMENTS, "bench/README.md"]
    assert repeated_figures({d: (ROOT / d).read_text() for d in docs}) == {}


def test_a_figure_stated_twice_is_caught() -> None:
    texts = {
        "a.md": "The release took 1.25 s (p99),\nand 3.5 ms of CPU.",
        "b.md": "| p99 | 1.25s |\n\nA retry every 0.5 s; 30 s; 4096 MB.",
        "c.md": "A retry every 0.5 s; 30 s; 4096 MB; 3.5 ms/pod is not one.",
    }
    assert repeated_figures(texts) == {"1.25 s": ["a.md", "b.md"]}


@pytest.mark.parametrize(("doc", "cap"), sorted(LINE_CAPS.items()))
def test_the_pages_keep_their_size(doc: str, cap: int) -> None:
    lines = len((ROOT / doc).read_text().splitlines())
    assert lines <= cap, f"{doc} has {lines} lines, over its cap of {cap}"


def test_the_release_notes_link_to_documents_by_url() -> None:
    notes = (TEMPLATES / "NOTES.txt").read_text()
    assert notes_relative_paths(notes) == [], "a packaged chart has no docs/: link by URL"
    urls = re.findall(re.escape(DOCS_URL) + r"([\w./-]+?)(?:#([\w-]+))?(?=[\s)]|$)", notes)
    assert urls, "NOTES.txt links to no document"
    for path, anchor in urls:
        assert (ROOT / path).is_file(), f"NOTES.txt links to {path}, which the repository lacks"
        assert not anchor or anchor in anchors(ROOT / path), f"{path} has no #{anchor}"


def test_the_facts_are_the_sources() -> None:
    # Each fact against its source read another way: a fact read wrongly would let
    # every statement about it pass or fail together.
    facts = chart_facts()
    deployment = (TEMPLATES / "operator-deployment.yaml").read_text()
    assert f"type: {facts.operator_strategy}" in deployment
    assert f"maxSurge: {facts.operator_max_surge}" in deployment
    assert f"replicas: {facts.operator_replicas}" in (CHART / "values.yaml").read_text()
    assert f'kubeVersion: ">={facts.kube_floor}.0-0"' in (CHART / "Chart.yaml").read_text()
    assert "lookup" in (TEMPLATES / "NOTES.txt").read_text()
    assert facts.notes_lookup
    assert not facts.template_lookups
    from vnpu_operator.config import PolicyName  # the Literal itself, imported

    assert facts.policies == PolicyName.__args__
    assert facts.plugin_writes  # kubectl vnpu cordon patches the VNPUNode


# The statements issue 56 found contradicting the code, as they were written: each
# must be caught if it comes back.
FIXED = [
    (
        "docs/HELM.md",
        "the operator Deployment (1 replica, `Recreate`, probes on",
    ),
    (
        "docs/UPGRADING.md",
        "- **Operator.** One replica with the `Recreate` strategy: the old pod",
    ),
    (
        "docs/DECISIONS.md",
        "peering writes a heartbeat); one replica with the\n  Recreate strategy is the HA story.",
    ),
    (
        "docs/HELM.md",
        "The chart never calls `lookup`; two options ask which APIs the cluster serves",
    ),
    (
        "docs/DECISIONS.md",
        'no matches for kind ValidatingAdmissionPolicy". No template uses '
        "`lookup` or Capabilities.",
    ),
    (
        "README.md",
        "`kubectl vnpu` is the read-only kubectl plugin the package installs",
    ),
    (
        "docs/HELM.md",
        "projected token of a pod bound to a node carries "
        "(ServiceAccountTokenPodNodeInfo, on by\ndefault since 1.32; tokens",
    ),
    (
        "docs/HELM.md",
        "ValidatingAdmissionPolicy; >= 1.32 for the node-name claim in pod tokens, see below).",
    ),
    (
        "docs/TROUBLESHOOTING.md",
        "  without the node-name claim (Kubernetes before 1.32, or a token not bound",
    ),
    (
        "README.md",
        "- Kubernetes 1.32 or later for the annotation path (this page); tested on 1.34",
    ),
    (
        "docs/USAGE.md",
        "- **Everywhere else** (Kubernetes 1.32 to 1.35, DRA off, a template only annotation",
    ),
    (
        "docs/HELM.md",
        "the `helm uninstall` pre-delete hook (see\nUninstall); optionally a "
        "ServiceMonitor and a\nPodDisruptionBudget.",
    ),
    (
        "docs/HELM.md",
        "| `operator.policy` | `binpack` | placement: `binpack` or `spread` |",
    ),
    (
        "docs/HELM.md",
        "ValidatingAdmissionPolicy that scopes each agent to its node and the "
        "three that keep what the\noperator decided to the operator",
    ),
    (
        "SECURITY.md",
        "only pods with the `vnpu.io/template` annotation reach them (a "
        "match\ncondition), on CREATE only.",
    ),
    (
        "docs/TROUBLESHOOTING.md",
        "Every pod with `vnpu.io/template` goes through the operator's admission\nwebhooks",
    ),
    (
        "SECURITY.md",
        "could name another pod's vNPU ids. It also refuses `vnpu.io/*` "
        "resource\n  requests on pods that ask for no vNPUs.",
    ),
]


@pytest.mark.parametrize(("doc", "statement"), FIXED, ids=[f"{d}:{s[:40]}" for d, s in FIXED])
def test_a_fixed_statement_that_comes_back_is_caught(doc: str, statement: str) -> None:
    text = (ROOT / doc).read_text() + "\n\n" + statement + "\n"
    found = claim_problems(text, chart_facts())
    assert found, f"{statement!r} in {doc} would pass"
    assert found[-1][0] > len((ROOT / doc).read_text().splitlines()), found


MOVED_FIGURES = [
    (
        "docs/HELM.md",
        "plane): 2.5 to 2.6 ms of API server CPU per pod lifecycle, about 8% of the 33 ms",
    ),
    (
        "docs/HELM.md",
        "| leader SIGKILLed 10 times | kill -> next placement p50 16.0 s, max 16.1 s |",
    ),
    (
        "SECURITY.md",
        "three runs each, alternating) was 64.9 ms before these protections and 62.7 ms after",
    ),
    (
        "README.md",
        "| p99 against the floor's; 16 cores Intel Xeon, 8 per run, 20 pods/s | 1.07x / 1.26x |",
    ),
    (
        "docs/DRA.md",
        "On 2 cores, a claim pod's created -> running p99 was 5.97 s against 0.56 s for",
    ),
    (
        "docs/HELM.md",
        "| operator / agents peak RSS | 136 / 134 MB |",
    ),
]


@pytest.mark.parametrize(("doc", "figure"), MOVED_FIGURES, ids=[d for d, _ in MOVED_FIGURES])
def test_a_figure_outside_performance_md_is_caught(doc: str, figure: str) -> None:
    assert figure_problems(figure), figure
    # ...and what these pages keep is no figure: thresholds, sizes, versions.
    assert not figure_problems("`draPrepareP99Seconds` (30); 12288 MB on a 310P3; a 5 s timeout")


def test_a_relative_document_path_in_the_notes_is_caught() -> None:
    found = notes_relative_paths(
        "(DRA, docs/DRA.md) and (SECURITY.md, Tenant isolation), but not\n"
        f"{DOCS_URL}docs/HELM.md#uninstall"
    )
    assert found == ["docs/DRA.md", "SECURITY.md"]


def test_a_default_given_in_prose_is_checked() -> None:
    facts = chart_facts()
    attempts = facts.values["operator"]["maxAttempts"]
    right = f"(`--max-attempts`, chart `operator.maxAttempts`, default {attempts})"
    wrong = f"(`--max-attempts`, chart `operator.maxAttempts`, default {attempts + 1})"
    assert claim_problems(right, facts) == []
    assert claim_problems(wrong, facts)
    # Switches as words, and a value in parentheses after its key.
    assert claim_problems("`criticalPodQuota.enabled`, default off", facts)
    timeout = facts.values["tests"]["timeoutSeconds"]
    assert claim_problems(f"for `tests.timeoutSeconds` ({timeout + 30}) while", facts)
    assert claim_problems(f"for `tests.timeoutSeconds` ({timeout}) while", facts) == []
