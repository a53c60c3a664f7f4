"""Coupled sampling: the Gumbel-max token follows p exactly, the candidate search gives the
exact argmax, verification commits the target's token whatever was proposed, and a coupled
proposal matches at least (1 - TV) / (1 + TV) of the time."""

import pytest
import torch

from saguaro.kernels import transfer
from saguaro.sampling import SamplingParams, SamplingTensors, coupled, logits_to_probs, process
from saguaro.sampling.coupled import (
    perturbed_argmax,
    perturbed_argmax_torch,
    propose_coupled,
    ranked_proposals,
    verify_coupled,
)
from saguaro.sampling.noise import gumbels, seed_tensor
from saguaro.sampling.probs import UNKNOWN, Dist
from tests.stats import assert_samples_follow

N = 200_000
PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.5),
    SamplingParams(temperature=1.3, top_k=4),
    SamplingParams(temperature=0.8, top_p=0.7),
    SamplingParams(temperature=1.0, top_k=6, top_p=0.9),
]


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def targets(n: int, z: torch.Tensor, params: SamplingParams, seed0: int = 0):
    st = SamplingTensors.from_params([params] * n)
    dist = process(z.expand(n, -1).contiguous(), st)
    seeds = seed_tensor(list(range(seed0, seed0 + n)))
    return perturbed_argmax(dist, seeds, torch.full((n,), 7))


@pytest.mark.parametrize("params", PARAMS, ids=str)
def test_perturbed_argmax_follows_the_processed_distribution(params):
    z = torch.randn(8, generator=seeded(0)) * 1.5
    p = logits_to_probs(z[None], SamplingTensors.from_params([params]))[0]
    assert_samples_follow(targets(N, z, params), p, str(params))


def test_greedy_rows_take_the_argmax():
    z = torch.tensor([0.0, 2.0, 2.0, -1.0])
    assert targets(100, z, SamplingParams(temperature=0)).tolist() == [1] * 100


def full_row_argmax(dist, seeds, pos) -> torch.Tensor:
    """The definition: every kept token given its noise, the first index among tied maxima."""
    vocab = dist.z.shape[1]
    full = dist.z.double() + gumbels(seeds[:, None], pos[:, None], torch.arange(vocab)[None])
    full.masked_fill_(dist.z < dist.thr[:, None], -torch.inf)
    return torch.where(dist.greedy, dist.argmax, full.argmax(dim=-1))


