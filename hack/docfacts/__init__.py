"""Statements of fact the documents make about the chart and the code, checked against
the chart and the code (tests/unit/docs/test_doc_facts.py; issue 56, item 5).

A fact is read once, from where it is true: the operator's replicas from values.yaml,
its rollout strategy from the Deployment template, which files call `lookup` from the
templates, the Kubernetes floor from Chart.yaml's `kubeVersion` and DRA's from the
template that refuses older clusters, the placement policies from the operator's
settings, the protection policies from their templates, whether `kubectl vnpu` writes
from the plugin's API calls. A document's sentence that states such a fact is found by
a pattern (`CLAIMS`) and compared with it, so a sentence that drifts, or comes back after
a fix, fails the test with its file and line. tests/integration/test_chart_helm4.py
checks the facts read here against the rendered chart.

Benchmark figures (`FIGURE_PATTERNS`) live in docs/PERFORMANCE.md only, and the release
notes (NOTES.txt) link to documents by URL, since a packaged chart has no docs/.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "vnpu-operator"
TEMPLATES = CHART / "templates"
DOCS_URL = "https://github.com/vnpu-operator/vnpu-operator/blob/main/"

# A Kubernetes fact no file of ours can hold: ServiceAccountTokenPodNodeInfo (the
# `authentication.kubernetes.io/node-name` extra of a pod's token, which node scoping
# reads) is beta and on by default from 1.30, GA in 1.32 (KEP-4193).
NODE_NAME_CLAIM_DEFAULT_ON = "1.30"

# The documents the claims are checked in; CHANGELOG records what was true then.
DOCUMENTS = (
    "README.md",
    "SECURITY.md",
    "CONTRIBUTING.md",
    "hack/README.md",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
)
# Measurements belong to PERFORMANCE.md; DECISIONS.md links to them rather than quoting
# them (issue 57), so no other document is exempt.
FIGURE_EXEMPT = ("docs/PERFORMANCE.md",)
# The pages' size caps (issue 57): a decision is its choice, alternatives, why and a link;
# the performance page holds the current figures, the history is bench/runs/README.md's.
LINE_CAPS = {"docs/DECISIONS.md": 900, "docs/PERFORMANCE.md": 250}


@dataclass(frozen=True)
class Facts:
    operator_replicas: int
    operator_strategy: str
    operator_max_surge: str
    operator_max_unavailable: str
    pdb_by_default: bool
    template_lookups: tuple[str, ...]
    notes_lookup: bool
    templates_read_capabilities: bool
    kube_floor: str
    dra_floor: str
    node_name_claim: str
    policies: tuple[str, ...]
    protection_policies: int
    plugin_writes: bool
    webhook_matches_resources: bool
    device_protection_allows_templates: bool
    values: dict[str, Any]


_TEMPLATE_COMMENT = re.compile(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}", re.DOTALL)


def _template_code(path: Path) -> str:
    """A template's text without its {{/* comments */}} and YAML comment lines."""
    text = _TEMPLATE_COMMENT.sub("", path.read_text())
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def _minor(constraint: str) -> str:
    match = re.search(r"(\d+)\.(\d+)", constraint)
    assert match, constraint
    return f"{match.group(1)}.{match.group(2)}"


def _policies() -> tuple[str, ...]:
    """The values of the operator's PolicyName (operator/vnpu_operator/config.py), read
    with ast: importing the operator here would tie the test bed to its dependencies."""
    tree = ast.parse((ROOT / "operator" / "vnpu_operator" / "config.py").read_text())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "PolicyName" for t in node.targets)
            and isinstance(node.value, ast.Subscript)
        ):
            inner = node.value.slice
            elements = inner.elts if isinstance(inner, ast.Tuple) else [inner]
            return tuple(
                e.value
                for e in elements
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            )
    raise AssertionError("no PolicyName in operator/vnpu_operator/config.py")


def _plugin_writes() -> bool:
    """Whether `kubectl vnpu` sends any write: a patch, create, replace or delete call."""
    text = "\n".join(p.read_text() for p in (ROOT / "cli" / "vnpu_cli").glob("*.py"))
    return bool(re.search(r"\.(patch|create|replace|delete)_\w+\(", text))


