"""`python -m vnpu_agent.drivers.sim --state F CMD` (cli.py)."""

from __future__ import annotations

from vnpu_agent.drivers.sim.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
