"""Prompt-lookup proposals for the fast backup (DESIGN §7)."""

from __future__ import annotations

import random
import time

import pytest

from saguaro.speculation.ngram import LOOKUP_MAX_NGRAM, Lookup, prompt_lookup


def test_longest_suffix_most_recent_occurrence():
    # Suffix (1, 2, 3) occurred at 0 and 6; the most recent (6) is followed by 7, 8.
    tokens = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert prompt_lookup(tokens, 2) == [7, 8]
    # A longer match beats a more recent shorter one: (2, 3) recurs last at 7, but (1, 2, 3) too.
    tokens = [1, 2, 3, 4, 0, 9, 2, 3, 5, 1, 2, 3]
    assert prompt_lookup(tokens, 1) == [4]
    assert prompt_lookup(tokens, 1, max_ngram=2) == [5]
    # Only a unigram recurs: its most recent occurrence.
    assert prompt_lookup([5, 1, 6, 5, 2, 8, 5], 3) == [2, 8, 5]


def test_no_match():
    assert prompt_lookup([1, 2, 3, 4], 3) == []
    assert prompt_lookup([7], 3) == []
    assert prompt_lookup([], 3) == []
    # A unigram match does not count when min_ngram asks for more.
    assert prompt_lookup([5, 1, 6, 5], 3, min_ngram=2) == []


def test_respects_k_and_end():
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    assert prompt_lookup(tokens, 3) == [3, 4, 5]
    assert prompt_lookup(tokens, 0) == []
    # The match sits just before the end: the proposal is cut at the end of the context.
    assert prompt_lookup([4, 4, 4, 4], 5) == [4]
    assert prompt_lookup([1, 2, 9, 1, 2], 10) == [9, 1, 2]


def test_rejects_bad_ngram_range():
    with pytest.raises(ValueError):
        prompt_lookup([1, 2], 1, max_ngram=1, min_ngram=2)


def test_fast_on_long_context():
    rng = random.Random(0)
    tokens = [rng.randrange(50) for _ in range(4096)]
    start = time.perf_counter()
    for _ in range(20):
        prompt_lookup(tokens, 5)
    # < 1 ms each when the machine is idle; generous bound for a shared CI core.
    assert (time.perf_counter() - start) / 20 < 5e-3


def test_a_chains_lookup_copies_after_recurring_ngrams_of_its_minimum_length():
    two = Lookup.of(2)
    assert two == Lookup(2, LOOKUP_MAX_NGRAM)
    # "1 2" recurs: what followed its most recent earlier occurrence
    assert two.next_token([1, 2, 3, 9, 1, 2, 4, 1, 2]) == 4
    # only "2" recurs: too short for two, enough for one
    assert two.next_token([1, 2, 3, 5, 2]) is None
    assert Lookup.of(1).next_token([1, 2, 3, 5, 2]) == 3
    # the longest recurring suffix wins over a more recent shorter one
    assert two.next_token([7, 1, 2, 3, 8, 1, 2, 5, 7, 1, 2]) == 3
    assert Lookup.of(0) is None
    assert Lookup.of(6) == Lookup(6, 6)
    with pytest.raises(ValueError, match="min_ngram"):
        Lookup(3, 2)


def test_a_chain_of_copies_is_each_copy_after_the_ones_before():
    lookup = Lookup(2)
    tokens = [5, 1, 2, 3, 4, 9, 1, 2]
    # (1, 2) -> 3, then (2, 3) -> 4, then (3, 4) -> 9, then (4, 9) -> 1
    assert lookup.chain(tokens, 4) == [3, 4, 9, 1]
    assert lookup.chain(tokens, 2) == [3, 4]
    assert lookup.chain(tokens, 0) == []
    # the chain ends at the first depth without a recurring suffix: (7, 8) has not occurred
    assert lookup.chain([7, 8], 3) == []
    rng = random.Random(0)
    for _ in range(200):
        ctx = [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
        got, want = lookup.chain(ctx, 5), []
        while len(want) < 5 and (t := lookup.next_token(ctx + want)) is not None:
            want.append(t)
        assert got == want


@pytest.mark.parametrize("n", [1, 2, 3])
def test_the_incremental_recurrence_finds_a_copy_exactly_where_the_lookup_does(n):
    """Sequences grown by 0-3 tokens a call over 5 token values: the index, reading only what
    was added, answers as the lookup does reading the whole context."""
    lookup = Lookup.of(n)
    rng = random.Random(n)
    for _ in range(100):
        index, tokens = lookup.recurrence(), []
        for _ in range(40):
            tokens += [rng.randrange(5) for _ in range(rng.randrange(4))]
            assert index.recurs(7, tokens) == (lookup.next_token(tokens) is not None), tokens
    index.recurs(8, [1, 2, 1, 2])
    index.forget(7)
    assert set(index.seen) == {8}
    # other tokens under a known id (shorter than those indexed): indexed afresh
    assert index.recurs(8, [3, 4]) is False and index.recurs(8, [3, 4, 5, 3, 4, 5]) is True
