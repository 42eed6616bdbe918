"""The trimmer hands freed heap back after growth, and only then."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from vnpu_common.process.memory import Trimmer, libc_trim, resident_mb


class FakeProcess:
    """A resident size the test moves, and a trim that brings it down to
    what is live."""

    def __init__(self, rss: float, live: float) -> None:
        self.size = rss
        self.live = live
        self.trims = 0

    def rss(self) -> float:
        return self.size

    def trim(self) -> None:
        self.trims += 1
        self.size = self.live


def test_no_trim_until_the_process_has_grown_by_the_threshold() -> None:
    proc = FakeProcess(rss=100, live=100)
    trimmer = Trimmer(grow_mb=16, rss=proc.rss, trim=proc.trim)
    proc.size = 115
    assert trimmer.check() is False
    assert proc.trims == 0
    proc.size, proc.live = 130, 104
    assert trimmer.check() is True
    assert proc.trims == 1
    # Growth now counts from what the trim left.
    assert trimmer.baseline == 104
    proc.size = 118
    assert trimmer.check() is False
    proc.size = 121
    assert trimmer.check() is True
    assert trimmer.trims == 2


def test_a_process_that_shrank_counts_growth_from_its_new_size() -> None:
    proc = FakeProcess(rss=200, live=90)
    trimmer = Trimmer(grow_mb=16, rss=proc.rss, trim=proc.trim)
    proc.size = 90
    assert trimmer.check() is False
    proc.size = 107
    assert trimmer.check() is True


def test_without_malloc_trim_nothing_is_called() -> None:
    sizes = iter([100.0, 500.0])
    trimmer = Trimmer(grow_mb=16, rss=lambda: next(sizes), trim=None)
    assert trimmer.check() is False
    assert trimmer.trims == 0


def test_resident_size_is_this_processes() -> None:
    before = resident_mb()
    block = b"x" * (64 * 2**20)  # written, so resident
    assert resident_mb() - before > 48
    del block


def test_glibc_trim_returns_a_freed_hole_to_the_system() -> None:
    # In a fresh interpreter: 200 MB of 8 KB blocks (malloc's heap, below its
    # mmap threshold), then one block above them kept while they are freed:
    # glibc cannot shrink a heap below a live block, malloc_trim can.
    code = textwrap.dedent(
        """
        from vnpu_common.process.memory import libc_trim, resident_mb
        blocks = [bytearray(b"x" * 8000) for _ in range(25_000)]
        keep = bytearray(b"y" * 8000)
        del blocks
        held = resident_mb()
        libc_trim()()
        print(held, resident_mb())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    held, trimmed = float(out[0]), float(out[1])
    assert held - trimmed > 100, (held, trimmed)


def test_this_machine_has_malloc_trim() -> None:
    # The images and CI run on glibc; a None here would mean no trimming there.
    assert libc_trim() is not None
