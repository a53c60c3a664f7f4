"""Backups for the sequences whose outcome missed the speculation cache (docs/design.md §7).

``neural``: the draft decodes the next speculation for the real outcome now, on the target's
critical path, exactly as a cached branch would have been sampled. ``fast``: prompt lookup from
the sequence's own context (:mod:`saguaro.speculation.ngram`), no model, point masses. Either
proposes at most what still fits in the context.
"""

from __future__ import annotations

import torch

from saguaro.engine.block_manager import BlockManager
from saguaro.engine.model_runner import ModelRunner
from saguaro.sampling import SamplingTensors, SparseQ, seed_tensor
from saguaro.speculation import protocol as P
from saguaro.speculation.cache_builder import DraftSeq, room
from saguaro.speculation.ngram import prompt_lookup
from saguaro.speculation.sd import Chain, ProposeFn, decode_chains, propose_rows


def fast_backup(seq: DraftSeq, cfg: P.WorkerConfig) -> None:
    """Set ``seq.spec`` to the prompt-lookup continuation of its committed tokens."""
    seq.spec = prompt_lookup(seq.token_ids, room(seq, cfg))


def neural_backup(
    seqs: list[DraftSeq],
    runner: ModelRunner,
    bm: BlockManager,
    cfg: P.WorkerConfig,
    fanout: list[int],
) -> list[SparseQ | None]:
    """Decode each sequence's next speculation with the draft (one batched forward per token)
    into ``seq.spec``, and return the exact q of each (None: point masses, as for greedy).
    Speculation position i is drawn with Saguaro sampling at ``F_{i-1}`` of ``fanout``."""
    ks = [room(seq, cfg) for seq in seqs]
    for seq, k in zip(seqs, ks, strict=True):
        bm.allocate(seq, len(seq.token_ids) + k)
    chains = [
        Chain(
            s.block_table,
            s.token_ids,
            s.computed,
            k,
            s.params,
            s.seed,
            s.coupled,
            s.processors,
            s.num_prompt,
            s.copy_index(cfg.lookup),
        )
        for s, k in zip(seqs, ks, strict=True)
    ]
    propose_fn = _propose_fn(seqs, cfg, fanout)
    drafts = decode_chains(runner, chains, propose_fn, cfg.stop_below)
    q = drafts.q
    qs: list[SparseQ | None] = []
    for i, (seq, k) in enumerate(zip(seqs, drafts.counts, strict=True)):
        seq.spec = drafts.tokens[i, :k].tolist()
        if k:  # draft KV written for indices before fed (never past the last proposal)
            seq.written = drafts.fed[i]
            seq.computed = min(seq.written, len(seq.token_ids) - 1)
        qs.append(None if q is None or seq.params.greedy else q[i, :k].clone())
    return qs


def _propose_fn(seqs: list[DraftSeq], cfg: P.WorkerConfig, fanout: list[int]) -> ProposeFn:
    """Saguaro sampling: speculation position i = depth + 1 uses F = F_{i-1} = F_depth."""

    def fn(logits: torch.Tensor, rows: list[int], depth: int, positions: torch.Tensor):
        st = SamplingTensors.from_params([seqs[i].params for i in rows])
        seeds = seed_tensor([seqs[i].seed for i in rows])
        coupled = [seqs[i].coupled for i in rows]
        return propose_rows(
            logits, st, seeds, positions, cfg.top_m, coupled, fanout[depth], cfg.saguaro_c
        )

    return fn
