"""Fast backup (docs/design.md §7): prompt-lookup proposals from the sequence's own context.

No model runs: the proposal copies what followed the most recent earlier occurrence of the
context's last few tokens. It is deterministic, so verification uses the point-mass rule (§3).
"""

from __future__ import annotations

from collections.abc import Sequence


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
