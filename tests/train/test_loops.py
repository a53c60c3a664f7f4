import math

import numpy as np
import pytest
import torch

from saguaro.train.loops import SEGMENT, ditto_loss, pseudo_repeats


def test_pseudo_repeats_are_a_corpus_prefix_then_the_next_segment_repeated() -> None:
    tokens = np.arange(1000, dtype=np.uint16)  # every token tells where it came from
    seq, periods = pseudo_repeats(tokens, step=3, rows=16, prefix=5, seed=1, length=60)
    assert seq.shape == (16, 60) and periods.shape == (16,)
    assert SEGMENT[0] <= periods.min() and periods.max() <= SEGMENT[1]
    for row, n in zip(seq.tolist(), periods.tolist(), strict=True):
        start = row[0]
        assert row[:5] == list(range(start, start + 5))
        assert row[5 : 5 + n] == list(range(start + 5, start + 5 + n))
        assert all(row[t] == row[t - n] for t in range(5 + n, 60))
    again, _ = pseudo_repeats(tokens, step=3, rows=16, prefix=5, seed=1, length=60)
    other, _ = pseudo_repeats(tokens, step=4, rows=16, prefix=5, seed=1, length=60)
    assert torch.equal(seq, again) and not torch.equal(seq, other)


def test_ditto_loss_by_hand() -> None:
    # prefix 1, period 2: seq = x a b a b; tokens 3 and 4 are repeats of tokens 1 and 2.
    seq = torch.tensor([[0, 1, 2, 1, 2]])
    logits = torch.randn(1, 5, 4, generator=torch.Generator().manual_seed(0))
    p = logits.softmax(-1)[0, torch.arange(4), seq[0, 1:]]  # p[t]: probability of seq[t + 1]
    lam = 0.5
    want = -(math.log(1 - abs(p[2] - lam * p[0])) + math.log(1 - abs(p[3] - lam * p[1]))) / 2
    got = ditto_loss(logits, seq, torch.tensor([2]), prefix=1, lam=lam)
    assert got.item() == pytest.approx(want, rel=1e-5)
    # The previous occurrence is a fixed target: no gradient reaches it.
    logits.requires_grad_(True)
    ditto_loss(logits, seq, torch.tensor([2]), prefix=1, lam=lam).backward()
    assert logits.grad[0, :2].abs().sum() == 0 and logits.grad[0, 2:4].abs().sum() > 0


def test_minimising_ditto_makes_a_loop_decay_geometrically() -> None:
    """Free logits that repeat a segment with near certainty (a loop) settle where each
    occurrence is lambda times as likely as the one before; the first is left alone."""
    n, reps, lam = 3, 4, 0.5
    seq = torch.tensor([[0] + [1, 2, 3] * reps])
    logits = torch.zeros(1, seq.size(1), 8)
    logits[0, torch.arange(seq.size(1) - 1), seq[0, 1:]] = 6.0  # every next token at p ~ 0.98
    logits.requires_grad_(True)
    opt = torch.optim.Adam([logits], lr=0.05)
    for _ in range(400):
        loss = ditto_loss(logits, seq, torch.tensor([n]), prefix=1, lam=lam)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        p = logits[0, :-1].softmax(-1)[torch.arange(seq.size(1) - 1), seq[0, 1:]]
    by_occurrence = p.reshape(reps, n)
    want = by_occurrence[0] * lam ** torch.arange(reps)[:, None]
    assert by_occurrence[0].min() > 0.97  # the first occurrence carries no loss
    assert torch.allclose(by_occurrence, want, atol=0.02)
