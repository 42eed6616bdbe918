"""Where the components' CPU goes during the churn, sampled by py-spy.

`python -m bench --pyspy` runs `py-spy record --nonblocking` on the operator
and on every agent process for the churn's length and reads its raw output
(one line per distinct stack: `frame;frame;...;frame count`). py-spy reads
the processes' memory from outside and never stops them, so the figures of
the same run stay what they would be without it; cProfile, which traces every
call inside the process, about doubled the operator's CPU and shifted the
shares toward small Python functions (docs/DECISIONS.md, 'The benchmarks').

A function's share is inclusive: the fraction of samples in which it is on
the stack (counted once however deep it recurs). Samples whose innermost
frame is the event loop's own call (`run_until_complete`: uvloop's C code,
the TLS and socket work under it) are reported apart as `LOOP`.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

RATE = 200  # samples per second: enough for shares to a percent over a churn
LOOP = "event loop (C: uvloop, TLS, sockets)"
# The frames every sample of a thread shares (the process's entry points, and a worker
# thread's start, whose samples all show `_worker` of the executor as well).
_ROOTS = (
    "<module>", "_run_module_as_main", "_run_code", "main", "run", "Runner.run",
    "Thread._bootstrap", "Thread._bootstrap_inner", "Thread.run",
)  # fmt: skip

_FRAME = re.compile(r"^(?P<fn>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def frame_name(frame: str) -> str:
    """`fn (path/to/file.py:12)` -> `fn (package/file.py)`: the line dropped,
    the path cut to what follows site-packages or the repository's top."""
    m = _FRAME.match(frame)
    if m is None:
        return frame
    path = m.group("file")
    for cut in ("site-packages/", "/operator/", "/node_agent/", "/common/", "/lib/python"):
        if cut in path:
            path = path.split(cut, 1)[1]
            if cut == "/lib/python":
                path = path.split("/", 1)[-1]
            break
    return f"{m.group('fn')} ({path})"


@dataclass(frozen=True)
class Profile:
    samples: int
    # (function, inclusive share), largest first, the roots left out
    top: list[tuple[str, float]]
    loop_share: float

    def to_json(self) -> dict[str, object]:
        return {
            "samples": self.samples,
            "loop_share": round(self.loop_share, 4),
            "top": [[fn, round(share, 4)] for fn, share in self.top],
        }


def profile(raw: str, limit: int = 25) -> Profile:
    """The inclusive shares of py-spy's raw output (see the module's doc)."""
    inclusive: Counter[str] = Counter()
    total = loop = 0
    for line in raw.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        names = [frame_name(f) for f in stack.split(";")]
        if names[-1].startswith("Runner.run ") or names[-1].startswith("run_until_complete"):
            loop += n
        for name in set(names):
            inclusive[name] += n
    if not total:
        return Profile(samples=0, top=[], loop_share=0.0)
    top = [
        (name, n / total)
        for name, n in inclusive.most_common()
        if name.split(" (", 1)[0] not in _ROOTS
    ][:limit]
    return Profile(samples=total, top=top, loop_share=loop / total)


def pyspy() -> str:
    """The py-spy of this environment (the dev lock installs it)."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("--pyspy needs py-spy: run `make venv` (it is in the dev lock)")
    return found


class Sampler:
    """py-spy on each of `pids` ({process name: pid}) from `start` to `stop`."""

    def __init__(self, pids: Mapping[str, int], workdir: Path, phase: str = "") -> None:
        self.pids = dict(pids)
        self.workdir = workdir
        # Files of a later phase's sampling beside the churn's: `<phase>-<process>.pyspy.*`.
        self.prefix = f"{phase}-" if phase else ""
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []

    def _raw(self, name: str) -> Path:
        return self.workdir / f"{self.prefix}{name}.pyspy.txt"

    def start(self) -> None:
        exe = pyspy()
        for name, pid in self.pids.items():
            log = open(self.workdir / f"{self.prefix}{name}.pyspy.log", "wb")  # noqa: SIM115 (closed in stop)
            self._logs.append(log)
            self._procs[name] = subprocess.Popen(
                [exe, "record", "--pid", str(pid), "--rate", str(RATE), "--nonblocking",
                 "--format", "raw", "--output", str(self._raw(name))],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )  # fmt: skip

    def stop(self) -> dict[str, Profile]:
        """Ends the sampling (py-spy writes its output on SIGINT) and reads it."""
        for proc in self._procs.values():
            proc.send_signal(signal.SIGINT)
        out: dict[str, Profile] = {}
        for name, proc in self._procs.items():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raw = self._raw(name)
            out[name] = profile(raw.read_text() if raw.exists() else "")
        for log in self._logs:
            log.close()
        return out
