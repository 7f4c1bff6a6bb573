"""history.json, the rows every kind of run logs: written whole, read back, damage named in one line."""

from __future__ import annotations

import pytest

from hetlab.errors import UserError
from hetlab.run_history import read_history, write_history


def test_rows_round_trip_and_a_run_without_them_has_none(tmp_path):
    assert read_history(tmp_path) == []
    rows = [{"step": 10, "loss": 0.5}, {"step": 20, "loss": 0.25}]
    write_history(tmp_path, rows)
    assert read_history(tmp_path) == rows
    assert [p.name for p in tmp_path.iterdir()] == ["history.json"]  # no temporary left behind


@pytest.mark.parametrize("text, what", [('[{"step": 1}', "is corrupt"),
                                         ('{"step": 1}', r"is corrupt \(a JSON dict, not a list")])
def test_a_damaged_history_is_named_with_what_to_do(tmp_path, text, what):
    (tmp_path / "history.json").write_text(text)
    with pytest.raises(UserError, match=f"history.json {what}.*move it away"):
        read_history(tmp_path)


def test_the_new_file_wins_over_an_old_phase_a_one_which_its_first_write_removes(tmp_path):
    (tmp_path / "history.jsonl").write_text('{"step": 10}\n{"step": 20}\n')
    assert read_history(tmp_path) == [{"step": 10}, {"step": 20}]
    (tmp_path / "history.jsonl").write_text('{"step": 10}\nnot json\n')
    with pytest.raises(UserError, match="history.jsonl is corrupt"):
        read_history(tmp_path)
    write_history(tmp_path, [{"step": 10}])
    assert read_history(tmp_path) == [{"step": 10}] and not (tmp_path / "history.jsonl").exists()
