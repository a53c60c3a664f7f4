"""Synchronous speculative decoding: an in-process draft proposes, then the target verifies.

The draft runs K single-position forwards per round (the first also catches up on tokens
committed since its last round), sampling each s_j from q_j = the draft's distribution under the
request's own temperature / top-k / top-p. q_j is handed to the verifier exactly as sampled from.
The draft's KV lives in its own pool, indexed by the engine's block tables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from saguaro.engine.model_runner import ModelRunner
from saguaro.engine.sequence import Sequence
from saguaro.sampling import SamplingParams, SamplingTensors, logits_to_probs, sample
from saguaro.speculation.base import Proposal

# (draft logits [m, V], chain indices of the m rows, depth) -> q [m, V] to sample from
ProbsFn = Callable[[torch.Tensor, list[int], int], torch.Tensor]


@dataclass
class Chain:
    """One sequence to extend by ``k`` draft tokens."""

    block_table: list[int]
    token_ids: list[int]  # committed tokens
    start: int  # first index without draft KV (<= len(token_ids) - 1)
    k: int
    params: SamplingParams
    generator: torch.Generator


def plain_probs(chains: list[Chain]) -> ProbsFn:
    def fn(logits: torch.Tensor, rows: list[int], depth: int) -> torch.Tensor:
        return logits_to_probs(
            logits, SamplingTensors.from_params([chains[i].params for i in rows])
        )

    return fn


def decode_chains(
    runner: ModelRunner, chains: list[Chain], probs_fn: ProbsFn
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Autoregressively draft ``chain.k`` tokens for every chain, batched: K forwards in all.

    Returns tokens [n, K] and the q rows they were sampled from [n, K, V]; None when every chain
    is greedy (each q is then a point mass at the argmax, which is all verification needs).
    Draft KV is written for indices ``[start, len + k - 1)``: the last proposal is never fed.
    """
    n, k_max = len(chains), max(c.k for c in chains)
    tokens = torch.zeros(n, k_max, dtype=torch.int64)
    greedy = all(c.params.greedy for c in chains)
    probs = None if greedy else torch.zeros(n, k_max, runner.config.vocab_size)
    active = [i for i, c in enumerate(chains) if c.k > 0]
    queries = [
        runner.sequence_query(
            chains[i].block_table, chains[i].start, chains[i].token_ids[chains[i].start :], 1
        )
        for i in active
    ]
    for depth in range(k_max):
        logits = runner.forward(queries)
        idx = torch.tensor(active)
        if probs is None:
            tokens[idx, depth] = logits.argmax(dim=-1)
        else:
            q = probs_fn(logits, active, depth)
            tokens[idx, depth] = sample(q, [chains[i].generator for i in active])
            probs[idx, depth] = q
        active = [i for i in active if chains[i].k > depth + 1]
        queries = [
            runner.sequence_query(
                chains[i].block_table, len(chains[i].token_ids) + depth, [int(tokens[i, depth])], 1
            )
            for i in active
        ]
    return tokens, probs


class DraftProposer:
    shares_block_table = True

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def propose(self, seqs: list[Sequence], ks: list[int]) -> Proposal:
        chains = [
            Chain(s.block_table, s.token_ids, s.num_draft_computed, k, s.params, s.generator)
            for s, k in zip(seqs, ks, strict=True)
        ]
        tokens, probs = decode_chains(self.runner, chains, plain_probs(chains))
        for s, k in zip(seqs, ks, strict=True):
            s.num_draft_computed = len(s) + k - 1
        greedy = torch.tensor([s.params.greedy for s in seqs])
        return Proposal(tokens, torch.tensor(ks), probs=probs, point_mass=greedy)

    def observe(self, seqs: list[Sequence], target_s: float) -> None:
        """SD keeps no online statistics."""

    def release(self, seq: Sequence) -> None:
        """Nothing to free: the draft's KV shares the sequence's blocks."""

    def close(self, failed: bool = False) -> None:
        """Nothing to shut down in process."""