def rows_of_every_kind(vocab: int, n: int = 40, seed: int = 1):
    """Flat to peaked rows (a scale per row), under every PARAMS and greedy, some with -inf."""
    g = seeded(seed)
    z = torch.randn(n, vocab, generator=g) * torch.logspace(-2, 1.5, n)[:, None]
    z[::7, : vocab // 3] = -torch.inf
    params = [*PARAMS, SamplingParams(temperature=0), SamplingParams(temperature=1e-30)]
    st = SamplingTensors.from_params([params[i % len(params)] for i in range(n)])
    return process(z, st), seed_tensor(list(range(n))), torch.arange(n) * 5


@pytest.mark.parametrize("reads", ["free", "wait"])
@pytest.mark.parametrize("vocab", [100, 5000])
def test_candidate_search_is_the_exact_argmax(monkeypatch, vocab, reads):
    """torch's search from the largest logits equals the argmax over every token, on flat rows
    (the fallback runs) and peaked ones (it does not); also where reads wait (a GPU), which
    searches every row in full and keeps the result where the candidates could lose."""
    dist, seeds, pos = rows_of_every_kind(vocab)
    monkeypatch.setattr(transfer, "reads_wait", lambda device: reads == "wait")
    assert torch.equal(perturbed_argmax_torch(dist, seeds, pos), full_row_argmax(dist, seeds, pos))


@pytest.mark.parametrize("vocab", [7, 5000, 151_936])
def test_the_kernels_search_is_the_exact_argmax(vocab):
    """The CPU kernel (a per-token bound from the hash, logarithms only for what it leaves)
    equals the argmax over every token, tiny to Qwen-sized vocabularies, and a row's token is
    the same alone as in its batch."""
    dist, seeds, pos = rows_of_every_kind(vocab, n=40 if vocab < 100_000 else 8)
    tokens = perturbed_argmax(dist, seeds, pos)
    assert torch.equal(tokens, full_row_argmax(dist, seeds, pos))
    for i in (0, 5, 6):
        row = slice(i, i + 1)
        fields = (dist.z, dist.thr, dist.greedy, dist.argmax)
        alone = Dist(*(f[row] for f in fields), vocab, dist.valid[row])
        assert perturbed_argmax(alone, seeds[row], pos[row]).item() == tokens[i].item()


def test_verification_commits_the_targets_tokens_whatever_is_proposed():
    """Every committed token is the target's perturbed argmax at its position: accepted
    proposals equal it, and the token after them is it."""
    n, k, vocab = 2000, 3, 6
    g = seeded(2)
    z = torch.randn(n, k + 1, vocab, generator=g)
    params = PARAMS[3]
    st = SamplingTensors.from_params([params] * n)
    seeds, pos = seed_tensor(list(range(n))), torch.full((n,), 11)
    x = torch.stack(
        [perturbed_argmax(process(z[:, j], st), seeds, pos + j) for j in range(k + 1)],
        dim=1,
    )
    # proposals: the target's own tokens, mutated at random positions
    s = torch.where(
        torch.rand(n, k, generator=g) < 0.3, torch.randint(0, vocab, (n, k), generator=g), x[:, :k]
    )
    num = torch.randint(0, k + 1, (n,), generator=g)
    res = verify_coupled(z.view(-1, vocab), st, s, num, seeds, pos)
    for i in range(n):
        a, t = int(res.num_accepted[i]), int(res.next_token[i])
        assert s[i, :a].tolist() == x[i, :a].tolist()
        assert t == int(x[i, a])
        assert a == int(num[i]) or int(s[i, a]) != t
    assert not bool(res.invalid.any())
    assert 0 < float((res.num_accepted == num).float().mean()) < 1


def mixed_round(n: int, k: int, vocab: int = 16):
    """A round of n sequences: tied maxima, NaN / inf / all -inf rows at every position, a
    shuffled row layout, proposals that match the argmax for a planted prefix, uneven
    num_draft (padding -1). Returns logits, rows, proposals and num_draft."""
    gen = seeded(12)
    logits = torch.randn(n * (k + 1), vocab, generator=gen)
    logits[::7, 3] = logits.max(-1).values[::7]
    logits[5::11] = torch.nan
    logits[6::13, 2] = torch.inf
    logits[8::17] = -torch.inf
    rows = torch.randperm(n * (k + 1), generator=gen).view(n, k + 1)
    best = torch.where(logits.max(-1).values.isfinite(), logits.max(-1).indices, 0)
    planted = torch.randint(0, k + 1, (n,), generator=gen)
    s = torch.randint(0, vocab, (n, k), generator=gen)
    for i in range(n):
        s[i, : planted[i]] = best[rows[i, : planted[i]]]
    num = torch.randint(0, k + 1, (n,), generator=gen)
    s[torch.arange(k) >= num[:, None]] = -1
    return logits, rows, s, num


@pytest.mark.parametrize("facts", ["host's", "unknown"])
def test_the_gpus_coupled_verification_decides_as_the_hosts(monkeypatch, facts):
    """Where reads wait (a GPU) every position's target token is computed at once and the
    outcome chosen by tensor operators; forced here on the CPU, it must be the position loop's,
    on greedy, tempered and nucleus rows with non-finite rows among them."""
    n, k = 300, 4
    logits, rows, s, num = mixed_round(n, k)
    mix = [SamplingParams(temperature=0), SamplingParams(temperature=0.3)]
    mix.append(SamplingParams(temperature=0.8, top_p=0.9))
    st = SamplingTensors.from_params([mix[i % 3] for i in range(n)])
    seeds, pos = seed_tensor(list(range(n))), torch.arange(n) * 5
    want = verify_coupled(logits, st, s, num, seeds, pos, rows)
    monkeypatch.setattr(transfer, "reads_wait", lambda device: True)
    if facts == "unknown":
        monkeypatch.setattr(SamplingTensors, "facts", lambda self: UNKNOWN)
    got = verify_coupled(logits, st, s, num, seeds, pos, rows)
    for field in ("num_accepted", "next_token", "invalid"):
        assert getattr(got, field).tolist() == getattr(want, field).tolist(), field
    assert bool(want.invalid.any()) and bool((want.num_accepted >= 2).any())


def test_greedy_rounds_take_one_pass_and_decide_as_the_position_loop():
    """A greedy batch verifies in one pass; a greedy sequence batched with one sequence at T > 0
    goes through the per-position loop instead. Its outcome must not depend on which: planted
    matches, tied maxima, NaN / inf / all -inf rows at every position (never accepted: the
    sequence stops there, invalid), uneven num_draft and a shuffled row layout."""
    n, k = 300, 4
    logits, rows, s, num = mixed_round(n + 1, k)
    logits[rows[-1]] = torch.randn(k + 1, logits.shape[1], generator=seeded(3))  # T > 0: finite
    params = [SamplingParams(temperature=0)] * n + [SamplingParams(temperature=0.8)]
    st = SamplingTensors.from_params(params)
    seeds, pos = seed_tensor(list(range(n + 1))), torch.zeros(n + 1, dtype=torch.long)
    calls = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(coupled, "process", lambda *a: calls.append(1) or process(*a))
        alone = verify_coupled(
            logits, st.index(torch.arange(n)), s[:n], num[:n], seeds[:n], pos[:n], rows[:n]
        )
        assert calls == []  # one pass, no distribution per position
        looped = verify_coupled(logits, st, s, num, seeds, pos, rows)
        assert calls  # the T > 0 sequence sends the batch through the loop
    assert alone.num_accepted.tolist() == looped.num_accepted[:n].tolist()
    assert alone.next_token.tolist() == looped.next_token[:n].tolist()
    assert alone.invalid.tolist() == looped.invalid[:n].tolist()
    assert bool(alone.invalid.any()) and bool((alone.num_accepted == k).any())
    # a non-finite row never accepts, even a proposal equal to its stand-in argmax 0
    nan_first = [i for i in range(n) if not logits[rows[i, 0]].max().isfinite() and num[i] > 0]
    assert nan_first and all(alone.num_accepted[i] == 0 and alone.invalid[i] for i in nan_first)


def test_a_coupled_proposal_matches_at_least_the_bound():
    """P(draft's perturbed argmax == target's) >= (1 - TV) / (1 + TV) on random pairs (three
    standard errors of slack for the estimate)."""
    n, vocab = 40_000, 8
    for pair in range(6):
        g = seeded(10 + pair)
        zt = torch.randn(vocab, generator=g) * 1.5
        zd = zt + torch.randn(vocab, generator=g) * (0.3 + pair * 0.4)
        params = SamplingParams(temperature=1.0)
        x = targets(n, zt, params)
        st = SamplingTensors.from_params([params] * n)
        s, q = propose_coupled(
            zd.expand(n, -1).contiguous(), st, seed_tensor(list(range(n))), torch.full((n,), 7), 64
        )
        assert q is None
        p, qd = torch.softmax(zt, -1), torch.softmax(zd, -1)
        tv = 0.5 * float((p - qd).abs().sum())
        bound = (1 - tv) / (1 + tv)
        rate = float((s == x).double().mean())
        assert rate >= bound - 3 * (bound * (1 - bound) / n) ** 0.5, (pair, rate, bound)


def test_ranked_proposals_put_the_proposal_first_and_cover_the_support():
    z = torch.randn(5, 30, generator=seeded(3))
    st = SamplingTensors.from_params([SamplingParams(temperature=0.9, top_k=10)] * 5)
    seeds, pos = seed_tensor([1, 2, 3, 4, 5]), torch.arange(5)
    ranked = ranked_proposals(z, st, seeds, pos, 30)
    first, _ = propose_coupled(z, st, seeds, pos, 30)
    assert torch.equal(ranked[:, 0], first)
    assert all(sorted(r.tolist()) == list(range(30)) for r in ranked)
    kept = z.topk(10, dim=-1).indices
    assert all(set(ranked[i, :10].tolist()) == set(kept[i].tolist()) for i in range(5))
