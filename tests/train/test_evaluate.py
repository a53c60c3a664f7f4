"""The pair evaluation's repetition measures."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from saguaro.train.evaluate import distinct_share, loop_period  # noqa: E402


def test_loop_period_finds_the_shortest_cycle_of_the_tail():
    varied = list(range(100))
    assert loop_period(varied) is None
    assert loop_period(varied + [7] * 70) == 1
    assert loop_period(varied + [1, 2, 3] * 30) == 3
    # a cycle longer than max_period, or one that does not cover the whole tail, is no loop
    assert loop_period(varied + list(range(20)) * 5) is None
    assert loop_period(list(range(30)) + [5, 6] * 20 + list(range(40, 70))) is None
    assert loop_period([1, 2] * 10) is None  # too short to judge


def test_distinct_share():
    assert distinct_share(list(range(50))) == 1.0
    assert distinct_share([1, 2] * 50) == pytest.approx(2 / 97)
    assert distinct_share([1, 2]) == 1.0
