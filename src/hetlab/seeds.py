"""Seed lists on the command line: "A-B" (inclusive), "N", or "a,b,c" in increasing order."""

from __future__ import annotations

import re

from hetlab.errors import UserError


def parse_seeds(text: str, option: str = "--seeds") -> list[int]:
    """The seeds `text` names; empty, negative or out-of-order lists are refused."""
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    if match:
        first, last = int(match[1]), int(match[2])
        if last < first:
            raise UserError(f"{option} {text}: the range ends before it starts; write A-B with A <= B")
        return list(range(first, last + 1))
    parts = [part.strip() for part in text.split(",")]
    if not text.strip() or not all(re.fullmatch(r"\d+", part) for part in parts):
        raise UserError(f"{option} takes a range A-B (e.g. 2000-2299), one seed, or a list a,b,c of "
                        f"non-negative integers, got {text!r}")
    seeds = [int(part) for part in parts]
    if any(b <= a for a, b in zip(seeds, seeds[1:])):
        raise UserError(f"{option} {text}: list the seeds once each, in increasing order")
    return seeds
