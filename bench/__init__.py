"""Scale benchmark: `make bench` / `make bench-quick` (see bench/run.py)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _sub in ("common", "operator", "node_agent", "hack"):
    if str(ROOT / _sub) not in sys.path:
        sys.path.insert(0, str(ROOT / _sub))
