"""SD without a draft model (``draft="lookup"``, docs/design.md §3, "Copies alone"): every
proposal is a copy from the sequence's own context."""

from __future__ import annotations

import torch

from saguaro.core.proposal import Proposal, Proposer
from saguaro.core.sequence import Sequence
from saguaro.speculation.ngram import CopyIndexes, Lookup


class LookupProposer(Proposer):
    """Proposes for each sequence the chain of copies ``lookup`` makes from its context: up to k
    tokens, ending where the context (committed tokens, then the chain) ends in no recurring
    suffix. A copy is a point mass, so q is None and verification is exact as for any proposal
    (docs/design.md §3): s is accepted with probability p(s), and on rejection the recovery token
    is drawn from p with s removed. No model runs and no KV is kept; an index of each sequence's
    n-grams, kept as it grows, finds the copies without reading their contexts."""

    def __init__(self, lookup: Lookup) -> None:
        self.copies = CopyIndexes(lookup)

    def has_copy(self, seq: Sequence) -> bool:
        """Whether ``seq``'s context has a copy now (then its chain runs to k: docs/design.md
        §3, "Copies")."""
        return self.copies.of(seq.seq_id).next_token(seq.token_ids) is not None

    def propose(self, seqs: list[Sequence], ks: list[int]) -> Proposal:
        of = self.copies.of
        chains = [of(s.seq_id).chain(s.token_ids, k) for s, k in zip(seqs, ks, strict=True)]
        tokens = torch.zeros(len(seqs), max(ks, default=0), dtype=torch.int64)
        for row, chain in zip(tokens, chains, strict=True):
            row[: len(chain)] = torch.tensor(chain, dtype=torch.int64)
        counts = torch.tensor([len(c) for c in chains], dtype=torch.int64)
        return Proposal(tokens, counts, mode="lookup")

    def release(self, seq: Sequence) -> None:
        self.copies.forget(seq.seq_id)
