"""Synchronous speculative decoding: an in-process draft proposes, then the target verifies.

The draft runs up to K single-position forwards per round (the first also catches up on tokens
committed since its last round, or copied in the last; a round that would first read a new
prompt proposes nothing, so the first token waits for no draft), sampling each s_j from q_j = the
draft's distribution under the request's own temperature / top-k / top-p, restricted to its
top-M tokens and renormalised, with the request's draft noise at s_j's position. q_j is handed
to the verifier exactly as sampled from, as M (id, probability) pairs. Under coupled sampling
s_j is q_j's perturbed argmax under the target's noise at that position instead, and no q is
needed. Where the context recurs, s_j is copied from it instead (docs/design.md §3, "Copies"):
a point mass, and no forward. The draft's KV lives in its own pool, indexed by the engine's
block tables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from saguaro.core.proposal import Proposal, Proposer
from saguaro.core.query import Query
from saguaro.core.sequence import Sequence
from saguaro.engine.model_runner import ModelRunner
from saguaro.kernels import transfer
from saguaro.sampling import SamplingParams, SamplingTensors, SparseQ, propose, seed_tensor
from saguaro.sampling.coupled import propose_coupled
from saguaro.sampling.processors import Processors, RowsOf, process_rows
from saguaro.sampling.reduce import argmax_rows, top_probability_rows
from saguaro.speculation.ngram import CopyIndex, CopyIndexes, Lookup

# The longest prompt whose first round still proposes: a longer one's would delay the first token
# by the draft's prefill of the whole prompt, which the next round catches up after it; up to
# this many tokens that is a few draft steps' work.
PREFILL_CATCH_UP = 32
# (draft logits [m, V], chain indices of the m rows, depth, positions [m]) -> tokens, q (None:
# the proposals need no q, as under coupled sampling)
ProposeFn = Callable[
    [torch.Tensor, list[int], int, torch.Tensor], tuple[torch.Tensor, SparseQ | None]
]


@dataclass
class Chain:
    """One sequence to extend by ``k`` draft tokens."""

    block_table: list[int]
    token_ids: list[int]  # committed tokens
    start: int  # first index without draft KV (<= len(token_ids) - 1)
    k: int
    params: SamplingParams
    seed: int
    coupled: bool = False  # coupled sampling: propose q's perturbed argmax, no q needed
    processors: Processors | None = None  # the request's, applied to the draft's rows too
    num_prompt: int = 0  # token_ids[num_prompt:] are generated (what the processors count)
    copies: CopyIndex | None = None  # its context's copies (docs/design.md §3); None: no lookup

    def tail(self, start: int, drafted: list[int]) -> list[int]:
        """The chain's context, its committed tokens then ``drafted``, from index ``start``."""
        return self.token_ids[start:] + drafted[max(0, start - len(self.token_ids)) :]

    def rows_of(self, row: int, drafted: list[int]) -> RowsOf:
        """The draft's ``row`` after ``drafted``, to be processed as the target will process
        its row there: proposals the target's processors refuse would only be rejected."""
        assert self.processors is not None
        return RowsOf(self.processors, self.token_ids[self.num_prompt :], [row], [drafted])


def plain_proposals(chains: list[Chain], top_m: int) -> ProposeFn:
    """Each chain's own transforms, its top ``top_m`` tokens, its seed's noise."""

    def fn(logits: torch.Tensor, rows: list[int], depth: int, positions: torch.Tensor):
        st = SamplingTensors.from_params([chains[i].params for i in rows])
        seeds = seed_tensor([chains[i].seed for i in rows])
        return propose_rows(logits, st, seeds, positions, top_m, [chains[i].coupled for i in rows])

    return fn


