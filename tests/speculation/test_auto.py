"""mode="auto": the choice between AR, SD with k proposals and SSD follows the cost model
(unit tests fed synthetic costs: no timing), and a request stays exact across forced switches
in every direction (greedy equal to AR, the first two tokens' distribution at T > 0, coupled
sampling's seeded text)."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest

from saguaro import LLM, SamplingParams
from saguaro.config import EngineConfig
from saguaro.speculation.auto import (
    EXPLORE_BUDGET,
    EXPLORE_EVERY,
    EXPLORE_STEPS,
    HYSTERESIS,
    MIN_DWELL,
    MIN_ROUNDS,
    PRIOR_WEIGHT,
    SWITCH_HORIZON,
    TRY_SEQS,
    Acceptance,
    AutoProposer,
    Threads,
)
from saguaro.speculation.ngram import Lookup
from saguaro.speculation.planner import Choice, CopyEstimates, Curve, SSDEstimates, plan_mode
from saguaro.speculation.policy import PRIOR_ACCEPT
from tests.conftest import FIRST_TWO_SAMPLES, PROMPTS, exact_first_two, sample_first_two
from tests.stats import assert_first_two_follow

K = 3
EXACT_DRAFT = dict(draft_lookup=0, draft_stop_below=0)  # every proposal the draft's own argmax
MS = 1e-3


def rates(n, target, other=lambda m: 0.0, draft=lambda r: 0.5 * MS, accept=0.8, ssd=None):
    """plan_mode for n sequences of per-position acceptance ``accept``."""
    tokens = [n * sum(accept**j for j in range(k + 1)) for k in range(K + 1)]
    return plan_mode(
        n=n,
        k_max=K,
        target_s=target,
        ssd_target_s=target,
        other_s=other,
        draft_s=draft,
        tokens=tokens,
        ssd=ssd,
    )


def best(r):
    return max(r, key=r.__getitem__)


def memory_bound(m):
    """A forward that costs 10 ms up to 64 positions, then grows with them."""
    return 10 * MS + max(0, m - 64) * 0.2 * MS


def test_a_memory_bound_target_and_a_good_draft_speculate_fully():
    assert best(rates(1, memory_bound)) == Choice("sd", K)


def test_a_poor_draft_speculates_less_or_not_at_all():
    assert best(rates(1, memory_bound, accept=0.3)).k < K
    assert best(rates(1, memory_bound, accept=0.02)) == Choice("ar", 0)


def test_a_large_batch_on_a_compute_bound_target_decodes_autoregressively():
    assert best(rates(64, memory_bound)) == Choice("ar", 0)


def test_an_expensive_draft_loses_to_ar():
    assert best(rates(1, memory_bound, draft=lambda r: 20 * MS)) == Choice("ar", 0)


def test_ssd_wins_where_its_hits_hide_the_drafting_and_loses_where_misses_stall():
    good = SSDEstimates(p_hit=0.9, e_hit=3.0, e_miss=3.0, t_p=0.8, t_b=0.4)
    assert best(rates(1, memory_bound, ssd=good)) == Choice("ssd", K)
    poor = SSDEstimates(p_hit=0.3, e_hit=3.0, e_miss=1.2, t_p=0.8, t_b=1.0)
    assert best(rates(16, memory_bound, ssd=poor)).mode != "ssd"


def test_the_overhead_of_a_step_counts_against_every_choice():
    """A large cost per scored position beyond the forward (sampling, verification) makes the
    long speculations that most rounds reject too dear."""
    cheap = best(rates(1, memory_bound, accept=0.5))
    dear = best(rates(1, memory_bound, accept=0.5, other=lambda m: 4 * MS * m))
    assert dear.k < cheap.k


def test_a_curve_interpolates_between_the_sizes_it_saw_and_never_falls_beyond():
    c = Curve(alpha=1.0)
    assert c(4) is None
    c.observe(1, 1.0)
    assert c(1) == 1.0 and c(8) == 1.0  # one size: flat
    c.observe(5, 2.0)
    c.observe(9, 1.5)
    assert c(0) == 1.0 and c(3) == pytest.approx(1.5)
    assert c(7) == pytest.approx(1.75)
    assert c(20) == 1.5  # beyond the last: the last segment's slope, never falling


@pytest.mark.parametrize("accept, wins", [(0.1, "ar"), (0.9, "ssd")])
def test_ssds_tokens_a_round_come_from_the_measured_acceptance(accept, wins):
    """The worker's estimates of its own rounds start at a prior of 0.7 a position and move by
    a tenth a round, so after a few tries they still promise 2.8 tokens a hit; auto prices SSD's
    rounds by the acceptance it measured instead: a weak draft's SSD loses to AR, a strong one's
    wins, whatever the worker's figures say."""
    optimistic = SSDEstimates(p_hit=0.9, e_hit=2.8, e_miss=2.8, t_p=0.5, t_b=1.0)
    ssd = SimpleNamespace(estimates=lambda n: optimistic)
    auto = AutoProposer(SimpleNamespace(), ssd, K, 8)
    auto.acceptance.pooled, auto.acceptance.rounds = [accept] * K, MIN_ROUNDS
    for m in range(1, 9 * (K + 1)):
        auto.target.observe(m, memory_bound(m))
        auto.other.observe(m, 0.0)
    auto.draft.observe(1, 6 * MS)
    auto.draft.observe(8, 6 * MS)
    seqs = [SimpleNamespace(seq_id=i) for i in range(4)]
    got = auto.rates(seqs)
    assert best(got).mode == wins
    if wins == "ar":  # the worker's own figures would have chosen SSD
        assert best(rates(4, memory_bound, accept=accept, ssd=optimistic)).mode == "ssd"


