"""Derived metrics: bonus-token accuracy's counts, percentiles, and the docs/design.md §7
prediction converted to this machine."""

from __future__ import annotations

import pytest

from saguaro.bench import aggregate
from saguaro.bench.backends import Generation, RequestResult
from saguaro.bench.config import parse_config
from saguaro.bench.measure import Run
from saguaro.bench.plan import build_variants
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
    # the verification's steady forward where the results have it, not the mean over prefills too
    steady = row(
        "ssd", predicted_speedup=2.0, round_costs={"target_forward": 15, "verify_forward": 8}
    )
    assert aggregate.on_this_machine(steady, ar) == pytest.approx(2.0 * 10 / 8)


def test_the_steady_verification_forward_leaves_each_prompts_first_round_out():
    """Two requests at batch 1: each first round's forward reads the prompt (300 ms); the later
    rounds verify (100 ms). target_forward is the mean over every round, verify_forward over the
    later ones."""

    def rec(target_s: float) -> RoundRecord:
        return RoundRecord(4, 2, token=0, committed=3, target_s=target_s)

    requests = [[rec(0.3), rec(0.1), rec(0.1)], [rec(0.3), rec(0.1)]]
    keys = ("glue_s", "branch_s", "build_s", "backup_s", "handle_s", "overran", "cut")
    totals = {"rounds": 5, "timed_rounds": 4, "round_s": 0.8, **dict.fromkeys(keys, 0.0)}
    gen = Generation(1.0, [], records=requests, ssd_totals=totals)
    costs = aggregate.round_costs([Run("d", 0.0, 1, "ssd", 0, 0, gen)])
    assert costs["target_forward"] == pytest.approx(1000 * 0.9 / 5)
    assert costs["verify_forward"] == pytest.approx(100.0)


def test_percentile_interpolates_between_ranks():
    assert aggregate.percentile([], 50) is None
    assert aggregate.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert aggregate.percentile([1.0, 2.0], 90) == pytest.approx(1.9)


def test_speedups_compare_each_mode_with_ar_of_the_same_setup():
    """Eager SD against eager AR, compiled SD against compiled AR; the one-core baseline against
    AR on one core."""
    cfg = parse_config(["--modes", "ar,sd", "--forwards", "eager,compiled", "--one-core-baselines"])
    variants = build_variants(cfg)
    elapsed = {
        "ar eager": 4.0, "ar eager 1 core": 8.0, "ar compiled": 2.0, "ar compiled 1 core": 6.0,
        "sd eager": 2.0, "sd eager 1 core": 4.0, "sd compiled": 1.0, "sd compiled 1 core": 2.0,
    }  # fmt: skip
    runs = [
        Run("d", 0.0, 1, v.label, 0, 0, Generation(elapsed[v.label], [
            # a first token after 0.5 s in every mode, the rest at the mode's own rate
            RequestResult("p", [1] * 8, latency_s=elapsed[v.label], ttft_s=0.5,
                          tpot_s=(elapsed[v.label] - 0.5) / 7)
        ]))
        for v in variants
    ]  # fmt: skip
    rows = {r.variant: r for r in aggregate.aggregate(runs, variants)}
    assert rows["sd eager"].speedup_vs_ar == pytest.approx(2.0)
    assert rows["sd compiled"].speedup_vs_ar == pytest.approx(2.0)
    assert rows["sd compiled 1 core"].speedup_vs_ar == pytest.approx(3.0)
    assert rows["ar compiled"].speedup_vs_ar == pytest.approx(1.0)
    # a token after the first: AR's TPOT over the mode's, the shared first token left out
    assert rows["sd eager"].decode_speedup_vs_ar == pytest.approx(3.5 / 1.5)
    assert rows["sd compiled 1 core"].decode_speedup_vs_ar == pytest.approx(5.5 / 1.5)
