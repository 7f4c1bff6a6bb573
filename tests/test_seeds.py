"""Seed and episode lists: one syntax for every option that takes them."""

from __future__ import annotations

import pytest

from hetlab.errors import UserError
from hetlab.seeds import parse_seeds


@pytest.mark.parametrize(("text", "seeds"), [("2000-2003", [2000, 2001, 2002, 2003]), ("7", [7]),
                                             ("0,2,5", [0, 2, 5]), ("0-3,7,10-11", [0, 1, 2, 3, 7, 10, 11]),
                                             (" 1 - 2 , 4 ", [1, 2, 4])])
def test_ranges_numbers_and_lists_of_both(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize(("text", "message"), [
    ("", "--eval-seeds takes a range A-B"), ("a-b", "takes a range"), ("-3", "takes a range"), ("1,,2", "takes a range"),
    ("5-3", "the range 5-3 ends before it starts"), ("0-3,2", "once each, in increasing order"),
    ("4,1", "in increasing order"),
])
def test_bad_lists_are_one_line_errors_naming_the_option(text, message):
    with pytest.raises(UserError, match=message) as error:
        parse_seeds(text, "--eval-seeds")
    assert "\n" not in str(error.value)