def test_a_size_not_measured_for_a_while_restarts_from_its_next_measurement():
    c = Curve(stale_after=10)
    c.observe(1, 5.0, step=0)  # measured while the machine was busy
    c.observe(1, 1.0, step=5)
    assert c(1) == pytest.approx(4.6)  # recent: a step of alpha
    c.observe(2, 1.0, step=20)
    c.observe(1, 1.0, step=16)  # 11 steps after: stale, replaced
    assert c(1) == 1.0 and c(2) == 1.0


def served(auto: AutoProposer, steps: int, slow: float = 1.0) -> list[str]:
    """``steps`` steps of one sequence whose forwards cost ``slow`` times the normal: AR 10 ms,
    SD with k proposals 10 + k ms for the target and 3 ms a draft step; acceptance 0.3, so AR
    serves 100 tok/s and SD k = 1 93. Returns the modes run."""
    modes = []
    for _ in range(steps):
        choice = auto.choose([SimpleNamespace(seq_id=0)])
        auto.advance(choice)
        k = choice.k if choice.mode == "sd" else 0
        target_s, draft_s = slow * (10 + k) * MS, slow * 3 * MS * k
        record = SimpleNamespace(num_drafted=k, draft_s=draft_s, step_s=target_s + draft_s)
        auto.book(record.step_s)
        auto._observe_costs([record], record.step_s, target_s, k + 1, ssd_step=False)
        modes.append(choice.mode)
    return modes


def test_a_burst_of_other_work_does_not_leave_auto_on_the_slower_mode():
    """The machine is 5x slower for 30 steps while AR runs: AR's measured cost rises, SD (its
    costs measured before the burst) looks faster and is chosen. Once the burst is over, AR's
    next try measures it afresh and AR is chosen again; a moving average fed three try steps
    would have kept it looking 3.5x slower, and SD on, try after try."""
    auto = AutoProposer(SimpleNamespace(), None, K, 8)
    auto.acceptance.pooled, auto.acceptance.rounds = [0.3] * K, MIN_ROUNDS
    for m in range(1, K + 2):
        auto.target.observe(m, (9 + m) * MS)
        auto.other.observe(m, 0.0)
    auto.draft.observe(1, 3 * MS)
    assert set(served(auto, 20)) == {"ar"}
    assert "sd" in served(auto, 30, slow=5.0)
    after = served(auto, 600)
    assert after[-300:].count("ar") >= 0.95 * 300  # AR, but for SD's own tries


def test_acceptance_per_request_leans_on_the_pool_until_it_has_its_own():
    acc = Acceptance(k_max=2, alpha=0.5)
    for _ in range(20):
        acc.observe(1, drafted=2, accepted=2)  # request 1 accepts everything
        acc.observe(2, drafted=2, accepted=0)  # request 2 nothing
    assert acc.expected(1)[2] > 2.5 > acc.expected(3)[2] > 1.3 > acc.expected(2)[2]
    assert acc.expected(3)[0] == 1.0 and acc.expected(3)[1] < acc.expected(3)[2]
    acc.observe(None, drafted=2, accepted=2)  # an ended request feeds the pool only
    acc.forget(1)
    assert 1 not in acc.own


def test_the_pool_is_a_mean_with_the_prior_until_the_moving_average_takes_over():
    acc = Acceptance(k_max=1, alpha=0.1)
    for _ in range(3):
        acc.observe(None, drafted=1, accepted=0)
    # (PRIOR_WEIGHT x 0.7 + 0 + 0 + 0) / (PRIOR_WEIGHT + 3), not 0.7 x 0.9^3
    assert acc.pooled[0] == pytest.approx(PRIOR_WEIGHT * PRIOR_ACCEPT / (PRIOR_WEIGHT + 3))
    for _ in range(200):
        acc.observe(None, drafted=1, accepted=1)
    before = acc.pooled[0]
    acc.observe(None, drafted=1, accepted=0)  # long past the warm start: a step of alpha
    assert acc.pooled[0] == pytest.approx(before * 0.9)


