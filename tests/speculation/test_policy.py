"""Batch-size-aware backup policy (DESIGN §7)."""

from __future__ import annotations

import pytest

from saguaro.speculation.policy import BackupPolicy, predicted_speedup


def test_formula_hand_computed():
    # (0.8*4 + 0.2*2) / (0.8^2 * max(1, 1.2) + (1 - 0.64)(1 + 0.5)) = 3.6 / (0.768 + 0.54)
    assert predicted_speedup(0.8, 4.0, 2.0, 2, 1.2, 0.5) == pytest.approx(3.6 / 1.308)
    # Primary faster than verify: max(1, T_p) = 1. Always hit: E_hit per verification.
    assert predicted_speedup(1.0, 3.0, 1.0, 8, 0.4, 9.0) == pytest.approx(3.0)
    # Never hit: E_miss per (verify + backup).
    assert predicted_speedup(0.0, 3.0, 1.5, 1, 1.0, 0.5) == pytest.approx(1.0)


def test_forced_modes():
    for mode in ("neural", "fast"):
        policy = BackupPolicy(mode=mode)
        assert policy.choose(1) == mode and policy.choose(64) == mode
    with pytest.raises(ValueError):
        BackupPolicy(mode="sometimes")


def test_auto_depends_on_batch():
    policy = BackupPolicy(mode="auto", K=5, alpha=1.0)
    policy.observe_round(True, 5, None)
    policy.observe_round(False, 5, "neural")
    policy.observe_round(False, 1, "fast")
    policy.p_hit = 0.7
    policy.observe_times(1.0, primary_s=0.9, backup_s={"neural": 1.0, "fast": 0.05})
    # Batch 1: neural misses commit 5 tokens against 1 for fast, worth a 2x round now and then.
    assert policy.predicted(1, "neural") > policy.predicted(1, "fast")
    assert policy.choose(1) == "neural"
    # Batch 32: some sequence misses almost every round, so neural doubles every round's time.
    assert policy.choose(32) == "fast"


def test_ema_moves_toward_observations():
    policy = BackupPolicy(K=4, alpha=0.1)
    before = policy.snapshot()
    for _ in range(50):
        policy.observe_round(False, 1, "fast")
        policy.observe_times(0.1, primary_s=0.2, backup_s={"neural": 0.3, "fast": 0.001})
    after = policy.snapshot()
    assert after["p_hit"] < before["p_hit"] and after["p_hit"] < 0.01
    assert after["e_miss_fast"] == pytest.approx(1.0, abs=0.01)
    assert after["e_miss_neural"] == before["e_miss_neural"]  # neural was not used
    assert after["e_hit"] == before["e_hit"]
    assert after["t_p"] == pytest.approx(2.0, abs=0.02)
    assert after["t_b_neural"] == pytest.approx(3.0, abs=0.1)
    assert after["t_b_fast"] == pytest.approx(0.01, abs=0.01)
    policy.observe_round(True, 5, None)
    assert policy.e_hit == pytest.approx(before["e_hit"] + 0.1 * (5 - before["e_hit"]))
    with pytest.raises(ValueError):
        policy.observe_round(False, 1, "magic")
    with pytest.raises(ValueError):
        policy.observe_times(0.0)


def test_round_overhead_favours_the_backup_that_commits_more():
    """T_o: a cost every round pays. Without it fast wins here; a large one flips the choice
    to neural, whose misses commit more per round."""
    assert predicted_speedup(0.4, 2.0, 1.0, 1, 1.0, 0.05, t_o=0.5) == pytest.approx(
        1.4 / (0.4 * 1.5 + 0.6 * 1.55)
    )
    # the primary speculation overlaps the target's overhead too: max(1 + T_o, T_p)
    assert predicted_speedup(1.0, 2.0, 1.0, 1, 1.3, 0.0, t_o=0.2) == pytest.approx(2.0 / 1.3)
    assert predicted_speedup(1.0, 2.0, 1.0, 1, 1.1, 0.0, t_o=0.2) == pytest.approx(2.0 / 1.2)
    policy = BackupPolicy(mode="auto", K=4, alpha=1.0)
    policy.p_hit, policy.e_hit = 0.4, 2.0
    policy.e_miss = {"neural": 2.2, "fast": 1.1}
    policy.t_b = {"neural": 0.9, "fast": 0.02}
    assert policy.choose(1) == "fast"
    policy.observe_times(0.01, other_s=0.005)
    assert policy.t_o == pytest.approx(0.5)
    assert policy.choose(1) == "neural"
    policy.observe_times(0.01, other_s=-0.001)  # clock noise never makes a round cheaper
    assert policy.t_o == 0.0
