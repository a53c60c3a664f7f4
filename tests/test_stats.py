"""The statistical checks have the power they state: a sampler biased by the stated resolution
is caught, a correct one passes (tests/stats.py)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import FIRST_TWO_SAMPLES, SMALL_VOCAB
from tests.stats import MAX_RESOLUTION, assert_first_two_follow, tv_distance, tv_resolution

TRIALS = 200


def _laws(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A law of two tokens [V, V], and one at TV distance MAX_RESOLUTION from it that moves
    first-token mass from the likeliest token to the least likely (the second's conditional law
    kept)."""
    g = torch.Generator().manual_seed(seed)
    first = torch.distributions.Dirichlet(torch.ones(SMALL_VOCAB)).sample()
    second = torch.softmax(2 * torch.randn(SMALL_VOCAB, SMALL_VOCAB, generator=g), dim=1)
    biased = first.clone()
    biased[first.argmax()] -= MAX_RESOLUTION
    biased[first.argmin()] += MAX_RESOLUTION
    return first[:, None] * second, biased[:, None] * second


def _caught(counts: torch.Tensor, law: torch.Tensor) -> bool:
    try:
        assert_first_two_follow(counts, law)
    except AssertionError:
        return True
    return False


def test_the_stated_resolution_of_the_first_two_check_holds():
    assert tv_resolution(SMALL_VOCAB, FIRST_TWO_SAMPLES) <= MAX_RESOLUTION
    torch.manual_seed(0)
    law, biased = _laws(0)
    assert tv_distance(biased.flatten(), law.flatten()) == pytest.approx(MAX_RESOLUTION)
    draw = torch.distributions.Multinomial(FIRST_TWO_SAMPLES, probs=biased.flatten())
    caught = sum(_caught(draw.sample().view_as(law), law) for _ in range(TRIALS))
    assert caught >= 0.99 * TRIALS  # the resolution's promise: at least 99% of the time
    fair = torch.distributions.Multinomial(FIRST_TWO_SAMPLES, probs=law.flatten())
    assert not any(_caught(fair.sample().view_as(law), law) for _ in range(TRIALS))


def test_too_few_samples_for_the_resolution_is_itself_a_failure():
    law, _ = _laws(1)
    counts = torch.distributions.Multinomial(1_000, probs=law.flatten()).sample().view_as(law)
    with pytest.raises(AssertionError, match="1000 samples resolve"):
        assert_first_two_follow(counts, law)
