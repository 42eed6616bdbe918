"""The vNPU ids an agent created, kept on disk so that a restarted agent
still knows which vNPUs are its own (the driver cannot say who made one).

The id is recorded *before* the create call and dropped only after a
destroy, so a crash between the two steps can only make the agent think it
owns a vNPU that does not exist, never the reverse.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


class OwnedIds:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._ids: set[int] = set()
        if path.exists():
            try:
                self._ids = {int(i) for i in json.loads(path.read_text())}
            except (ValueError, TypeError) as exc:
                raise ValueError(f"corrupt agent state {path}: {exc}") from exc

    def __contains__(self, vnpu_id: object) -> bool:
        return vnpu_id in self._ids

    def snapshot(self) -> set[int]:
        return set(self._ids)

    def add(self, vnpu_id: int) -> None:
        if vnpu_id not in self._ids:
            self._ids.add(vnpu_id)
            self._save()

    def discard(self, vnpu_id: int) -> None:
        if vnpu_id in self._ids:
            self._ids.discard(vnpu_id)
            self._save()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(sorted(self._ids)))
        os.replace(tmp, self.path)
