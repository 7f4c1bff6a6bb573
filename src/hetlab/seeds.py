"""Seed and episode lists on the command line, one syntax everywhere: "A-B" (inclusive), "N", or a
comma-separated list of those in increasing order ("0-3,7,10-12")."""

from __future__ import annotations

import re

from hetlab.errors import UserError

ITEM = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")


def parse_seeds(text: str, option: str = "--seeds") -> list[int]:
    """The numbers `text` names; empty, negative, reversed or out-of-order lists are refused."""
    items = [ITEM.fullmatch(part) for part in text.split(",")]
    if not text.strip() or not all(items):
        raise UserError(f"{option} takes a range A-B (e.g. 2000-2049), one number, or a comma-separated list of "
                        f"those in increasing order (e.g. 0-3,7), got {text!r}")
    seeds = []
    for item in items:
        first, last = int(item[1]), int(item[2] if item[2] is not None else item[1])
        if last < first:
            raise UserError(f"{option} {text}: the range {first}-{last} ends before it starts; write A-B with A <= B")
        seeds.extend(range(first, last + 1))
    if any(b <= a for a, b in zip(seeds, seeds[1:])):
        raise UserError(f"{option} {text}: list the seeds once each, in increasing order")
    return seeds
