"""Integer resource quantities as the API server writes them."""

from __future__ import annotations

import re
from typing import Final

# Integer quantities as the API server writes them back (decimal suffixes for
# values we wrote, binary ones when a user wrote them).
_QUANTITY: Final = re.compile(r"^([0-9]+)(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_FACTOR: Final[dict[str | None, int]] = {
    None: 1,
    **{s: 1000**i for i, s in enumerate(("k", "M", "G", "T", "P", "E"), 1)},
    **{s: 1024**i for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), 1)},
}


def quantity_value(value: object) -> int | None:
    """An integer quantity ("4", "16k", "2Ki"), or None for anything else."""
    match = _QUANTITY.match(value) if isinstance(value, str) else None
    if match is None:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return None
    return int(match.group(1)) * _FACTOR[match.group(2)]