def test_shadow_counts_move_the_pool_as_the_rounds_they_count():
    """Chains seen as per-position counts (SSD's shadow chains) move the pool as the same
    rounds observed one by one, where every round tried a position with the same outcome."""
    one, counted = Acceptance(k_max=3, alpha=0.1), Acceptance(k_max=3, alpha=0.1)
    for _ in range(4):
        one.observe(None, drafted=3, accepted=1)
    counted.observe_counts([4, 4, 0], [4, 0, 0])
    assert counted.pooled == pytest.approx(one.pooled) and counted.rounds == one.rounds == 4


def test_the_worker_owns_its_cores_only_where_the_target_is_kept_off_them():
    def cfg(**kw) -> EngineConfig:
        return EngineConfig(draft="d", device="cpu", **kw)

    own = cfg(mode="auto", auto_cores="own", target_cpus=[0], draft_cpus=[1])
    assert own.worker_owns_cores
    assert not cfg(mode="auto", target_cpus=[0, 1], draft_cpus=[1]).worker_owns_cores
    assert not cfg(mode="auto", auto_ssd=False, target_cpus=[0], draft_cpus=[1]).worker_owns_cores
    assert not cfg(mode="auto", pin_cpus=False).worker_owns_cores


def chooser(predicted: dict[Choice, float], seen: int = MIN_ROUNDS) -> AutoProposer:
    """An AutoProposer whose cost model predicts ``predicted`` (tokens/s) whatever the batch,
    having observed ``seen`` speculative rounds."""
    auto = AutoProposer(SimpleNamespace(), None, K, 8)
    auto.rates = lambda seqs: predicted
    auto.acceptance.rounds = seen
    return auto


def run_steps(auto: AutoProposer, steps: int) -> list[Choice]:
    chosen = []
    for _ in range(steps):
        chosen.append(auto.choose([SimpleNamespace(seq_id=0)]))
        auto.advance(chosen[-1])
    return chosen


def test_hysteresis_keeps_a_choice_against_a_small_gain_and_dwells():
    sd, sd_short, ar = Choice("sd", K), Choice("sd", 1), Choice("ar", 0)
    predicted = {ar: 100.0, sd_short: 180.0, sd: 180.0 * (1 + HYSTERESIS / 2)}
    auto = chooser(predicted)
    assert run_steps(auto, 1) == [sd]  # the first choice is the best
    auto.settled, auto.dwell = sd_short, 0  # say the costs had favoured it a moment ago
    assert run_steps(auto, 2 * MIN_DWELL) == [sd_short] * (2 * MIN_DWELL)
    auto.settled, auto.dwell = ar, 0  # a large gain switches, but only after MIN_DWELL steps
    chosen = run_steps(auto, MIN_DWELL + 1)
    assert chosen[:MIN_DWELL] == [ar] * MIN_DWELL and chosen[-1] == sd


def test_a_mode_not_run_for_a_while_is_tried_again_less_often_while_it_loses():
    sd, ar = Choice("sd", K), Choice("ar", 0)
    predicted = {ar: 100.0, Choice("sd", 1): 150.0, sd: 200.0}
    auto = chooser(predicted)
    modes = [c.mode for c in run_steps(auto, 8 * EXPLORE_EVERY)]
    assert modes.count("sd") > 0.95 * len(modes)
    starts = [i for i, m in enumerate(modes) if m == "ar" and modes[i - 1] != "ar"]
    want, at, gap = [], EXPLORE_EVERY, EXPLORE_EVERY
    while at < len(modes):  # each losing try doubles the interval before the next
        want.append(at)
        gap *= 2
        at += EXPLORE_STEPS + gap
    assert starts == want and len(want) >= 3
    for start in starts:  # a try runs EXPLORE_STEPS steps, then the settled choice resumes
        assert modes[start : start + EXPLORE_STEPS + 1] == ["ar"] * EXPLORE_STEPS + ["sd"]
    predicted[ar] = 1000.0  # the costs turn: chosen, AR's interval starts over
    run_steps(auto, MIN_DWELL + 1)
    assert auto.settled == ar and auto.interval["ar"] == EXPLORE_EVERY
    assert auto.interval["sd"] == EXPLORE_EVERY  # sd was the settled choice all along


def test_speculation_settles_only_once_its_rounds_have_been_seen():
    """Rates of SD resting on the prior acceptance alone do not switch away from AR; a try's
    rounds, once observed, let them."""
    ar, sd = Choice("ar", 0), Choice("sd", K)
    auto = chooser({ar: 100.0, sd: 200.0}, seen=0)
    assert run_steps(auto, EXPLORE_EVERY) == [ar] * EXPLORE_EVERY
    assert run_steps(auto, EXPLORE_STEPS) == [sd] * EXPLORE_STEPS  # the try
    assert run_steps(auto, MIN_DWELL + 1) == [ar] * (MIN_DWELL + 1)  # nothing observed
    for _ in range(MIN_ROUNDS):
        auto.acceptance.observe(0, drafted=K, accepted=K)
    assert run_steps(auto, MIN_DWELL + 1)[-1] == sd


