"""Round metrics follow their definitions (docs/design.md §11) on hand-made records."""

from __future__ import annotations

import pytest

from saguaro.core.metrics import summarize
from saguaro.core.records import RoundRecord


def _r(drafted: int, accepted: int, hit: bool | None = None, backup: str | None = None):
    return RoundRecord(drafted, accepted, token=0, committed=accepted + 1, hit=hit, backup=backup)


def test_acceptance_definitions():
    m = summarize([_r(3, 3), _r(3, 1), _r(2, 0), _r(0, 0)])
    assert m["rounds"] == 4 and m["drafted"] == 8 and m["accepted"] == 4
    assert m["mean_accepted_length"] == pytest.approx(1 + 4 / 4)
    assert m["acceptance_rate"] == pytest.approx(4 / 8)
    # position j: of rounds that drafted >= j, the share that accepted >= j
    assert m["per_position_acceptance"] == pytest.approx([2 / 3, 1 / 3, 1 / 2])
    assert m["accepted_histogram"] == {0: 2, 1: 1, 3: 1}
    assert "cache_hit_rate" not in m


def test_ssd_hit_rate_and_backups():
    m = summarize([_r(2, 2, True), _r(2, 0, False, "fast"), _r(2, 1, False, "neural")])
    assert m["cache_hit_rate"] == pytest.approx(1 / 3)
    assert m["mean_accepted_length_hit"] == 3
    assert m["mean_accepted_length_miss"] == pytest.approx(1.5)
    assert m["backups"] == {"fast": 1, "neural": 1}


def test_no_rounds_and_ar_rounds():
    assert summarize([]) == {"rounds": 0}
    assert summarize([_r(0, 0)])["acceptance_rate"] is None
