"""A run's history.json: the rows it logged (one per iteration or logging step), for every kind of run.

Each loop keeps its rows in memory and rewrites the file atomically before each checkpoint (so a
run killed between the two leaves rows that the older checkpoint's resume drops and logs again,
never a checkpoint whose rows are lost) and at its end. Phase-A runs from before the one name
wrote history.jsonl, a row per line: those are read too, and their next write is history.json.
"""

from __future__ import annotations

import json
from pathlib import Path

from hetlab.errors import UserError
from hetlab.files import write_text_atomic

NAME = "history.json"
OLD_PHASE_A_NAME = "history.jsonl"


def read_history(run_dir: Path | str) -> list[dict]:
    """The run's rows; [] before its first checkpoint. A one-line error for a damaged file."""
    path = Path(run_dir) / NAME
    if path.is_file():
        try:
            rows = json.loads(path.read_text())
        except ValueError as e:
            raise UserError(f"{path} is corrupt ({e}); move it away to resume without the record it holds") from e
        if not isinstance(rows, list):
            raise UserError(f"{path} is corrupt (a JSON {type(rows).__name__}, not a list of rows); move it away "
                            "to resume without the record it holds")
        return rows
    old = Path(run_dir) / OLD_PHASE_A_NAME
    if not old.is_file():
        return []
    *complete, _partial = old.read_text().split("\n")  # a last line without its newline: killed writing it
    try:
        return [json.loads(line) for line in complete]
    except ValueError as e:
        raise UserError(f"{old} is corrupt ({e}); move it away to resume without the earlier loss curve") from e


def write_history(run_dir: Path | str, rows: list[dict]) -> None:
    """history.json, atomically; an older run's history.jsonl goes once its rows are in the new file."""
    write_text_atomic(Path(run_dir) / NAME, json.dumps(rows))
    (Path(run_dir) / OLD_PHASE_A_NAME).unlink(missing_ok=True)