def test_ssd_with_a_fed_worker_settles_on_its_prior():
    """A fed worker wastes no catch-up on a wrong prior (its own cores read the context), so
    SSD, like copies alone, may settle before any round is seen; unfed it may not."""
    ar, ssd = Choice("ar", 0), Choice("ssd", K)
    unfed = chooser({ar: 100.0, ssd: 200.0}, seen=0)
    fed = chooser({ar: 100.0, ssd: 200.0}, seen=0)
    fed.feeds = True
    assert run_steps(unfed, 2) == [ar, ar] and run_steps(fed, 2) == [ssd, ssd]


def test_tries_keep_to_their_budget_of_time():
    """Steps of 10 ms, a draft catch-up of 4 ms a token and 20 tokens each sequence's draft
    has not seen: a try is predicted at 3 x 10 + 20 x 4 = 110 ms, so none starts before the
    engine has run 110 ms x (1 - EXPLORE_BUDGET) / EXPLORE_BUDGET, and over a long run the
    tries take at most EXPLORE_BUDGET of the time."""
    ar = Choice("ar", 0)
    auto = chooser({ar: 200.0, Choice("sd", 1): 150.0, Choice("sd", K): 100.0})
    auto.sd = SimpleNamespace(draft_ready=lambda s: len(s) - 21)
    auto.catch_up_s = 4 * MS
    seq = type("Seq", (), {"seq_id": 0, "__len__": lambda self: 100})()  # 100 tokens
    modes = []
    for _ in range(2000):
        choice = auto.choose([seq])
        auto.advance(choice)
        auto.book(10 * MS)
        modes.append(choice.mode)
    first = modes.index("sd")
    cost = EXPLORE_STEPS * 10 * MS + 20 * 4 * MS
    assert first * 10 * MS >= cost * (1 - EXPLORE_BUDGET) / EXPLORE_BUDGET > EXPLORE_EVERY * 10 * MS
    assert 0 < auto.try_s <= EXPLORE_BUDGET * auto.run_s
    assert modes.count("sd") == round(auto.try_s / (10 * MS))  # every try step was booked


def test_an_sd_try_drafts_only_for_the_sequences_whose_draft_missed_least():
    """A try of SD in a batch of 6 drafts for the TRY_SEQS sequences with the fewest tokens
    the draft has not seen; the others' rounds propose nothing, and the draft's step time is
    booked against the rows it drafted."""
    sd, ar = Choice("sd", K), Choice("ar", 0)
    auto = chooser({ar: 200.0, sd: 100.0}, seen=0)
    missed = {0: 90, 1: 5, 2: 40, 3: 0, 4: 60, 5: 10}  # seq_id -> tokens the draft has not seen
    proposed = []
    auto.sd = SimpleNamespace(
        draft_ready=lambda s: len(s) - 1 - missed[s.seq_id],
        propose=lambda seqs, ks: proposed.append(ks),
    )
    seqs = [
        type("Seq", (), {"seq_id": i, "__len__": lambda self: 100})() for i in range(len(missed))
    ]
    chosen = []
    for _ in range(EXPLORE_EVERY + EXPLORE_STEPS):
        chosen.append(auto.choose(seqs))
        auto.advance(chosen[-1])
        auto._proposal(chosen[-1], seqs, [K] * len(seqs))
    assert chosen[-EXPLORE_STEPS:] == [sd] * EXPLORE_STEPS  # the try
    fewest = sorted(missed, key=missed.get)[:TRY_SEQS]
    assert auto.try_ids == set(fewest) and len(fewest) < len(seqs)
    want = [K if i in fewest else 0 for i in range(len(seqs))]
    assert proposed == [want] * EXPLORE_STEPS
    records = [SimpleNamespace(num_drafted=k, draft_s=0.001 * k, step_s=0.01) for k in want]
    auto._observe_costs(records, 0.06, 0.03, sum(k + 1 for k in want), ssd_step=False)
    assert auto.draft.knots and set(auto.draft.knots) == {TRY_SEQS}


def test_a_switch_must_repay_its_drafts_catch_up_within_the_horizon():
    """SD predicted 10% faster than AR, steps of 10 ms, and 100 tokens of each of 4 sequences
    its draft has not seen at 1 ms a token: the 400 ms catch-up is not repaid within
    SWITCH_HORIZON steps (rate T / (T + C) = 0.62 of its rate), so AR stays; once the draft is
    current SD is chosen."""
    ar, sd = Choice("ar", 0), Choice("sd", 1)
    auto = chooser({ar: 100.0, sd: 110.0})
    auto.catch_up_s, auto.step_s = 1 * MS, 10 * MS
    missed = {"n": 100}
    auto.sd = SimpleNamespace(draft_ready=lambda s: len(s) - 1 - missed["n"])
    seqs = [type("Seq", (), {"seq_id": i, "__len__": lambda self: 200})() for i in range(4)]
    horizon = SWITCH_HORIZON * 10 * MS
    assert auto.catch_up_cost("sd", seqs) == pytest.approx(0.4)
    assert auto.catch_up_cost("ar", seqs) == 0.0
    assert auto.worth(110.0, 0.4) == pytest.approx(110.0 * horizon / (horizon + 0.4))
    assert auto.worth(100.0, 0.0) == 100.0
    auto.settled, auto.dwell = ar, MIN_DWELL
    assert auto.choose(seqs) == ar
    missed["n"] = 0
    assert auto.choose(seqs) == sd


