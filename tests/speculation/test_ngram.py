"""Prompt-lookup proposals for the fast backup (DESIGN §7)."""

from __future__ import annotations

import random
import time

import pytest

from saguaro.speculation.ngram import LOOKUP_MAX_NGRAM, CopyIndexes, Lookup, prompt_lookup


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
    assert lookup.index().chain(tokens, 4) == [3, 4, 9, 1]
    assert lookup.index().chain(tokens, 2) == [3, 4]
    assert lookup.index().chain(tokens, 0) == []
    # the chain ends at the first depth without a recurring suffix: (7, 8) has not occurred
    assert lookup.index().chain([7, 8], 3) == []
    rng = random.Random(0)
    for _ in range(200):
        ctx = [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
        got, want = lookup.index().chain(ctx, 5), []
        while len(want) < 5 and (t := lookup.next_token(ctx + want)) is not None:
            want.append(t)
        assert got == want


@pytest.mark.parametrize("min_ngram, max_ngram", [(1, 1), (1, 3), (2, 4), (3, 4), (4, 4)])
def test_the_index_copies_what_the_rule_copies_reading_the_whole_context(min_ngram, max_ngram):
    """Committed tokens grown by 0-3 tokens a call over 3-5 token values, each call with a tail
    of 0-8 tokens: the index, reading only what was committed since and the tail, answers as
    the rule does reading ``committed + tail``."""
    lookup = Lookup(min_ngram, max_ngram)
    rng = random.Random(10 * min_ngram + max_ngram)
    checked = copied = 0
    for _ in range(60):
        values = rng.randrange(3, 6)
        index, committed = lookup.index(), []
        for _ in range(40):
            committed += [rng.randrange(values) for _ in range(rng.randrange(4))]
            tail = [rng.randrange(values) for _ in range(rng.randrange(9))]
            want = lookup.next_token(committed + tail)
            assert index.next_token(committed, tail) == want, (committed, tail)
            checked, copied = checked + 1, copied + (want is not None)
    assert 0.1 * checked < copied < checked  # both answers were tested, many times


def test_an_index_given_fewer_committed_tokens_than_it_indexed_starts_over():
    lookup = Lookup(2)
    index = lookup.index()
    assert index.next_token([1, 2, 3, 1, 2]) == 3
    # other tokens, shorter than those indexed: (1, 2) -> 3 is forgotten
    assert index.next_token([4, 1, 2]) is None
    assert index.next_token([4, 1, 2, 5, 4, 1, 2]) == 5


def test_copy_indexes_keep_one_index_per_sequence_until_it_is_forgotten():
    indexes = CopyIndexes(Lookup(2))
    assert indexes.of(7) is indexes.of(7) and indexes.of(8) is not indexes.of(7)
    indexes.forget(7)
    indexes.forget(9)  # never seen: nothing to do
    assert set(indexes.by_seq) == {8}
