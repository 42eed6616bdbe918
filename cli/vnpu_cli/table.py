"""Plain text tables as kubectl prints them: upper-case headers, columns
padded to their widest cell and three spaces apart, no borders."""

from __future__ import annotations

from collections.abc import Sequence

NONE = "-"


def cell(value: object) -> str:
    """None (a field nobody reports) reads as '-', as kubectl prints it."""
    return NONE if value is None or value == "" else str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    texts = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in texts)]) for i, h in enumerate(headers)]
    lines = [
        "   ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip()
        for line in [list(headers), *texts]
    ]
    return "\n".join(lines) + "\n"


def triple(used: int, free: int, total: int) -> str:
    """A resource as used/free/total, the column the status table shows."""
    return f"{used}/{free}/{total}"
