import pytest
import torch

pytest.importorskip("transformers")

from saguaro.train.models import ModelSpec, build_model  # noqa: E402
from saguaro.train.rollouts import greedy_rollouts, repeat_mask, unlikelihood_loss  # noqa: E402

TINY = ModelSpec(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64)


def _model(seed: int = 0, vocab: int = 50):
    torch.manual_seed(seed)
    return build_model(TINY, vocab, eot_id=0)


def test_repeat_mask_marks_every_token_of_a_repeated_ngram_after_the_prefix() -> None:
    seq = torch.tensor([[1, 2, 3, 4, 5, 1, 2, 3, 4, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])
    assert repeat_mask(seq, 0)[0].tolist() == [False] * 5 + [True] * 4 + [False]
    # Tokens inside the prefix are never marked, even when they complete a repeat.
    assert repeat_mask(seq, 7)[0].tolist() == [False] * 7 + [True, True, False]
    assert not repeat_mask(seq, 0)[1].any()
    # A run of one token: each 4-gram after the first repeats it (occurrences may overlap).
    assert repeat_mask(torch.tensor([[7] * 6]), 0)[0].tolist() == [False] + [True] * 5


def test_unlikelihood_is_minus_log_one_minus_p_on_marked_tokens() -> None:
    seq = torch.tensor([[0, 1, 2]])
    logits = torch.zeros(1, 3, 4)
    logits[0, 1, 2] = 2.0  # position 1 predicts seq[2] = 2 with p = e^2 / (e^2 + 3)
    p = torch.tensor(2.0).exp() / (torch.tensor(2.0).exp() + 3)
    mask = torch.tensor([[False, False, True]])
    got = unlikelihood_loss(logits, seq, mask, start=1)
    assert torch.isclose(got, -torch.log1p(-p) / 2)  # averaged over the 2 continuation tokens
    assert unlikelihood_loss(logits, seq, torch.zeros_like(mask), start=1) == 0


def test_rollouts_equal_uncached_greedy_decoding() -> None:
    model = _model()
    prefixes = torch.randint(1, 50, (3, 5), generator=torch.Generator().manual_seed(1))
    out = greedy_rollouts(model, prefixes, 7)
    ids = prefixes
    with torch.no_grad():
        for _ in range(7):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(out, ids) and model.training  # the caller's mode is restored


def test_unlikelihood_steps_break_a_models_loops() -> None:
    """A random tiny model decodes greedily into loops; each unlikelihood step on its own
    continuations lowers that loss on them, and over the steps its greedy continuations hold
    fewer tokens in repeated 4-grams. (Which loops remain after a given step is chaotic, since
    argmax decoding turns last-bit differences between CPUs' matrix libraries into other
    continuations: the run's mean is what holds on every CPU.)"""
    model = _model(seed=3, vocab=30)
    prefixes = torch.randint(1, 30, (8, 4), generator=torch.Generator().manual_seed(2))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

    def repeats() -> float:
        return repeat_mask(greedy_rollouts(model, prefixes, 32), 4)[:, 4:].float().mean().item()

    before, during = repeats(), []
    for _ in range(30):
        seq = greedy_rollouts(model, prefixes, 32)
        mask = repeat_mask(seq, 4)
        loss = unlikelihood_loss(model(input_ids=seq).logits, seq, mask, 4)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            assert unlikelihood_loss(model(input_ids=seq).logits, seq, mask, 4) < loss
        during.append(repeats())
    assert before > 0.5 and sum(during) / len(during) < 0.85 * before