def propose_rows(
    logits: torch.Tensor,
    st: SamplingTensors,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    top_m: int,
    coupled: list[bool],
    fanout: torch.Tensor | int = 0,
    saguaro_c: float = 1.0,
) -> tuple[torch.Tensor, SparseQ | None]:
    """Proposals for rows that each follow their own method: a draw from q under rejection
    sampling (q returned for those rows), q's perturbed argmax under coupled sampling (their q
    entries are point masses, never read). None for q when every row is coupled."""
    if all(coupled):
        return propose_coupled(logits, st, seeds, positions, top_m)
    if not any(coupled):
        return propose(logits, st, seeds, positions, top_m, fanout, saguaro_c)
    c = torch.tensor(coupled, device=logits.device)
    r = ~c
    tokens, q = propose(
        logits[r], st.index(r.cpu()), seeds[r], positions[r], top_m, fanout, saguaro_c
    )
    out = torch.empty(len(coupled), dtype=torch.int64, device=logits.device)
    out[r] = tokens
    out[c] = propose_coupled(logits[c], st.index(c.cpu()), seeds[c], positions[c], top_m)[0]
    full = SparseQ.point_mass(out, q.width)
    full.ids[r], full.probs[r] = q.ids, q.probs
    return out, full


class Drafted:
    """The tokens drafted so far, [n, K]. On the host each depth's are read back at once, as
    ints: the next depth's queries and the requests' processors take them so, and a few list
    writes cost less than the tensor operators they replace. Where a read waits for the device
    (a GPU) and nothing on the host reads them (processors, the lookup, the stop), they stay
    there: the next depth's forward takes its input ids from the last depth's tokens (the
    queries' host ids are placeholders), and all are read once, after the last depth."""

    def __init__(self, n: int, k_max: int, device: torch.device, on_device: bool) -> None:
        self.lists = [[0] * k_max for _ in range(n)]
        self.on_device = (
            torch.zeros(n, k_max, dtype=torch.int64, device=device) if on_device else None
        )
        self.last: tuple[list[int], torch.Tensor] | None = None  # (chains, their tokens)

    def record(
        self, active: list[int], depth: int, drawn: torch.Tensor, idx: torch.Tensor | None
    ) -> None:
        """Depth ``depth``'s tokens ``drawn`` of chains ``active`` (``idx`` on their device
        where they stay there)."""
        if self.on_device is None:
            for i, t in zip(active, drawn.tolist(), strict=True):
                self.lists[i][depth] = t
        else:
            self.on_device[idx, depth] = drawn
            self.last = (active, drawn)

    def forward(self, runner: ModelRunner, queries: list[Query], active: list[int]) -> torch.Tensor:
        """The draft's logits for the next depth's ``queries`` (of chains ``active``)."""
        if self.last is None:
            return runner.forward(queries)
        before, drawn = self.last
        at = {c: r for r, c in enumerate(before)}
        rows = _on([at[c] for c in active], drawn.device)
        return runner.run(replace(runner.prepare(queries), input_ids=drawn[rows]))

    def tokens(self) -> torch.Tensor:
        if self.on_device is None:
            return torch.tensor(self.lists, dtype=torch.int64)
        return self.on_device.cpu()


def _on(ints: list[int], device: torch.device) -> torch.Tensor:
    """``ints`` as an int64 tensor on ``device`` (a non-blocking copy to a GPU)."""
    return transfer.upload([torch.tensor(ints, dtype=torch.int64)], device)[0]


@dataclass
class Drafts:
    """What :func:`decode_chains` drafted: tokens [n, K]; the q they were sampled from
    [n, K, M] (None: every proposal is a point mass); per chain, the proposals made (the first
    ``counts[i]`` of its row) and the first index of its context without draft KV."""

    tokens: torch.Tensor
    q: SparseQ | None
    counts: list[int]
    fed: list[int]


