"""python -m chartdocs [--check] CHART_DIR: writes CHART_DIR/README.md, or with
--check fails when it is not what the chart's values and schema make."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chartdocs import UndocumentedValueError, render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chartdocs", description=__doc__)
    parser.add_argument("chart", type=Path, help="the chart directory")
    parser.add_argument("--check", action="store_true", help="fail if README.md is stale")
    args = parser.parse_args(argv)
    readme: Path = args.chart / "README.md"
    try:
        text = render(args.chart)
    except (UndocumentedValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.check:
        if not readme.exists() or readme.read_text() != text:
            print(f"{readme} is stale; run `make chart-docs`", file=sys.stderr)
            return 1
        return 0
    readme.write_text(text)
    print(f"wrote {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
