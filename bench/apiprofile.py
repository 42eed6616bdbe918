"""Where the API server's CPU goes during the churn (ours and the
logic-free floor's) and the fill's release, from its own profiler.

`python -m bench --apiserver-profile` takes back-to-back CPU profiles of
the kube-apiserver (`/debug/pprof/profile`, through kubectl with the
plane's admin kubeconfig) through each of those phases, keeps them in the
workdir as `<phase>-apiserver-<n>.pprof`, and reads them with
`go tool pprof -traces` where Go is installed. Each sample is charged to the first kind of work
its stack shows (`KINDS`, in order: the garbage collector's and the
watches' own goroutines first, then what a request's handling reached),
and the samples of custom resources are split by what the request did.
On 2 cores at 1000 nodes the release saturates the API server, and no
process of ours tells where its CPU goes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from collections import defaultdict
from pathlib import Path

# A profile's length: the release is read in these slices.
SLICE_SECONDS = 4

KINDS: tuple[tuple[str, str], ...] = (
    ("garbage collection", r"gcBgMarkWorker|bgsweep|bgscavenge"),
    ("watch fan-out", r"handleWatch|cacheWatcher|dispatchEvent|processEvent|watchCache"),
    ("etcd watch decoding", r"etcd3\.\(\*watchChan\)"),
    # The API server's only outgoing HTTP here is to webhooks: their
    # connections' goroutines (persistConn) count with the calls.
    ("admission webhooks", r"admission/plugin/webhook|persistConn"),
    ("Events' storage", r"registry/core/event"),
    ("custom resources", r"apiextensions-apiserver"),
    ("pods' storage", r"registry/core/pod"),
    ("client certificate verification", r"crypto/x509"),
    ("the audit log", r"apiserver/pkg/audit|WithAudit|plugin/pkg/audit"),
    ("admission", r"admission"),
    ("the rest of request handling", r"ServeHTTP|finishRequest|net/http"),
)
# What a custom resource's request did, by its handler.
CR_KINDS: tuple[tuple[str, str], ...] = (
    ("status write", r"StatusREST"),
    ("create", r"createHandler|Store\)\.Create"),
    ("delete", r"[Dd]elete"),
    ("patch", r"patchResource|PatchResource"),
    ("list", r"List"),
)
OTHER = "other"

_SEPARATOR = re.compile(r"^-+\+-+$", re.MULTILINE)
_WEIGHT = re.compile(r"^\s*([\d.]+)(ns|us|ms|s)\b")
_UNIT = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def samples(traces: str) -> list[tuple[float, str]]:
    """(CPU seconds, stack) of each trace `go tool pprof -traces` printed."""
    out: list[tuple[float, str]] = []
    for block in _SEPARATOR.split(traces)[1:]:
        lines = block.strip("\n").splitlines()
        if not lines:
            continue
        m = _WEIGHT.match(lines[0])
        if m is None:
            continue
        out.append((float(m.group(1)) * _UNIT[m.group(2)], "\n".join(lines)))
    return out


def _kind(stack: str, kinds: tuple[tuple[str, str], ...]) -> str:
    for name, pattern in kinds:
        if re.search(pattern, stack):
            return name
    return OTHER


def shares(traces: str) -> dict[str, object]:
    """The CPU seconds profiled, each kind's share of them, largest first,
    and the custom resources' share split by what their requests did."""
    total = 0.0
    by_kind: defaultdict[str, float] = defaultdict(float)
    by_cr: defaultdict[str, float] = defaultdict(float)
    for seconds, stack in samples(traces):
        total += seconds
        kind = _kind(stack, KINDS)
        by_kind[kind] += seconds
        if kind == "custom resources":
            by_cr[_kind(stack, CR_KINDS)] += seconds
    return {
        "cpu_seconds": round(total, 2),
        "shares": _largest_first(by_kind),
        "custom_resources": _largest_first(by_cr),
    }


def _largest_first(seconds: dict[str, float]) -> list[list[object]]:
    total = sum(seconds.values())
    if not total:
        return []
    ranked = sorted(seconds.items(), key=lambda kv: -kv[1])  # stable: ties keep their order
    return [[k, round(v / total, 3)] for k, v in ranked]


class ProfileLoop:
    """Back-to-back CPU profiles of the API server from `start` to `stop`."""

    def __init__(
        self, kubectl: str, kubeconfig: Path, workdir: Path, phase: str = "release"
    ) -> None:
        self.kubectl = kubectl
        self.phase = phase
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.files: list[Path] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="apiserver-profile", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            path = self.workdir / f"{self.phase}-apiserver-{n}.pprof"
            got = subprocess.run(
                [self.kubectl, f"--kubeconfig={self.kubeconfig}", "get", "--raw",
                 f"/debug/pprof/profile?seconds={SLICE_SECONDS}"],
                capture_output=True, check=False, timeout=SLICE_SECONDS + 60,
            )  # fmt: skip
            if got.returncode != 0 or not got.stdout:
                self.errors.append(got.stderr.decode(errors="replace").strip()[:300])
                return
            path.write_bytes(got.stdout)
            self.files.append(path)
            n += 1

    def stop(self) -> list[Path]:
        """Ends the loop once the profile being taken is in (at most one
        slice later) and returns the files."""
        self._stop.set()
        self._thread.join()
        return self.files


def read(apiserver: str, files: list[Path]) -> dict[str, object]:
    """The shares of `files`, or why there are none (no Go to read them)."""
    if not files:
        return {"error": "no profile was taken"}
    go = shutil.which("go")
    if go is None:
        return {"error": "go is not installed: the profiles stay in the workdir",
                "files": [str(f) for f in files]}  # fmt: skip
    got = subprocess.run(
        [go, "tool", "pprof", "-traces", apiserver, *map(str, files)],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    if got.returncode != 0:
        return {"error": got.stderr.strip()[:300]}
    return {**shares(got.stdout), "files": [str(f) for f in files]}


def main(argv: list[str] | None = None) -> int:
    """Reads profiles taken elsewhere (a lent machine without Go)."""
    import argparse

    from bench.report import apiserver_rows

    p = argparse.ArgumentParser(
        prog="python -m bench.apiprofile",
        description="where the API server's CPU went in the profiles given, by kind of work",
    )
    p.add_argument("apiserver", help="the kube-apiserver binary the profiles came from")
    p.add_argument("profiles", nargs="+", type=Path, help="<phase>-apiserver-<n>.pprof files")
    args = p.parse_args(argv)
    got = read(args.apiserver, args.profiles)
    for label, value in apiserver_rows(got):
        print(f"{label.strip()}: {value}")
    return 1 if "error" in got else 0


if __name__ == "__main__":
    raise SystemExit(main())
