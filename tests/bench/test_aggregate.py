"""Derived metrics: bonus-token accuracy's counts, percentiles, and the docs/design.md §7
prediction converted to this machine."""

from __future__ import annotations

import pytest

from saguaro.bench import aggregate
from saguaro.core.records import RoundRecord


def test_bonus_counts_pair_each_full_round_with_the_next():
    def rec(drafted: int, accepted: int, hit: bool | None) -> RoundRecord:
        return RoundRecord(drafted, accepted, token=0, committed=accepted + 1, hit=hit)

    records = [
        rec(4, 4, None),  # all accepted; the next round hit: its bonus token was predicted
        rec(4, 4, True),  # all accepted; the next round missed
        rec(4, 1, False),  # partial: not counted
        rec(4, 0, True),
        rec(0, 0, False),  # nothing drafted: not counted
        rec(4, 4, False),  # all accepted, but the last round
    ]
    assert aggregate.bonus_counts(records) == (2, 1)


def test_prediction_is_converted_to_this_machines_ar_step():
    """docs/design.md §7 counts in verifications; an AR step here costs less than a
    verification."""

    def row(mode, **kw):
        fields = {f: None for f in aggregate.Row.__dataclass_fields__}
        fields.update(dataset="d", temperature=0.0, batch_size=1, variant=mode, mode=mode)
        fields.update(requests=1, output_tokens=1, elapsed_s=1.0, tokens_per_s=1.0, k=None)
        fields.update(draft_failures=[], speculation={}, **kw)
        return aggregate.Row(**fields)

    ssd = row("ssd", predicted_speedup=2.0, round_costs={"target_forward": 15.0})
    ar = row("ar", tpot_s=0.010)
    assert aggregate.on_this_machine(ssd, ar) == pytest.approx(2.0 * 10 / 15)
    assert aggregate.on_this_machine(ssd, None) is None


def test_percentile_interpolates_between_ranks():
    assert aggregate.percentile([], 50) is None
    assert aggregate.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert aggregate.percentile([1.0, 2.0], 90) == pytest.approx(1.9)
