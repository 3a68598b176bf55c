"""Sets of ranks written as text: ``"0-63,4096"`` (ascending ranges and single ranks)."""

from __future__ import annotations

from typing import Iterable

from .errors import UsageError


def parse_ranks(text: str, world_size: int, flag: str = "--ranks") -> list[int]:
    """The ranks ``text`` names, ascending and distinct; each must be in 0..world_size-1."""
    ranks: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise UsageError(f"{flag} {text}: {part.strip()!r} is not a rank or a range like 0-63; "
                             f"give ranks and ranges joined by commas, e.g. 0-63,4096") from None
        if low < 0 or high < low:
            raise UsageError(f"{flag} {text}: {part.strip()!r} is not a rank or an ascending range of ranks")
        if high >= world_size:
            raise UsageError(f"{flag} {text}: rank {high} is outside the world (ranks 0-{world_size - 1})")
        ranks.update(range(low, high + 1))
    return sorted(ranks)


def ranks_text(ranks: Iterable[int]) -> str:
    """The shortest ``"a-b,c"`` text of ``ranks`` (ascending)."""
    parts: list[str] = []
    start = prev = None
    for r in sorted(set(ranks)):
        if prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = r
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)
