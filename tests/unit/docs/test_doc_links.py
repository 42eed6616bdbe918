"""Every relative link in the project's documents resolves: the file exists and,
where the link names a #fragment, a heading of that file makes that anchor as
GitHub renders it. External links (http, mailto) are not followed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCUMENTS = sorted(
    {
        *(ROOT / name for name in ("README.md", "CHANGELOG.md", "CONTRIBUTING.md", "SECURITY.md")),
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "bench").rglob("README.md"),
    }
)

_FENCE = re.compile(r"^(```|~~~)")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) or [text](target "title"); images (![alt](src)) are links too.
_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def _prose_lines(text: str) -> Iterator[str]:
    """Lines outside fenced code blocks, inline code removed (a link inside
    either is not a link)."""
    fence: str | None = None
    for line in text.splitlines():
        opened = _FENCE.match(line.strip())
        if opened:
            if fence is None:
                fence = opened.group(1)
            elif line.strip().startswith(fence):
                fence = None
            continue
        if fence is None:
            yield _INLINE_CODE.sub("", line)


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: its text (code and link markup dropped),
    lower case, punctuation other than '-' and '_' removed, spaces as '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of the file's headings; a repeated heading gets -1, -2, ..."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in _prose_lines(path.read_text()):
        match = _HEADING.match(line)
        if not match:
            continue
        base = github_anchor(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(path: Path) -> Iterator[str]:
    for line in _prose_lines(path.read_text()):
        yield from _LINK.findall(line)


def broken_links(path: Path) -> list[str]:
    problems = []
    for target in links(path):
        if _EXTERNAL.match(target):
            continue
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{target}: no file {os.path.relpath(dest, ROOT)}")
            continue
        if fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            problems.append(f"{target}: no heading makes #{fragment} in {dest.name}")
    return problems


def test_the_documents_exist() -> None:
    # A renamed or deleted document would otherwise drop out of the check unnoticed.
    for path in DOCUMENTS:
        assert path.is_file(), path


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    assert broken_links(path) == []


def test_anchor_rules_match_githubs() -> None:
    assert github_anchor("Quota: extended resources the webhook charges (issue 15, item 1)") == (
        "quota-extended-resources-the-webhook-charges-issue-15-item-1"
    )
    assert github_anchor("`kubectl vnpu why` says nothing") == "kubectl-vnpu-why-says-nothing"
    assert github_anchor("Pods or allocations stuck Terminating") == (
        "pods-or-allocations-stuck-terminating"
    )


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    # The checker itself: a missing file and a missing anchor are both reported,
    # links in code are not links, and a repeated heading gets a numbered anchor.
    doc = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# Title\n\n## Same\n\n## Same\n")
    doc.write_text(
        "[ok](b.md#same-1) [ok](#here) [gone](c.md) [bad](b.md#nothing)\n"
        "`[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n# Here\n"
        "[web](https://example.com/x.md)\n"
    )
    problems = broken_links(doc)
    assert len(problems) == 2, problems
    assert problems[0].startswith("c.md: no file")
    assert problems[1] == "b.md#nothing: no heading makes #nothing in b.md"
