"""Rank lists as text (--ranks, a subset's manifest)."""

import pytest

from stage_core.errors import UsageError
from stage_core.rankset import parse_ranks, ranks_text


def test_ranges_and_single_ranks():
    assert parse_ranks("0-3,9", 16) == [0, 1, 2, 3, 9]
    assert parse_ranks(" 9, 2-3 ,3", 16) == [2, 3, 9]  # any order, repeats once
    assert parse_ranks("4096", 4097) == [4096]
    assert ranks_text([9, 0, 1, 2, 3]) == "0-3,9"
    assert ranks_text([5]) == "5" and ranks_text([]) == ""
    assert ranks_text(range(64)) + ",4096" == "0-63,4096"
    assert parse_ranks(ranks_text([1, 3, 4, 5, 7]), 8) == [1, 3, 4, 5, 7]


@pytest.mark.parametrize("text,message", [
    ("0-16", "rank 16 is outside the world (ranks 0-15)"),
    ("3-1", "'3-1' is not a rank or an ascending range"),
    ("a", "'a' is not a rank or a range like 0-63"),
    ("1,,2", "'' is not a rank"),
    ("-2", "'-2' is not a rank"),
])
def test_bad_lists_are_one_line(text, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_ranks(text, 16)
