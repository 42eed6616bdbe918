"""Runs one command in a root filesystem, as a container build's RUN does (`rw`) or as a
runtime starts the finished image with a read-only root filesystem (`ro`).

build.py starts it inside `unshare --mount --propagation private`: every mount made here
belongs to that private mount namespace and vanishes with it, so nothing stays mounted
inside a root that is about to be removed, even when a build is killed. /dev is a fresh
tmpfs holding only the usual character devices (bound from the host), never the host's
/dev itself: a RUN that removes /dev/null removes nothing of the host's.

    python3 hack/image/chroot.py '<json spec>'   (root, inside the private mount namespace)

spec: root, workdir, user ("uid:gid", numeric), mode ("rw" | "ro"), env (the image's),
argv, binds ([[host_file, path_in_root], ...], read-only), stdin (a host file or null).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def _setup(root: Path, mode: str, binds: list[list[str]]) -> list[Path]:
    """Mounts what a container gets; returns the bind targets it had to create."""
    stubs: list[Path] = []
    for _host, inside in binds:
        target = root / inside.lstrip("/")
        if not target.exists():
            if mode == "ro":
                raise SystemExit(f"chroot: cannot create {inside} in a read-only root")
            target.touch()
            stubs.append(target)
    if mode == "ro":
        _mount("--bind", str(root), str(root))
        _mount("-o", "remount,bind,ro", str(root))
    _mount("-t", "proc", "-o", "nosuid,nodev,noexec", "proc", str(root / "proc"))
    dev = root / "dev"
    _mount("-t", "tmpfs", "-o", "mode=755,nosuid,size=1m", "vnpu-dev", str(dev))
    for name in DEVICES:
        (dev / name).touch()
        _mount("--bind", f"/dev/{name}", str(dev / name))
    for name, link in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        (dev / name).symlink_to(link)
    (dev / "shm").mkdir()
    _mount("-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "vnpu-shm", str(dev / "shm"))
    for host, inside in binds:
        target = root / inside.lstrip("/")
        _mount("--bind", host, str(target))
        _mount("-o", "remount,bind,ro", str(target))
    return stubs


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    root = Path(spec["root"])
    uid, _, gid = spec["user"].partition(":")
    if not uid.isdigit() or not (gid or "0").isdigit():
        raise SystemExit(f"chroot: user {spec['user']!r} must be numeric uid[:gid]")
    binds: list[list[str]] = spec.get("binds", [])
    stubs = _setup(root, spec["mode"], binds)
    workdir = spec["workdir"]

    def enter() -> None:
        os.chroot(root)
        os.chdir(workdir)
        os.setgroups([])
        os.setgid(int(gid or "0"))
        os.setuid(int(uid))

    stdin = open(spec["stdin"], "rb") if spec.get("stdin") else None  # noqa: SIM115
    try:
        # The program is looked up in the image's PATH, inside the root (execve after chroot).
        rc = subprocess.call(
            spec["argv"], env=spec["env"], stdin=stdin or subprocess.DEVNULL, preexec_fn=enter
        )
    except FileNotFoundError:
        print(f"chroot: {spec['argv'][0]}: not found in the image's PATH", file=sys.stderr)
        rc = 127
    finally:
        if stdin is not None:
            stdin.close()
    # A bind target can be removed only once nothing is mounted on it.
    for stub in stubs:
        subprocess.run(["umount", str(stub)], check=True)
        stub.unlink()
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
