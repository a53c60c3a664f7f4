"""Copies from the sequence's own context: SSD's fast backup (docs/design.md §7), the draft
chains' copies and SD with copies alone (§3, "Copies"), and an incremental index of where the
chains' rule finds one.

No model runs: the proposal copies what followed the most recent earlier occurrence of the
context's last few tokens. It is deterministic, so verification uses the point-mass rule (§3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The longest context suffix a draft chain's lookup matches: longer matches are rarer and, on the
# held-out text of docs/bench-draft, no more often right.
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

    def chain(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` copies in a row after ``tokens``, each made after the ones before it; the
        chain ends at the first depth with none."""
        out: list[int] = []
        while len(out) < k and (t := self.next_token([*tokens, *out])) is not None:
            out.append(t)
        return out

    def recurrence(self) -> Recurrence:
        """An incremental index of whether this rule finds a copy after a sequence's tokens."""
        return Recurrence(self.min_ngram)

    @classmethod
    def of(cls, min_ngram: int) -> Lookup | None:
        """The rule for a ``--draft-lookup`` setting: None for 0 (no lookup)."""
        return cls(min_ngram, max(min_ngram, LOOKUP_MAX_NGRAM)) if min_ngram else None


class Recurrence:
    """Whether a sequence's context ends in an n-gram of ``n`` tokens that occurred earlier in
    it, kept per sequence as its tokens grow: each call indexes only the tokens added since the
    last, where :meth:`Lookup.next_token` reads the whole context. A :class:`Lookup` whose
    shortest n-gram is ``n`` copies exactly where this holds (a longer recurring suffix contains
    a recurring one of ``n`` tokens). A sequence's tokens must only grow (committed tokens do);
    ``forget`` it when it ends."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.seen: dict[int, tuple[int, set[tuple[int, ...]]]] = {}  # id -> (indexed, n-grams)

    def recurs(self, seq_id: int, tokens: Sequence[int]) -> bool:
        """Whether ``tokens`` (sequence ``seq_id``'s) end in an n-gram that occurred before."""
        indexed, grams = self.seen.get(seq_id, (0, set()))
        if indexed > len(tokens):  # not the tokens indexed before: start over
            indexed, grams = 0, set()
        # the n-grams ending before the last token: the suffix itself is no earlier occurrence
        for end in range(max(indexed, self.n - 1), len(tokens) - 1):
            grams.add(tuple(tokens[end - self.n + 1 : end + 1]))
        self.seen[seq_id] = (max(indexed, len(tokens) - 1), grams)
        return len(tokens) > self.n and tuple(tokens[-self.n :]) in grams

    def forget(self, seq_id: int) -> None:
        self.seen.pop(seq_id, None)