def decode_chains(
    runner: ModelRunner,
    chains: list[Chain],
    propose_fn: ProposeFn,
    stop_below: float = 0.0,
) -> Drafts:
    """Autoregressively draft up to ``chain.k`` tokens for every chain, batched: at most K
    forwards. A chain stops before a drafted proposal j > 1 whose draft row puts less than
    ``stop_below`` on its likeliest token (``top_probability_rows`` of the processed logits, as
    SSD's branches read them): that proposal would likely be rejected and would cost its
    verification position. The stop depends on the draft's rows only, never on the target, so
    every rule of verification still holds.

    q is None when every chain is greedy (each q is then a point mass at the argmax, which is
    all verification needs) or the proposals need no q (coupled sampling). Where a chain's
    ``copies`` copy a depth's proposal from its context (a point mass, docs/design.md §3), the
    chain skips that depth's forward; its next forward feeds the copied tokens with its own.
    The lookup reads the context on the host, so each depth's tokens come back there even where
    that waits for the device.
    Draft KV is written for indices ``[start, fed)``, ``fed <= len + k - 1``: the last proposal
    is never fed.
    """
    n, k_max = len(chains), max(c.k for c in chains)
    drafted = Drafted(n, k_max, runner.device, _stays(runner, chains, stop_below))
    q: SparseQ | None = None
    fed = [c.start for c in chains]
    counts = [c.k for c in chains]
    copied: list[tuple[int, int, int]] = []  # (chain, depth, token)
    active = [i for i, c in enumerate(chains) if c.k > 0]
    for depth in range(k_max):
        copies = _copies(chains, drafted, active, depth)
        run = [i for i in active if i not in copies]
        if run:
            q, logits = _draft_depth(runner, chains, drafted, run, depth, fed, propose_fn, q)
            if stop_below and depth:
                for i, p in zip(run, top_probability_rows(logits), strict=True):
                    if p < stop_below:
                        counts[i] = depth
        for i, t in copies.items():
            drafted.lists[i][depth] = t
            copied.append((i, depth, t))
        active = [i for i in active if counts[i] > depth + 1]
    if q is not None and copied:  # point masses at the copies, in q's blank rows
        at = torch.tensor(copied, dtype=torch.int64, device=q.device).T
        q.ids[at[0], at[1], 0] = at[2]
    return Drafts(drafted.tokens(), q, counts, fed)


def _stays(runner: ModelRunner, chains: list[Chain], stop_below: float) -> bool:
    """Whether the drafted tokens stay on the device until the last depth (:class:`Drafted`):
    where reading them back waits for it and nothing on the host reads them between depths
    (no lookup copies, no processors, no stop)."""
    return (
        all(c.copies is None for c in chains)
        and transfer.reads_wait(runner.device)
        and all(c.processors is None for c in chains)
        and not stop_below
    )


def _copies(chains: list[Chain], drafted: Drafted, active: list[int], depth: int) -> dict[int, int]:
    """The chains whose proposal at ``depth`` their ``copies`` copy from their context, and it."""
    found: dict[int, int] = {}
    for i in active:
        copies = chains[i].copies
        if copies is not None:
            t = copies.next_token(chains[i].token_ids, drafted.lists[i][:depth])
            if t is not None:
                found[i] = t
    return found