@cache
def chart_facts() -> Facts:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    # The Deployment's spec.strategy block, as written (a template is not YAML until
    # rendered; the integration test compares this with the render).
    block = re.search(
        r"^  strategy:\n((?:    .*\n)+)",
        _template_code(TEMPLATES / "operator-deployment.yaml"),
        re.M,
    )
    assert block, "templates/operator-deployment.yaml: no spec.strategy"
    strategy = yaml.safe_load(block.group(1).replace("    ", "", 1).replace("\n    ", "\n"))
    rolling = strategy.get("rollingUpdate") or {}
    templates = sorted(p for p in TEMPLATES.rglob("*") if p.suffix in (".yaml", ".tpl"))
    codes = {str(p.relative_to(CHART)): _template_code(p) for p in templates}
    services = codes["templates/operator-services.yaml"]
    pdb_guard = re.search(r"\{\{-? if (.*?)\}\}\s*---\s*apiVersion: policy/v1", services, re.S)
    assert pdb_guard, "templates/operator-services.yaml: no guarded PodDisruptionBudget"
    pdb = values["operator"]["podDisruptionBudget"]["enabled"] and (
        "gt (int .Values.operator.replicas) 1" not in pdb_guard.group(1)
        or values["operator"]["replicas"] > 1
    )
    dra = re.search(r'semverCompare "<(\d+\.\d+)', codes["templates/_helpers.tpl"])
    assert dra, "templates/_helpers.tpl: no Kubernetes floor for DRA"
    protection = {
        name
        for path in TEMPLATES.glob("protection*.yaml")
        for name in re.findall(
            r"kind: ValidatingAdmissionPolicy\n(?:.*\n){0,3}?\s*name: .*?(-[a-z]+-protection)",
            _template_code(path),
        )
    }
    webhooks = codes["templates/webhook-configurations.yaml"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return Facts(
        operator_replicas=int(values["operator"]["replicas"]),
        operator_strategy=str(strategy["type"]),
        operator_max_surge=str(rolling.get("maxSurge")),
        operator_max_unavailable=str(rolling.get("maxUnavailable")),
        pdb_by_default=bool(pdb),
        template_lookups=tuple(n for n, c in codes.items() if re.search(r"\blookup\b", c)),
        notes_lookup=bool(re.search(r"\blookup\b", _template_code(TEMPLATES / "NOTES.txt"))),
        templates_read_capabilities=any(".Capabilities" in c for c in codes.values()),
        kube_floor=_minor(str(chart["kubeVersion"])),
        dra_floor=dra.group(1),
        node_name_claim=NODE_NAME_CLAIM_DEFAULT_ON,
        policies=_policies(),
        protection_policies=len(protection),
        plugin_writes=_plugin_writes(),
        webhook_matches_resources="resources.?limits" in webhooks,
        device_protection_allows_templates="!k.matches(" in codes["templates/protection.yaml"],
        values=values,
    )


# ---------------------------------------------------------------- the documents' prose

_FENCE = re.compile(r"^\s*(```|~~~)")


def units(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, text) of each paragraph, list item and table row outside
    fenced code, its lines joined by single spaces (a sentence may wrap anywhere)."""
    fence = False
    start, lines = 0, []  # type: int, list[str]

    def flush() -> Iterator[tuple[int, str]]:
        if lines:
            yield start, " ".join(s.strip() for s in lines)

    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            yield from flush()
            lines = []
            fence = not fence
            continue
        stripped = line.strip()
        new_unit = (
            not stripped
            or stripped.startswith(("|", "- ", "* ", "#"))
            or bool(re.match(r"\d+\. ", stripped))
        )
        if fence or new_unit:
            yield from flush()
            lines = []
        if fence or not stripped:
            continue
        if not lines:
            start = number
        lines.append(line)
        if stripped.startswith(("|", "#")):
            yield from flush()
            lines = []
    yield from flush()


_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4}


def _number(word: str) -> int:
    return _WORDS[word.lower()] if word.lower() in _WORDS else int(word)


Check = Callable[[dict[str, str], Facts], str | None]


@dataclass(frozen=True)
class Claim:
    """A kind of statement: `pattern` finds it, `check` says what is wrong with it,
    given the statement's named groups (`0`: the whole statement)."""

    name: str
    pattern: re.Pattern[str]
    check: Check


def _replicas(m: dict[str, str], f: Facts) -> str | None:
    said = _number(m["n"])
    if said != f.operator_replicas:
        have = f.operator_replicas
        return f"says {said} operator replica(s); values.yaml operator.replicas is {have}"
    return None


def _strategy(m: dict[str, str], f: Facts) -> str | None:
    if m["s"] != f.operator_strategy:
        return f"names the operator's strategy {m['s']}; the Deployment's is {f.operator_strategy}"
    return None


def _surge(m: dict[str, str], f: Facts) -> str | None:
    said = (m["surge"], m["unavail"])
    have = (f.operator_max_surge, f.operator_max_unavailable)
    if said != have:
        return f"says maxSurge {said[0]}, maxUnavailable {said[1]}; the Deployment has {have}"
    return None


def _never_lookup(m: dict[str, str], f: Facts) -> str | None:
    if f.template_lookups or f.notes_lookup:
        where = [*f.template_lookups, *(["templates/NOTES.txt"] if f.notes_lookup else [])]
        return f"says the chart never calls lookup; {', '.join(where)} does"
    return None


def _no_template_lookup(m: dict[str, str], f: Facts) -> str | None:
    if f.template_lookups:
        return f"says no template calls lookup; {', '.join(f.template_lookups)} does"
    if "Capabilities" in m["0"] and f.templates_read_capabilities:
        return "says no template reads .Capabilities; the templates do"
    return None


def _read_only_plugin(m: dict[str, str], f: Facts) -> str | None:
    if f.plugin_writes:
        return "calls kubectl vnpu read-only; cordon and uncordon patch VNPUNodes"
    return None


def _node_name_version(m: dict[str, str], f: Facts) -> str | None:
    if m["v"] != f.node_name_claim:
        return (
            f"dates the node-name claim to {m['v']}; it is on by default from {f.node_name_claim}"
        )
    return None


def _kube_floor(m: dict[str, str], f: Facts) -> str | None:
    if m["v"] != f.kube_floor:
        return (
            f"names Kubernetes {m['v']} as the floor; Chart.yaml's kubeVersion is >= {f.kube_floor}"
        )
    return None


def _dra_floor(m: dict[str, str], f: Facts) -> str | None:
    if m["v"] != f.dra_floor:
        return f"names Kubernetes {m['v']} for DRA; the chart refuses below {f.dra_floor}"
    return None


def _policy_list(m: dict[str, str], f: Facts) -> str | None:
    said = tuple(re.findall(r"`(\w+)`", m["0"]))
    if sorted(said) != sorted(f.policies):
        return f"lists the placement policies {said}; the operator has {f.policies}"
    return None


def _protection_count(m: dict[str, str], f: Facts) -> str | None:
    said = _number(m["n"])
    if said != f.protection_policies:
        have = f.protection_policies
        return f"counts {said} protection policies; templates/protection*.yaml have {have}"
    return None


def _pdb_optional(m: dict[str, str], f: Facts) -> str | None:
    if f.pdb_by_default:
        return "calls the PodDisruptionBudget optional; the chart renders it by default"
    return None


def _annotation_only_webhook(m: dict[str, str], f: Facts) -> str | None:
    if f.webhook_matches_resources:
        return "says only annotated pods reach the webhooks; vnpu.io/<template> resources do too"
    return None


def _pattern(source: str) -> re.Pattern[str]:
    """`source` compiled, a repeated (?P<x>...) renamed x2, x3, ...: alternatives may
    each name what they capture the same way (`_groups` folds them back)."""
    seen: dict[str, int] = {}

    def rename(m: re.Match[str]) -> str:
        name = m.group(1)
        seen[name] = seen.get(name, 0) + 1
        return f"(?P<{name}{seen[name] if seen[name] > 1 else ''}>"

    return re.compile(re.sub(r"\(\?P<(\w+)>", rename, source))


def _vnpu_resources_refused(m: dict[str, str], f: Facts) -> str | None:
    if f.device_protection_allows_templates:
        return "says every vnpu.io/* request is refused; vnpu.io/<template> reaches the webhook"
    return None


def _prose_default(m: dict[str, str], f: Facts) -> str | None:
    """A number or switch a sentence gives as a value's default, against values.yaml
    (words such as "their ServiceAccount's" are not checked)."""
    known, value = _lookup(f.values, m["key"])
    said = {"on": "true", "off": "false"}.get(m["v"], m["v"])
    if not known or isinstance(value, dict | list | str) or value is None:
        return None
    if not re.fullmatch(r"-?\d+(?:\.\d+)?|true|false", said):
        return None
    if said != _shown(value):
        return f"gives {m['key']} the default {m['v']}; values.yaml has {_shown(value)}"
    return None


_VALUE_KEY = (
    r"`(?P<key>(?:operator|agent|webhook|metrics|protection|uninstall|tests|dra|crds"
    r"|nodeScoping|criticalPodQuota|tenantRead|apiServer|runtimeClass|image)\.[\w.]+)`"
)
_N = r"(?P<n>\d+|(?i:one|two|three|four))"
_V = r"(?P<v>1\.\d+)"
CLAIMS = (
    Claim(
        "operator replicas",
        _pattern(
            rf"operator Deployment \({_N} replicas?\b|[Tt]he operator runs {_N} replicas"
            rf"|\*\*Operator\*\* \(Deployment, {_N} replicas?\b|\bOperator\.\*\* {_N} replicas?\b"
            rf"|\b{_N} replicas? with the `?Recreate\b"
        ),
        _replicas,
    ),
    Claim(
        "operator strategy",
        # The strategy names as words: "Recreated" (an Event) is another word.
        _pattern(
            r"(?:operator|Deployment|replicas?)\b[^.]{0,80}?`?(?P<s>Recreate|RollingUpdate)\b`?"
            r"|`?(?P<s2>Recreate)`? (?:strategy|rollout)"
        ),
        _strategy,
    ),
    Claim(
        "operator rollout surge",
        _pattern(
            r"(?:Deployment|operator)[^.]{0,120}?`maxSurge: (?P<surge>[^`]+)`,? (?:and )?"
            r"`maxUnavailable: (?P<unavail>[^`]+)`"
        ),
        _surge,
    ),
    Claim(
        "the chart never calls lookup",
        _pattern(r"chart (?:never|does not|doesn't) (?:calls?|uses?) `lookup`"),
        _never_lookup,
    ),
    Claim(
        "no template calls lookup",
        _pattern(r"[Nn]o template (?:calls|uses) `lookup`(?: or `?\.?Capabilities`?)?"),
        _no_template_lookup,
    ),
    Claim(
        "a read-only kubectl plugin",
        _pattern(r"read-only kubectl plugin|`kubectl vnpu` is (?:a |the )?read-only"),
        _read_only_plugin,
    ),
    Claim(
        "node-name claim version",
        _pattern(
            rf"(?:node-name|NodeInfo)[^.]{{0,120}}?(?:on by\s+default since|default since) {_V}"
            rf"|>= {_V} for the node-name claim"
            rf"|node-name claim \(Kubernetes before {_V}"
            rf"|node-name claim[^.]{{0,60}}?dates to\s+{_V}"
        ),
        _node_name_version,
    ),
    Claim(
        "the annotation path's Kubernetes floor",
        _pattern(
            rf"Kubernetes {_V} or later for the annotation path"
            rf"|annotation path works from {_V}"
            rf"|Everywhere else\*\* \(Kubernetes {_V} to"
            rf"|Kubernetes >= {_V}:"
            rf"|Kubernetes {_V} or later\", not the chart's `kubeVersion`"
        ),
        _kube_floor,
    ),
    Claim(
        "DRA's Kubernetes floor",
        _pattern(rf"DRA[^.]{{0,80}}?need(?:s)? (?:Kubernetes )?{_V} or later"),
        _dra_floor,
    ),
    Claim(
        "the placement policies",
        _pattern(r"placement: `binpack`(?:, `\w+`)*(?: or `\w+`)?"),
        _policy_list,
    ),
    Claim(
        "the protection policies' count",
        _pattern(
            rf"\b{_N} ValidatingAdmissionPolicies, checked by the API server"
            rf"|\bthe {_N} that keep what the operator decided"
        ),
        _protection_count,
    ),
    Claim(
        "an optional PodDisruptionBudget",
        _pattern(r"optionally a [^.;]*PodDisruptionBudget"),
        _pdb_optional,
    ),
    Claim(
        "only annotated pods reach the webhooks",
        _pattern(
            r"only pods with the `vnpu\.io/template` annotation reach them"
            r"|Every pod with `vnpu\.io/template` goes through the operator's admission"
        ),
        _annotation_only_webhook,
    ),
    Claim(
        "a value's default in prose",
        _pattern(
            rf"{_VALUE_KEY}[^.;|`]{{0,40}}?\b(?:default|defaults to|by default)"
            rf"[ :,]+`?(?P<v>[\w.]+)`?"
            rf"|{_VALUE_KEY},? \((?P<v>[\w.]+)\)"
        ),
        _prose_default,
    ),
    Claim(
        "vnpu.io/* requests refused without an annotation",
        _pattern(r"refuses `vnpu\.io/\*` resource requests on pods that ask for no vNPUs\."),
        _vnpu_resources_refused,
    ),
)


def _groups(m: re.Match[str]) -> dict[str, str]:
    """The match's named groups, x2, x3 (renamed alternatives, `_renumber`) folded into
    x, and the whole match as `0`."""
    out = {"0": m.group(0)}
    for key, value in m.groupdict().items():
        if value is not None:
            out.setdefault(re.sub(r"\d+$", "", key), value)
    return out


def claim_problems(text: str, facts: Facts) -> list[tuple[int, str, str]]:
    """(line, claim, what is wrong) for each statement of `text` that a fact contradicts."""
    found = []
    for line, unit in units(text):
        for claim in CLAIMS:
            for m in claim.pattern.finditer(unit):
                why = claim.check(_groups(m), facts)
                if why:
                    found.append((line, claim.name, f"{why}: {m.group(0)!r}"))
    return found


# ---------------------------------------------------------------- HELM.md's values table

_ROW = re.compile(r"^\|\s*(?P<keys>`[^|]*`)\s*\|\s*(?P<defaults>[^|]*)\|")


def _lookup(values: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return '""'
    if isinstance(value, list):
        return "[" + ",".join(_shown(v) for v in value) + "]"
    return str(value)


def values_table_problems(text: str, values: dict[str, Any]) -> list[tuple[int, str, str]]:
    """A row of the values table (`key`, `key2` | `default`, `default2` | meaning) whose
    defaults are all given as code and one per key, against values.yaml. Keys may be
    given as `.rest` after a first `operator.leaderElection.leaseSeconds`."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        m = _ROW.match(line)
        if not m:
            continue
        keys = re.findall(r"`([^`]+)`", m.group("keys"))
        cell = m.group("defaults").strip()
        if not re.fullmatch(r"(?:`[^`]*`(?:, )?)+", cell):
            continue  # a default in words ("the catalog's 18 templates"): not checked
        defaults = re.findall(r"`([^`]*)`", cell)
        if len(keys) != len(defaults):
            continue
        prefix = ""
        for key, default in zip(keys, defaults, strict=True):
            if key.startswith("."):
                key = prefix + key
            else:
                prefix = key.rsplit(".", 1)[0]
            known, value = _lookup(values, key)
            if not known or isinstance(value, dict):
                continue  # a setting the table documents beyond values.yaml, or a group
            if default.replace(" ", "") != _shown(value).replace(" ", ""):
                found.append(
                    (
                        number,
                        "a value's default",
                        f"{key}: {default!r}, values.yaml {_shown(value)!r}",
                    )
                )
    return found


# ---------------------------------------------------------------- benchmark figures

_NUM = r"\d+(?:\.\d+)?"
FIGURE_PATTERNS = (
    re.compile(rf"\b{_NUM} ?(?:ms|pods/s|CPU-s)\b"),
    re.compile(rf"\bp(?:50|99)\b[^.|;]{{0,30}}?\b{_NUM} ?s\b|\b{_NUM} ?s at p(?:50|99)\b"),
    re.compile(rf"\bRSS\b[^.;]{{0,40}}?\b{_NUM} ?MB\b"),
)


def figure_problems(text: str) -> list[tuple[int, str, str]]:
    """Measured figures (milliseconds, pods per second, CPU seconds, p50/p99 seconds, RSS)
    in a document other than PERFORMANCE.md."""
    found = []
    for line, unit in units(text):
        for pattern in FIGURE_PATTERNS:
            m = pattern.search(unit)
            if m:
                found.append(
                    (line, "a benchmark figure", f"{m.group(0)!r} belongs in docs/PERFORMANCE.md")
                )
                break
    return found


# A figure in the wider sense: a decimal number with a unit of time, rate, size or share.
# Integers are left out: they are mostly settings and sizes (a 30 s interval, 4096 MB).
_REPEATABLE = re.compile(r"(?<![\w.])(\d+\.\d+) ?(ms|s|pods/s|MB|GiB|%|CPU-s|x)(?![\w/])")
# Values that are settings or goals, not measurements, which several pages must state:
# the leader's retry period and the freed -> placed goal.
REPEATABLE_SETTINGS = frozenset({"0.5 s"})


def repeated_figures(texts: dict[str, str]) -> dict[str, list[str]]:
    """Each figure (`_REPEATABLE`) that more than one of the documents states, with the
    documents: a figure is stated once, where it was measured, and linked from elsewhere."""
    where: dict[str, set[str]] = {}
    for doc, text in texts.items():
        for _, unit in units(text):
            for m in _REPEATABLE.finditer(unit):
                figure = f"{m.group(1)} {m.group(2)}"
                if figure not in REPEATABLE_SETTINGS:
                    where.setdefault(figure, set()).add(doc)
    return {f: sorted(docs) for f, docs in sorted(where.items()) if len(docs) > 1}


# ---------------------------------------------------------------- NOTES.txt

_DOC_PATH = re.compile(r"(?<![\w/.-])(?:[\w-]+/)*[\w-]+\.md\b")


def notes_relative_paths(text: str) -> list[str]:
    """Document paths in the release notes that are not part of a URL: a packaged chart
    has no docs/, so the notes link to the repository's pages."""
    bare = re.sub(r"https?://\S+", "", text)
    return _DOC_PATH.findall(bare)
