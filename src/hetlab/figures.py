"""Whether a run draws its figures at its end: `reward.png` and `time_breakdown.png` of `hetlab train`,
Phase A's `loss.png`, Phase B's `timeline.png`.

They cost a launch one to two seconds (matplotlib's import and drawing), which adds up over a
sweep of short runs or a test suite: `HETLAB_FIGURES=0` skips them. What they show stays in the
run's summary.json, history.json, trace.json and TensorBoard events.
"""

from __future__ import annotations

import os

from hetlab.errors import UserError

FIGURES_ENV = "HETLAB_FIGURES"


def figures_wanted() -> bool:
    """True unless `HETLAB_FIGURES=0`; a value other than 0 or 1 is refused (call it before the work starts)."""
    value = os.environ.get(FIGURES_ENV, "1")
    if value not in ("0", "1"):
        raise UserError(f"{FIGURES_ENV}={value!r}: use 1 to draw a run's figures at its end, or 0 to skip them")
    return value == "1"