def test_an_ssd_try_is_priced_at_the_workers_catch_up_and_stops_when_the_batch_grows():
    """SSD's worker catches up on the tokens it has not been sent, on the core the target
    leaves it (1 of 2: twice the calibrated cost a token), whatever SD's draft has seen. A try
    begun on one sequence the worker knows runs its EXPLORE_STEPS steps while the batch stays;
    one whose batch gains 8 sequences the worker has never seen stops at its next step."""
    ar, ssd = Choice("ar", 0), Choice("ssd", K)
    auto = chooser({ar: 200.0, ssd: 100.0})
    auto.threads = Threads(other=2, ssd=1)
    auto.catch_up_s, auto.step_s = 1 * MS, 10 * MS
    auto.sd = SimpleNamespace(draft_ready=lambda s: len(s) - 1)  # SD's draft has seen all
    auto.ssd = SimpleNamespace(unsent=lambda s: 0 if s.seq_id == 0 else len(s), pause=lambda: None)
    seqs = [type("Seq", (), {"seq_id": i, "__len__": lambda self: 100})() for i in range(9)]
    assert auto.try_cost(ssd, seqs[:1], 3) == pytest.approx(30 * MS)
    assert auto.try_cost(ssd, seqs, 2) == pytest.approx(20 * MS + 8 * 100 * 2 * MS)
    modes, batch = [], seqs[:1]
    for _ in range(3000):
        choice = auto.choose(batch)
        auto.advance(choice)
        auto.book(10 * MS)
        modes.append(choice.mode)
        if choice.mode == "ssd" and modes.count("ssd") > EXPLORE_STEPS:
            batch = seqs  # the second try's batch grows after its first step
    runs = "".join(m[0] for m in modes).replace("a", " ").split()
    assert runs[:2] == ["s" * EXPLORE_STEPS, "s"]


def test_a_fed_workers_catch_up_costs_the_target_nothing():
    """A fed worker reads new contexts on its own cores, serving the fast backup meanwhile: a
    switch to SSD is not charged for it. SD's in-process draft still reads on the target's."""
    auto = chooser({Choice("ar", 0): 1.0})
    auto.catch_up_s = 1 * MS
    auto.sd = SimpleNamespace(draft_ready=lambda s: 0)
    auto.ssd = SimpleNamespace(unsent=len)
    seqs = [[0] * 100]
    assert auto.catch_up_cost("ssd", seqs) == pytest.approx(100 * MS)
    auto.feeds = True
    assert auto.catch_up_cost("ssd", seqs) == 0.0
    assert auto.catch_up_cost("sd", seqs) == pytest.approx(99 * MS)


def copying_auto(target=memory_bound) -> AutoProposer:
    """Auto with copies alone among its choices: a target forward costing ``target`` (default
    memory-bound), a draft step of 5 ms at acceptance 0.2 (SD loses to AR), copies accepted 0.9
    a position."""
    auto = AutoProposer(SimpleNamespace(), None, K, 8, lookup=Lookup(2))
    auto.acceptance.pooled, auto.acceptance.rounds = [0.2] * K, MIN_ROUNDS
    auto.copies.pooled = [0.9] * K
    for m in range(1, 8 * (K + 1) + 1):
        auto.target.observe(m, target(m))
        auto.other.observe(m, 0.0)
    auto.draft.observe(1, 5 * MS)
    return auto


def test_copies_alone_run_where_the_contexts_copy_and_ar_where_none_does():
    copying = SimpleNamespace(seq_id=0, token_ids=[1, 2, 3, 1, 2])  # (1, 2) recurs: a copy
    fresh = SimpleNamespace(seq_id=1, token_ids=[1, 2, 3, 4, 5])
    auto = copying_auto()
    rates = auto.rates([copying, fresh])
    ar, lookup = rates[Choice("ar", 0)], rates[Choice("lookup", K)]
    # one sequence verifies K copies beside the other's one position, in one 10 ms forward
    assert lookup == pytest.approx((1 + 1 + 0.9 + 0.9**2 + 0.9**3) / (10 * MS))
    assert ar == pytest.approx(2 / (10 * MS)) and best(rates) == Choice("lookup", K)
    assert auto.choose([copying, fresh]) == Choice("lookup", K)
    none = copying_auto()
    assert none.rates([fresh])[Choice("lookup", K)] == none.rates([fresh])[Choice("ar", 0)]
    assert none.choose([fresh]) == Choice("ar", 0)  # no copy: nothing to gain, AR stays


