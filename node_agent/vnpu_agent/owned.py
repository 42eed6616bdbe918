"""The vNPU ids an agent created, kept on disk so that a restarted agent
still knows which vNPUs are its own (the driver cannot say who made one).

The id is recorded *before* the create call and dropped only after a
destroy, so a crash between the two steps can only make the agent think it
owns a vNPU that does not exist, never the reverse.

On disk: a snapshot (`owned.json`, a JSON list, written atomically) and a
journal next to it (`owned.json.log`, one `+id` or `-id` line per change,
appended). Rewriting the snapshot on every change (mkdir, write, rename)
was a quarter of the agent's time at 200 nodes; an append is one write on a
file kept open. The journal is folded into the snapshot when the agent
starts and whenever it grows past `COMPACT_AFTER` lines. A line cut short by
a crash is ignored: its change was never acted on, since the create or
destroy it announces starts only after the append returned.
"""

from __future__ import annotations

import json
import os
from io import TextIOWrapper
from pathlib import Path

COMPACT_AFTER = 1000


class OwnedIds:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.journal_path = path.with_name(path.name + ".log")
        self._ids: set[int] = set()
        if path.exists():
            try:
                self._ids = {int(i) for i in json.loads(path.read_text())}
            except (ValueError, TypeError) as exc:
                raise ValueError(f"corrupt agent state {path}: {exc}") from exc
        if self.journal_path.exists():
            # The last piece lacks its newline when a crash cut it: dropped.
            for line in self.journal_path.read_text().split("\n")[:-1]:
                self._replay(line)
        self._journal: TextIOWrapper | None = None
        self._lines = 0
        self._compact()

    def _replay(self, line: str) -> None:
        sign, digits = line[:1], line[1:]
        if sign not in ("+", "-") or not digits.isdigit():
            return  # cut short by a crash, never acted on
        if sign == "+":
            self._ids.add(int(digits))
        else:
            self._ids.discard(int(digits))

    def __contains__(self, vnpu_id: object) -> bool:
        return vnpu_id in self._ids

    def snapshot(self) -> set[int]:
        return set(self._ids)

    def add(self, vnpu_id: int) -> None:
        if vnpu_id not in self._ids:
            self._ids.add(vnpu_id)
            self._append(f"+{vnpu_id}\n")

    def discard(self, vnpu_id: int) -> None:
        if vnpu_id in self._ids:
            self._ids.discard(vnpu_id)
            self._append(f"-{vnpu_id}\n")

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    def _append(self, line: str) -> None:
        if self._journal is None:
            self._journal = self.journal_path.open("a", encoding="ascii")
        self._journal.write(line)
        self._journal.flush()
        self._lines += 1
        if self._lines >= COMPACT_AFTER:
            self._compact()

    def _compact(self) -> None:
        """The snapshot holds every change; the journal starts empty."""
        self.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(sorted(self._ids)))
        os.replace(tmp, self.path)
        # Only after the snapshot is in place: a crash in between replays
        # the journal's changes onto a snapshot that already has them.
        self.journal_path.unlink(missing_ok=True)
        self._lines = 0