def _draft_depth(
    runner: ModelRunner,
    chains: list[Chain],
    drafted: Drafted,
    run: list[int],
    depth: int,
    fed: list[int],
    propose_fn: ProposeFn,
    q: SparseQ | None,
) -> tuple[SparseQ | None, torch.Tensor]:
    """One draft forward for chains ``run`` at ``depth``: feeds each its context from
    ``fed[i]``, records the tokens it proposes and their q rows (allocated on the first rows
    that need one). Returns q and the processed logits."""
    queries = [
        runner.sequence_query(
            chains[i].block_table, fed[i], chains[i].tail(fed[i], drafted.lists[i][:depth]), 1
        )
        for i in run
    ]
    logits = drafted.forward(runner, queries, run)
    jobs = [
        chains[i].rows_of(r, drafted.lists[i][:depth])
        for r, i in enumerate(run)
        if chains[i].processors is not None
    ]
    if jobs:
        logits = process_rows(logits.float().clone(), jobs)
    # the chains' rows on the logits' device, where tokens or q are written there
    idx = _on(run, logits.device) if drafted.on_device is not None else None
    if all(c.params.greedy for c in chains):
        drawn = argmax_rows(logits)
    else:
        positions = torch.tensor([len(chains[i].token_ids) + depth for i in run])
        drawn, q_rows = propose_fn(logits, run, depth, positions)
        if q_rows is not None:  # kept on the logits' device: the verifier reads it there
            if q is None:
                k_max = len(drafted.lists[0])
                blank = torch.zeros(len(chains), k_max, dtype=torch.int64, device=logits.device)
                q = SparseQ.point_mass(blank, q_rows.width)
            idx = _on(run, logits.device) if idx is None else idx
            q.ids[idx, depth], q.probs[idx, depth] = q_rows.ids, q_rows.probs
    drafted.record(run, depth, drawn, idx)
    for i in run:
        fed[i] = len(chains[i].token_ids) + depth
    return q, logits


class DraftProposer(Proposer):
    """SD: an in-process draft whose KV pool is indexed by the engine's block tables."""

    def __init__(
        self,
        runner: ModelRunner,
        top_m: int,
        sampling: str,
        lookup: Lookup | None = None,
        stop_below: float = 0.0,
    ) -> None:
        self.runner = runner
        self.top_m = top_m
        self.sampling = sampling  # the engine's method; a request may name its own
        self.copies = CopyIndexes(lookup) if lookup is not None else None
        self.stop_below = stop_below  # decode_chains' confidence stop
        self.computed: dict[int, int] = {}  # seq_id -> tokens with draft KV (committed + proposed)

    def draft_ready(self, seq: Sequence) -> int:
        # KV of proposals past the last accepted one belongs to rejected tokens, and a sequence
        # the draft has not seen since admission has draft KV only in the leading cached blocks
        # that hold it (a block is cached once the target's KV is in it; BlockManager).
        admitted = seq.draft_blocks * self.runner.block_size
        return min(self.computed.get(seq.seq_id, admitted), len(seq) - 1)

    @staticmethod
    def defers(seq: Sequence) -> bool:
        """Whether ``seq``'s round proposes nothing: it is the request's first, which prefills
        its prompt, and the prompt is longer than ``PREFILL_CATCH_UP`` tokens, which the draft
        would read first, on the path to the first token. The draft catches up in the next
        round, once that token is out. (The request alone decides, not what the caches hold, so
        a seeded request's rounds, and so its text, are the same on every run.)"""
        return seq.num_output_tokens == 0 and seq.num_prompt_tokens > PREFILL_CATCH_UP

    def propose(self, seqs: list[Sequence], ks: list[int]) -> Proposal:
        ks = [0 if self.defers(s) else k for s, k in zip(seqs, ks, strict=True)]
        chains = [
            Chain(
                s.block_table,
                s.token_ids,
                self.draft_ready(s),
                k,
                s.params,
                s.seed,
                s.params.method(self.sampling) == "coupled",
                s.processors,
                s.num_prompt_tokens,
                None if self.copies is None else self.copies.of(s.seq_id),
            )
            for s, k in zip(seqs, ks, strict=True)
        ]
        propose_fn = plain_proposals(chains, self.top_m)
        drafts = decode_chains(self.runner, chains, propose_fn, self.stop_below)
        for s, k, fed in zip(seqs, ks, drafts.fed, strict=True):
            if k > 0:  # a sequence drafted for nothing keeps the KV it had
                self.computed[s.seq_id] = fed
        return Proposal(drafts.tokens, torch.tensor(drafts.counts), q=drafts.q)

    def preempted(self, seq: Sequence) -> None:
        self.computed.pop(seq.seq_id, None)

    def release(self, seq: Sequence) -> None:
        self.computed.pop(seq.seq_id, None)
        if self.copies is not None:
            self.copies.forget(seq.seq_id)