def test_copies_alone_settle_on_their_prior_and_leave_once_their_rounds_fail():
    """No draft, no catch-up: copies alone may be chosen before any of their rounds was seen
    (SD may not), and rejected copies bring their acceptance down until AR is chosen again."""
    copying = SimpleNamespace(seq_id=0, token_ids=[1, 2, 3, 1, 2])
    auto = copying_auto(lambda m: (8 + 2 * m) * MS)  # each verified position costs 2 ms
    auto.copies.pooled, auto.acceptance.rounds = [PRIOR_ACCEPT] * K, 0
    assert auto.copies.rounds == 0 and auto.choose([copying]) == Choice("lookup", K)
    auto.advance(auto.settled)
    for _ in range(MIN_DWELL + 4):
        auto.copies.observe(0, drafted=K, accepted=0)
        auto.advance(auto.choose([copying]))
    assert auto.settled == Choice("ar", 0)


def test_forced_copies_alone_in_auto_keep_coupled_text_and_learn_their_own_acceptance(
    small_vocab_pair,
):
    """Over 8 tokens two-token n-grams recur within a few dozen: copies are proposed, and at
    T = 1 accepted now and then. Under coupled sampling the text is the one AR draws from the
    same seeds, and the copies' acceptance goes to their own tracker, not the draft's. Copies
    alone follow copy_lookup whatever the draft's chains do (draft_lookup 0: none of theirs)."""
    target, close, _ = small_vocab_pair
    params = [
        SamplingParams(temperature=1.0, max_tokens=48, ignore_eos=True, seed=s) for s in range(4)
    ]
    prompts = [[1, 4, 2], [3, 3, 5], [7, 0], [2, 6, 1, 2]]
    with LLM(model=str(target), max_model_len=256, sampling="coupled") as ar:
        want = [o.token_ids for o in ar.generate(prompts, params)]
    with auto(target, close, auto_ssd=False, sampling="coupled", draft_lookup=0) as llm:
        llm.engine.proposer.force = lambda step: Choice("lookup", K)
        outs = llm.generate(prompts, params)
        proposer = llm.engine.proposer
    assert [o.token_ids for o in outs] == want
    records = [r for o in outs for r in o.records]
    assert {r.mode for r in records} <= {"lookup", "ar"}
    assert 0 < sum(r.num_accepted for r in records) < sum(r.num_drafted for r in records)
    assert proposer.copies.rounds > 0 and proposer.acceptance.rounds == 0


# ---- exact across switches ---------------------------------------------------------------------

CYCLE = [
    Choice("ssd", K),
    Choice("sd", 1),
    Choice("ar", 0),
    Choice("sd", K),
    Choice("ssd", K),
    Choice("ssd", K),  # a hit needs an SSD round after an SSD round
    Choice("lookup", K),
    Choice("ssd", K),
    Choice("ssd", K),
    Choice("lookup", 1),
    Choice("sd", 2),
]
CYCLE_MODES = {"ar", "sd", "ssd", "lookup"}


def force_cycle(llm):
    llm.engine.proposer.force = lambda step: CYCLE[step % len(CYCLE)]


def auto(target, draft, **kw) -> LLM:
    kw.setdefault("max_model_len", 256)
    kw.setdefault("max_num_seqs", 8)
    kw.setdefault("draft_timeout_s", 60)
    return LLM(model=str(target), draft=str(draft), num_speculative_tokens=K, **kw)


def test_auto_is_the_default_with_a_draft_and_samples_coupled(tiny_llama, close_draft):
    with auto(tiny_llama, close_draft) as llm:
        assert llm.config.mode == "auto" and llm.config.sampling == "coupled"
        outs = llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=16))
        assert all(o.token_ids for o in outs)
        stats = llm.draft_stats()["auto"]
        assert sum(stats["steps"].values()) > 0 and stats["choice"] is not None


@pytest.mark.parametrize("backup", ["neural", "fast"])
def test_greedy_output_equals_ar_across_forced_switches(tiny_llama, close_draft, backup):
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    ar = LLM(model=str(tiny_llama), max_model_len=256).generate(PROMPTS[:4], params)
    with auto(tiny_llama, close_draft, backup=backup, fanout=[2, 1, 1, 2]) as llm:
        force_cycle(llm)
        outs = llm.generate(PROMPTS[:4], params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ar]
    records = [r for o in outs for r in o.records]
    assert {r.mode for r in records} == CYCLE_MODES
    assert {r.num_drafted for r in records if r.mode == "sd"} == {1, 2, K}
    assert any(r.hit for r in records), "no SSD round hit its cache"


