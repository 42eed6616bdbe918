"""What the release tests share: the verify command of docs/RELEASING.md, run as a
user would, in a release's directory."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from release import sign

ROOT = Path(__file__).resolve().parents[2]


def verify_command() -> str:
    """The shell block under docs/RELEASING.md's verify-command marker."""
    text = (ROOT / "docs" / "RELEASING.md").read_text()
    match = re.search(r"<!-- verify-command:[^>]*-->\n```sh\n(.*?)```", text, re.S)
    assert match, "docs/RELEASING.md has no verify-command block"
    return match.group(1)


def run_verify(directory: Path) -> subprocess.CompletedProcess[str]:
    """The documented command in `directory`, with the pinned cosign on PATH and
    nothing of the source tree."""
    cosign = sign.cosign_binary()
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", verify_command()],
        cwd=directory,
        capture_output=True,
        text=True,
        env={"PATH": f"{cosign.parent}:/usr/bin:/bin", "HOME": str(directory)},
        check=False,
    )
