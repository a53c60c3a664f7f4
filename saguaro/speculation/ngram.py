"""Copies from the sequence's own context: SSD's fast backup (docs/design.md §7), the draft
chains' copies and SD with copies alone (§3, "Copies"), and an index of a sequence's n-grams
that answers the chains' rule without reading the whole context.

No model runs: the proposal copies what followed the most recent earlier occurrence of the
context's last few tokens. It is deterministic, so verification uses the point-mass rule (§3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The longest context suffix a draft chain's lookup matches: longer matches are rarer and, on the
# held-out text of docs/bench/draft, no more often right.
LOOKUP_MAX_NGRAM = 4


def prompt_lookup(
    tokens: Sequence[int], k: int, max_ngram: int = 3, min_ngram: int = 1
) -> list[int]:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of the longest suffix of
    ``tokens`` of length n in [min_ngram, max_ngram]; [] when no such suffix recurs.

    Equivalently: among positions i < len - 1 with tokens[i] equal to the last token, take the one
    whose backward match with the suffix is longest (capped at max_ngram), the most recent on ties,
    and propose tokens[i+1 : i+1+k] (never past the end of the context).
    """
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
    n = len(tokens)
    if k <= 0 or n < 2:
        return []
    # Scan the reversed context so list.index finds the candidates, most recent first, in C.
    rev = list(tokens)[::-1]
    last = rev[0]
    best_len, best_end = 0, -1
    j = 0
    while best_len < max_ngram:
        try:
            j = rev.index(last, j + 1)
        except ValueError:
            break
        m, limit = 1, min(max_ngram, n - j)
        while m < limit and rev[j + m] == rev[m]:
            m += 1
        if m > best_len:
            best_len, best_end = m, n - 1 - j
    if best_len < min_ngram:
        return []
    return list(tokens[best_end + 1 : best_end + 1 + k])


@dataclass(frozen=True)
class Lookup:
    """Context lookup inside a draft's chain (docs/design.md §3, "Copies"): where the chain's
    context, committed and drafted tokens, ends in an n-gram of ``min_ngram`` or more tokens that
    occurred earlier in it, the next proposal is the token that followed its most recent
    occurrence, a point mass, and the draft runs only where there is none."""

    min_ngram: int
    max_ngram: int = LOOKUP_MAX_NGRAM

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(
                f"lookup needs 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}"
            )

    def next_token(self, tokens: Sequence[int]) -> int | None:
        """The token this rule copies after ``tokens``; None where no suffix recurs."""
        got = prompt_lookup(tokens, 1, self.max_ngram, self.min_ngram)
        return got[0] if got else None

    def index(self) -> CopyIndex:
        """This rule for one sequence, its committed tokens indexed as they grow."""
        return CopyIndex(self)

    @classmethod
    def of(cls, min_ngram: int) -> Lookup | None:
        """The rule for a ``--draft-lookup`` setting: None for 0 (no lookup)."""
        return cls(min_ngram, max(min_ngram, LOOKUP_MAX_NGRAM)) if min_ngram else None


class CopyIndex:
    """:meth:`Lookup.next_token` for one sequence, after its committed tokens and a short tail
    (the drafted or branch tokens after them), without reading the whole context: the n-grams of
    the committed tokens, n from ``min_ngram`` to ``max_ngram``, are indexed as the tokens
    arrive, each at its most recent end. The committed tokens must only grow (they do); a
    shorter list than the one indexed is indexed afresh.

    Why it equals the rule on ``committed + tail`` (C and T tokens, L = C + T): the rule copies
    after the most recent end i <= L - 2 of the longest n-gram (n <= max_ngram) ending the
    context that occurred before. Trying n downwards, the first n with an occurrence is that
    longest one; its most recent end is either in the tail's reach (C - 1 <= i <= L - 2: at
    most T + 1 ends, compared directly, latest first) or at i <= C - 2, where an n-gram lies
    wholly in the committed tokens and the index holds its latest end."""

    def __init__(self, lookup: Lookup) -> None:
        self.lookup = lookup
        self.indexed = 0  # n-grams ending before this committed index are in `latest`
        self.latest: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(lookup.max_ngram, lookup.min_ngram - 1, -1)
        }

    def next_token(self, committed: list[int], tail: Sequence[int] = ()) -> int | None:
        """The token the rule copies after ``committed + tail``; None where none recurs."""
        self._index(committed)
        c = len(committed)
        size = c + len(tail)
        # enough committed tokens for an n-gram ending at C - 1, then the tail
        start = max(0, c - self.lookup.max_ngram)
        window = committed[start:] + list(tail)
        for n, latest in self.latest.items():
            if size <= n:
                continue
            suffix = window[-n:]
            for i in range(size - 2 - start, max(c - 1, n - 1) - 1 - start, -1):
                if window[i - n + 1 : i + 1] == suffix:
                    return window[i + 1]
            end = latest.get(tuple(suffix))
            if end is not None:
                return committed[end + 1]
        return None

    def chain(self, committed: list[int], k: int) -> list[int]:
        """Up to ``k`` copies in a row after ``committed``, each made after the ones before it;
        the chain ends at the first depth with none."""
        out: list[int] = []
        while len(out) < k and (t := self.next_token(committed, out)) is not None:
            out.append(t)
        return out

    def _index(self, committed: list[int]) -> None:
        """Index the n-grams ending at committed indices up to C - 2 (the one ending at C - 1 is
        the context's own suffix when the tail is empty: no earlier occurrence)."""
        end = len(committed) - 1
        if end < self.indexed:
            self.indexed = 0
            for latest in self.latest.values():
                latest.clear()
        for i in range(self.indexed, end):
            for n, latest in self.latest.items():
                if i >= n - 1:
                    latest[tuple(committed[i - n + 1 : i + 1])] = i
        self.indexed = max(self.indexed, end)


class CopyIndexes:
    """A :class:`CopyIndex` per sequence id, made on first use; ``forget`` a sequence when it
    ends."""

    def __init__(self, lookup: Lookup) -> None:
        self.lookup = lookup
        self.by_seq: dict[int, CopyIndex] = {}

    def of(self, seq_id: int) -> CopyIndex:
        if (index := self.by_seq.get(seq_id)) is None:
            index = self.by_seq[seq_id] = self.lookup.index()
        return index

    def forget(self, seq_id: int) -> None:
        self.by_seq.pop(seq_id, None)