@pytest.mark.slow
@pytest.mark.parametrize("sampling", ["rejection", "coupled"])
def test_first_two_tokens_follow_the_target_across_forced_switches(small_vocab_pair, sampling):
    target, draft, _ = small_vocab_pair
    expected = exact_first_two(
        target, [1, 4, 2], SamplingParams(temperature=0.8, max_tokens=4, ignore_eos=True)
    )

    def params(seed: int) -> SamplingParams:
        return SamplingParams(temperature=0.8, max_tokens=4, ignore_eos=True, seed=seed)

    samples, batch = FIRST_TWO_SAMPLES, 1_000
    counts, hits = sample_first_two(
        target,
        draft,
        params,
        samples,
        batch,
        prepare=force_cycle,
        num_speculative_tokens=K,
        sampling=sampling,
        fanout=[3, 2, 2, 3],
        backup="neural",
    )
    assert_first_two_follow(counts, expected, sampling)
    assert hits, "the SSD hit path was not exercised"


def test_coupled_sampling_keeps_its_seeded_text_across_switches(tiny_llama, close_draft):
    params = [
        SamplingParams(temperature=0.9, top_p=0.95, max_tokens=40, ignore_eos=True, seed=s)
        for s in range(4)
    ]
    with LLM(model=str(tiny_llama), max_model_len=256, sampling="coupled") as ar:
        reference = [o.token_ids for o in ar.generate(PROMPTS[:4], params)]
    with auto(tiny_llama, close_draft, backup="neural") as llm:
        force_cycle(llm)
        outs = llm.generate(PROMPTS[:4], params)
    assert [o.token_ids for o in outs] == reference
    assert {r.mode for o in outs for r in o.records} == CYCLE_MODES


def test_prompts_cached_while_ar_runs_serve_sd_after_the_draft_catches_up(tiny_llama):
    """Auto running AR computes no draft KV, yet its prompts' blocks are cached; a request that
    reuses them under SD has its draft compute those blocks itself. With the target as its own
    draft every proposal is then accepted: a draft reading blocks without its KV would not.
    (No copies from the context and no confidence stop: the repeated prompt's copies would be
    proposals of their own, and a stop would end chains the target itself is unsure of.)"""
    prompt = PROMPTS[0] * 3  # several full blocks
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    llm = auto(tiny_llama, tiny_llama, auto_ssd=False, draft_quantization="none", **EXACT_DRAFT)
    llm.engine.proposer.force = lambda step: Choice("ar", 0)
    first = llm.generate([prompt], params)[0]
    llm.engine.proposer.force = lambda step: Choice("sd", K)
    second = llm.generate([prompt], params)[0]
    assert second.metrics["cached_prompt_tokens"] > 0
    assert second.token_ids == first.token_ids
    # the first round prefills the uncached tail and proposes nothing; every later one drafts
    assert second.records[0].num_drafted == 0
    spec = second.records[1:]
    assert spec and all(r.num_drafted == r.num_accepted == K for r in spec[:-1])


def test_auto_without_ssd_chooses_between_ar_sd_and_copies_with_no_worker(tiny_llama, close_draft):
    with auto(tiny_llama, close_draft, auto_ssd=False) as llm:
        assert llm.engine.proposer.ssd is None and llm.config.sampling == "rejection"
        params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        outs = llm.generate(PROMPTS[:2], params)
        ar = LLM(model=str(tiny_llama), max_model_len=256).generate(PROMPTS[:2], params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ar]
    assert {r.mode for o in outs for r in o.records} <= {"ar", "sd", "lookup"}


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_fed_worker_measures_its_draft_while_ar_runs_and_ssd_keeps_the_text(
    tiny_llama, temperature
):
    """With the worker fed (its own cores), AR steps teach auto the draft's acceptance: with
    the target as its own draft, every shadow chain is accepted whole, greedy and coupled. SSD
    steps after them, from a current worker, keep the text the target alone samples."""
    params = [
        SamplingParams(temperature=temperature, max_tokens=30, ignore_eos=True, seed=s)
        for s in range(2)
    ]
    with LLM(model=str(tiny_llama), max_model_len=256, sampling="coupled") as ar:
        reference = [o.token_ids for o in ar.generate(PROMPTS[:2], params)]
    exact = dict(draft_quantization="none", **EXACT_DRAFT)
    with auto(tiny_llama, tiny_llama, **exact) as llm:
        proposer = llm.engine.proposer
        proposer.feeds = True
        proposer.force = lambda step: Choice("ar", 0)
        assert [o.token_ids for o in llm.generate(PROMPTS[:2], params)] == reference
        pool = proposer.acceptance  # what the AR steps taught it
        assert pool.rounds >= 4 and min(pool.seen) > 0 and min(pool.pooled) > PRIOR_ACCEPT
        first = proposer.steps
        proposer.force = lambda step: Choice("ar", 0) if step < first + 8 else Choice("ssd", K)
        outs = llm.generate(PROMPTS[:2], params)
    assert [o.token_ids for o in outs] == reference
    records = [r for o in outs for r in o.records]
    assert {r.mode for r in records} == {"ar", "ssd"}
    assert any(r.num_accepted for r in records if r.mode == "ssd")


