"""auto's choice through a burst of other work, simulated: one batch of 4 sequences whose
forwards cost 26 + 2 m ms (m positions) and 8 ms a draft step, acceptance 0.35 a position (so
AR serves 118 tok/s and SD with k = 1 about 108), timings +-15% noise. For BURST_LEN steps from
step BURST_AT every cost is 5x. Prints, for each burst, the share of steps after it that ran AR,
with auto's stale costs restarting (``STALE_STEPS``, saguaro's) and without (None):

    python docs/bench/auto/auto_burst.py
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import saguaro.speculation.auto as auto_module
from saguaro.speculation.auto import MIN_ROUNDS, AutoProposer

K, MS, SEQS, STEPS, SLOW = 4, 1e-3, 4, 3000, 5.0
ACCEPT = 0.35


def target_ms(positions: int) -> float:
    return 26 + 2 * positions


def ar_share_after_burst(stale: int | None, seed: int, burst_at: int, burst_len: int) -> float:
    random.seed(seed)
    auto_module.STALE_STEPS = stale
    auto = AutoProposer(SimpleNamespace(), None, K, 8)
    auto.acceptance.pooled, auto.acceptance.rounds = [ACCEPT] * K, MIN_ROUNDS
    for m in range(1, SEQS * (K + 1) + 1):  # as calibration would have measured them
        auto.target.observe(m, target_ms(m) * MS)
        auto.other.observe(m, 0.0)
    auto.draft.observe(SEQS, 8 * MS)
    seqs = [SimpleNamespace(seq_id=i) for i in range(SEQS)]
    modes = []
    for t in range(STEPS):
        slow = SLOW if burst_at <= t < burst_at + burst_len else 1.0
        choice = auto.choose(seqs)
        auto.advance(choice)
        k = choice.k if choice.mode == "sd" else 0
        noise = slow * random.uniform(0.85, 1.15)
        target_s, draft_s = noise * target_ms(SEQS * (k + 1)) * MS, noise * 8 * MS * k
        share = dict(num_drafted=k, draft_s=draft_s / SEQS, step_s=(target_s + draft_s) / SEQS)
        auto.book(target_s + draft_s)
        records = [SimpleNamespace(**share) for _ in seqs]
        auto._observe_costs(records, target_s + draft_s, target_s, SEQS * (k + 1), False)
        modes.append(choice.mode)
    after = modes[burst_at + burst_len :]
    return after.count("ar") / len(after)


def main() -> None:
    saguaros = auto_module.STALE_STEPS
    for stale in (saguaros, None):
        shares = [
            ar_share_after_burst(stale, start, start, length)
            for start in range(260, 420, 7)
            for length in (10, 30, 60)
        ]
        stuck = sum(s < 0.9 for s in shares)
        mean = sum(shares) / len(shares)
        print(
            f"STALE_STEPS={stale}: {len(shares)} bursts, AR after them {mean:.3f} of steps on"
            f" average, {stuck} bursts left auto on SD (AR < 90% of steps after)"
        )


if __name__ == "__main__":
    main()
