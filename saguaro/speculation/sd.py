"""Synchronous speculative decoding: an in-process draft proposes, then the target verifies.

The draft runs K single-position forwards per round (the first also catches up on tokens
committed since its last round), sampling each s_j from q_j = the draft's distribution under the
request's own temperature / top-k / top-p. q_j is handed to the verifier exactly as sampled from.
The draft's KV lives in its own pool, indexed by the engine's block tables.
"""

from __future__ import annotations

import torch

from saguaro.engine.model_runner import ModelRunner
from saguaro.engine.sequence import Sequence
from saguaro.sampling import SamplingTensors, logits_to_probs, sample
from saguaro.speculation.base import Proposal


class DraftProposer:
    shares_block_table = True

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def propose(self, seqs: list[Sequence], ks: list[int]) -> Proposal:
        n, k_max = len(seqs), max(ks)
        vocab = self.runner.config.vocab_size
        tokens = torch.zeros(n, k_max, dtype=torch.int64)
        probs = torch.zeros(n, k_max, vocab)
        active = list(range(n))
        queries = [
            self.runner.sequence_query(
                s.block_table, s.num_draft_computed, s.token_ids[s.num_draft_computed :], 1
            )
            for s in seqs
        ]
        for depth in range(k_max):
            idx = torch.tensor(active)
            st = SamplingTensors.from_params([seqs[i].params for i in active])
            q = logits_to_probs(self.runner.forward(queries), st)
            drawn = sample(q, [seqs[i].generator for i in active])
            tokens[idx, depth] = drawn
            probs[idx, depth] = q
            active = [i for i in active if ks[i] > depth + 1]
            queries = [
                self.runner.sequence_query(
                    seqs[i].block_table, len(seqs[i]) + depth, [int(tokens[i, depth])], 1
                )
                for i in active
            ]
        for s, k in zip(seqs, ks, strict=True):
            s.num_draft_computed = len(s) + k - 1
        greedy = torch.tensor([s.params.greedy for s in seqs])
        return Proposal(tokens, torch.tensor(ks), probs=probs, point_mass=greedy)

    def release(self, seq: Sequence) -> None:
        """Nothing to free: the draft's KV shares the sequence's blocks."""

    def close(self) -> None:
        """Nothing to shut down in process."""
