"""Giving memory freed after a burst back to the system.

A burst (a thousand pods admitted and placed, a thousand nodes listed) leaves
glibc's heap with many free pages between live objects. glibc returns only
the top of the heap on its own, so the process keeps its peak size for good:
at 1000 nodes the operator held 50 MB more than it used after one fill
(docs/DECISIONS.md, 'Cost per pod and per event'). `malloc_trim(0)` hands every free
page back; it walks the heap (tens of milliseconds at 300 MB), so it runs
only when the resident size has grown by `grow_mb` since the last trim, at
most once per `interval` seconds.

Where the C library has no `malloc_trim` (musl), nothing is trimmed.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_mb() -> float:
    """This process's resident set size, MB (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def libc_trim() -> Callable[[], None] | None:
    """glibc's malloc_trim(0), or None where the C library lacks it."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def call() -> None:
        trim(0)

    return call


class Trimmer:
    def __init__(
        self,
        *,
        grow_mb: float = 16.0,
        interval: float = 5.0,
        rss: Callable[[], float] = resident_mb,
        trim: Callable[[], None] | None = None,
    ) -> None:
        self.grow_mb = grow_mb
        self.interval = interval
        self.rss = rss
        self.trim = trim
        self.baseline = rss()
        self.trims = 0

    def check(self) -> bool:
        """Trims if the process grew past the baseline; True if it did."""
        if self.trim is None:
            return False
        now = self.rss()
        if now < self.baseline:
            # Shrunk on its own: growth is counted from here.
            self.baseline = now
            return False
        if now - self.baseline < self.grow_mb:
            return False
        self.trim()
        self.trims += 1
        self.baseline = self.rss()
        log.debug("memory trimmed: %.0f MB -> %.0f MB", now, self.baseline)
        return True

    async def run(self) -> None:
        """Checks every `interval` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.check()
            except Exception:  # a failed trim must not stop the component
                log.exception("memory trim failed")


def trimmer() -> Trimmer:
    """A trimmer on this process with glibc's malloc_trim, where there is one."""
    return Trimmer(trim=libc_trim())