@pytest.mark.parametrize("feeds", [False, True])
def test_a_worker_killed_while_auto_runs_ar_is_restarted_before_ssd_runs_again(
    tiny_llama, close_draft, feeds
):
    """Unfed, auto sends the worker nothing while AR runs, so no round finds it dead: the
    supervisor looks before every step; fed, the next feed may find it too. The worker is back
    while AR still runs, and SSD then hits again with the new one, the text still AR's."""
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    ar = LLM(model=str(tiny_llama), max_model_len=256).generate(PROMPTS[:2], params)
    with auto(tiny_llama, close_draft, draft_restart_backoff_s=0.0, fanout=[2, 1, 1, 2]) as llm:
        eng = llm.engine
        eng.proposer.feeds = feeds
        first = eng.proposer.ssd.worker.proc
        eng.proposer.force = lambda step: Choice("ar", 0)
        seqs = [eng.add_request(eng.encode_prompt(p), params) for p in PROMPTS[:2]]
        eng.step()
        first.kill()
        first.wait()
        for _ in range(3):
            eng.step()
        assert eng.draft_health().restarts == 1 and eng.draft_health().state == "running"
        eng.proposer.force = lambda step: Choice("ssd", K)
        while eng.has_unfinished():
            eng.step()
    assert [s.output_token_ids for s in seqs] == [o.token_ids for o in ar]
    assert any(r.hit for s in seqs for r in s.records if r.mode == "ssd"), "no SSD hit after"


def test_sizes_only_calibrated_follow_the_level_the_steps_measure():
    """Calibration gives the shape, steps the level: forwards observed at twice their calibrated
    cost make the sizes not observed since twice as dear too, while observed sizes keep their
    own measurements."""
    c = Curve(alpha=1.0)
    c.calibrate(16, 1.0)
    c.calibrate(24, 1.5)
    assert c(24) == 1.5 and c(20) == pytest.approx(1.25)
    c.observe(16, 2.0)
    assert c(16) == 2.0 and c(24) == pytest.approx(3.0) and c(20) == pytest.approx(2.5)
    c.observe(20, 2.0)  # the calibration interpolated 1.25 here: the level becomes 1.6
    assert c(20) == 2.0 and c(24) == pytest.approx(2.4)
    other = Curve(alpha=1.0, shared_level=c.level)  # another mode's forwards, same machine
    other.calibrate(4, 0.5)
    assert other(4) == pytest.approx(0.8)


def test_a_mode_whose_forwards_were_only_calibrated_does_not_win_on_a_quiet_calibration():
    """Compute-bound forwards (cost in proportion to positions) calibrated on an idle engine,
    then AR's steps measured at twice that. Copies alone for half the batch, accepted 90% of
    the time, would look twice as fast as AR if the calibration's figure for their larger
    forward stood beside AR's measured one; at the measured level they lose, as they must where
    every position costs the same and a copy commits less than one token a position."""
    n, copying = 16, 8
    copies = CopyEstimates(tokens=[n, n + copying * 0.9], positions=[n, n + copying])
    plan = partial(
        plan_mode,
        n=n,
        k_max=1,
        other_s=lambda m: 0.0,
        draft_s=None,
        tokens=[n, n],
        ssd=None,
        copies=copies,
    )
    lookup, ar = Choice("lookup", 1), Choice("ar", 0)
    face_value, levelled = Curve(alpha=1.0), Curve(alpha=1.0)
    for m in (n, n + copying):
        face_value.observe(m, 0.01 * m)  # calibration taken as measurements
        levelled.calibrate(m, 0.01 * m)
    for curve in (face_value, levelled):
        curve.observe(n, 0.02 * n)
    stale = plan(target_s=face_value, ssd_target_s=face_value)
    assert stale[lookup] > 1.5 * stale[ar]
    got = plan(target_s=levelled, ssd_target_s=levelled)
    assert got[lookup] < got[ar]


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_sd_and_ssd_with_ar_fallback_choose_between_ar_and_their_own_speculation(
    tiny_llama, close_draft, mode
):
    """With ``ar_fallback`` a fixed mode is auto's chooser cut to AR and its own speculation:
    left to itself it runs nothing else, and forced to switch back and forth its greedy text is
    AR's."""
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    with LLM(model=str(tiny_llama), max_model_len=256) as ar:
        want = [o.token_ids for o in ar.generate(PROMPTS[:4], params)]
    with auto(tiny_llama, close_draft, mode=mode, ar_fallback=True) as llm:
        proposer = llm.engine.proposer
        assert isinstance(proposer, AutoProposer) and set(proposer.since) == {"ar", mode}
        assert (proposer.ssd is not None) == (mode == "ssd") and proposer.copier is None
        free = llm.generate(PROMPTS[:4], params)
        proposer.force = lambda step: Choice(mode, K) if step % 3 else Choice("ar", 0)
        forced = llm.generate(PROMPTS[:4], params)
    assert [o.token_ids for o in free] == want == [o.token_ids for o in forced]
    assert {r.mode for o in free for r in o.records} <= {"ar", mode}
    assert {r.mode for o in forced for r in o.records} == {"ar", mode}
