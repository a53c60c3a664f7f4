"""A step's rounds, verified: what each round proposed and which logits rows score it, each
sampling method's verifier run over its rounds (each round alone if a batch fails), and the
log-probabilities of the tokens they commit.

Round i of a step proposed ``s_1..s_k`` (k = ``num_draft[i]``) and the target scored
``[r, s_1..s_k]`` in its k + 1 logits rows; the verifier accepts a prefix ``s_1..s_a`` and draws
the token t after it, so the round commits ``s_1..s_a, t`` (docs/design.md §3). Nothing here
touches a sequence: the engine applies the outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from saguaro.core.proposal import Proposal
from saguaro.core.sequence import Sequence
from saguaro.engine.scheduler import Scheduled
from saguaro.kernels.transfer import upload
from saguaro.sampling import SamplingTensors, SparseQ, VerifyResult, seed_tensor
from saguaro.sampling.logprobs import TokenLogprob, token_logprobs
from saguaro.sampling.processors import apply_processors
from saguaro.sampling.round import Round, Verifier

log = logging.getLogger("saguaro")

NON_FINITE_LOGITS = "the model produced non-finite logits (NaN or inf) for this request"


@dataclass
class StepRounds:
    """A step's decode rounds as the verifier takes them (``rnd``) and as lists: each round's
    proposals, and the logits rows scoring its positions (``rows[i][j]`` scores position j of
    round i; padding repeats the last)."""

    rnd: Round
    drafts: list[list[int]]
    rows: list[list[int]]


@dataclass
class Outcomes:
    """Each round's outcome (docs/design.md §3): k accepted proposals, the target's token t
    after them, and an error that ends that request alone (None: none)."""

    num_accepted: list[int]
    next_token: list[int]
    errors: list[str | None]

    def committed(self, drafts: list[list[int]]) -> list[list[int]]:
        """Each round's new tokens: its first k proposals, then t."""
        return [
            d[:k] + [t] for d, k, t in zip(drafts, self.num_accepted, self.next_token, strict=True)
        ]


@dataclass
class Verdict:
    """A step's rounds verified: their outcomes, each one's committed tokens and their
    log-probabilities (empty for a request that does not ask for them, or that failed)."""

    outcomes: Outcomes
    committed: list[list[int]]
    logprobs: list[list[TokenLogprob]]


def _padded(
    rounds: list[Scheduled], row: dict[int, int], proposal: Proposal | None
) -> tuple[list[list[int]], list[list[int]], list[tuple[int, int]]]:
    """Each round's proposals padded with zeros to the longest, K; the logits rows scoring its
    K + 1 positions (round i's k + 1 rows follow round i - 1's; padding repeats the last); and
    (round, proposal row) of each round that proposed."""
    k_max = max(s.k for s in rounds)
    rows: list[list[int]] = []
    tokens: list[list[int]] = []
    take: list[tuple[int, int]] = []
    proposed = proposal.tokens.tolist() if proposal is not None else []
    offset = 0
    for i, s in enumerate(rounds):
        rows.append([offset + min(j, s.k) for j in range(k_max + 1)])
        offset += s.k + 1
        padded = [0] * k_max
        if s.k:
            j = row[s.seq.seq_id]
            padded[: s.k] = proposed[j][: s.k]
            take.append((i, j))
        tokens.append(padded)
    return tokens, rows, take


def _draft_q(
    proposal: Proposal | None, take: list[tuple[int, int]], draft_tokens: torch.Tensor
) -> SparseQ | None:
    """What each round's proposals were drawn from, ``[n, K, M]``: proposal row j's q for the
    rounds ``take`` pairs with it, point masses on the padding elsewhere (never read). None
    where the proposer gives no q (point masses throughout)."""
    if proposal is None or proposal.q is None or not take:
        return None
    k_max = draft_tokens.shape[1]
    # Assembled where the proposal's q is (the device, over SSD's lane): no round trip.
    where = proposal.q.ids.device
    dst, src, padded_tokens = upload(
        [*(torch.tensor(x) for x in zip(*take, strict=True)), draft_tokens], where
    )
    q = SparseQ.point_mass(padded_tokens, proposal.q.width)
    q.ids[dst], q.probs[dst] = proposal.q.ids[src, :k_max], proposal.q.probs[src, :k_max]
    return q


def step_rounds(
    rounds: list[Scheduled], row: dict[int, int], proposal: Proposal | None, device: torch.device
) -> StepRounds:
    """The rounds of ``rounds`` for the verifier, on ``device``, their proposals from
    ``proposal`` (round i's at row ``row[seq_id]``) padded to the longest."""
    # Built as lists and made tensors once: a few small ints per round, where a tensor
    # operator each would cost more than the verification itself.
    tokens, rows, take = _padded(rounds, row, proposal)
    draft_tokens = torch.tensor(tokens, dtype=torch.int64)  # [n, K], K may be 0
    q = _draft_q(proposal, take, draft_tokens)
    seqs = [s.seq for s in rounds]
    on_host = (
        draft_tokens,
        torch.tensor([s.k for s in rounds], dtype=torch.int64),
        seed_tensor([seq.seed for seq in seqs]),
        torch.tensor([len(seq) for seq in seqs], dtype=torch.int64),
        torch.tensor(rows, dtype=torch.int64),
    )
    draft_tokens, num_draft, seeds, positions, rows_t = upload(on_host, device)
    rnd = Round(
        st=SamplingTensors.from_params([seq.params for seq in seqs]),
        draft_tokens=draft_tokens,
        num_draft=num_draft,
        seeds=seeds,
        positions=positions,
        rows=rows_t,
        draft_q=None if q is None else q.to(device),
    )
    drafts = [t[: s.k] for t, s in zip(tokens, rounds, strict=True)]
    return StepRounds(rnd, drafts, rows)


def _run_verifiers(
    logits: torch.Tensor,
    rnd: Round,
    methods: list[str],
    verifier_for: Callable[[str], Verifier],
) -> dict[tuple[int, ...], VerifyResult | Exception]:
    """Each sampling method's rounds verified together, keyed by their indices; where that
    raises, each of them alone (a round that raises alone keeps its exception)."""
    outcomes: dict[tuple[int, ...], VerifyResult | Exception] = {}
    for method in sorted(set(methods)):
        verify = verifier_for(method)
        group = [i for i, m in enumerate(methods) if m == method]
        whole = rnd if len(group) == len(methods) else rnd.select(group)  # one method: no copies
        try:
            outcomes[tuple(group)] = verify(logits, whole)
            continue
        except Exception:
            log.exception("batched verification failed; verifying each request alone")
        for i in group:
            try:
                outcomes[(i,)] = verify(logits, rnd.select([i]))
            except Exception as e:
                outcomes[(i,)] = e
    return outcomes


def verify_rounds(
    logits: torch.Tensor,
    rnd: Round,
    methods: list[str],
    verifier_for: Callable[[str], Verifier],
) -> Outcomes:
    """Verify every round, the rounds of each sampling method together; if that raises,
    verify each of them alone, so that one request's failure ends that request only."""
    n = len(methods)
    num_accepted, next_token = [0] * n, [0] * n
    errors: list[str | None] = [None] * n
    for idx, result in _run_verifiers(logits, rnd, methods, verifier_for).items():
        if isinstance(result, Exception):
            errors[idx[0]] = f"sampling failed ({type(result).__name__})"
            continue
        # One copy to the host for the three (on a GPU, one synchronisation).
        outcome = torch.stack([result.num_accepted, result.next_token, result.invalid.long()])
        accepted, tokens, invalid = outcome.tolist()
        for j, i in enumerate(idx):
            num_accepted[i], next_token[i] = accepted[j], tokens[j]
            if invalid[j]:
                errors[i] = NON_FINITE_LOGITS
    return Outcomes(num_accepted, next_token, errors)


def round_logprobs(
    seqs: list[Sequence],
    logits: tuple[torch.Tensor, torch.Tensor],
    rnd: Round,
    rows: list[list[int]],
    committed: list[list[int]],
    errors: list[str | None],
) -> list[list[TokenLogprob]]:
    """The log-probabilities of each round's committed tokens, for the requests that ask:
    token j of round i from ``rows[i][j]``, of the raw or of the processed ``logits``."""
    out: list[list[TokenLogprob]] = [[] for _ in seqs]
    for mode, block in zip(("raw", "processed"), logits, strict=True):
        idx = [
            i
            for i, seq in enumerate(seqs)
            if seq.logprobs is not None and seq.params.logprobs_mode == mode and errors[i] is None
        ]
        if not idx:
            continue
        owner = [i for i in idx for _ in committed[i]]
        scored = [r for i in idx for r in rows[i][: len(committed[i])]]
        tokens = [t for i in idx for t in committed[i]]
        num_top = [seqs[i].params.logprobs for i in owner]
        st = rnd.st.index(torch.tensor(owner))
        found = token_logprobs(block[torch.tensor(scored)], tokens, st, num_top, mode)
        for i, lp in zip(owner, found, strict=True):
            out[i].append(lp)
    return out


def verify_step(
    rounds: list[Scheduled],
    row: dict[int, int],
    proposal: Proposal | None,
    logits: torch.Tensor,
    sampling: str,
    verifier_for: Callable[[str], Verifier],
) -> Verdict:
    """Verify a step's rounds against the target's ``logits`` (the rounds' rows, in order):
    each request's logits processors applied to its rows, then its sampling method's verifier
    (``sampling``: the engine's default method)."""
    seqs = [s.seq for s in rounds]
    step = step_rounds(rounds, row, proposal, logits.device)
    generated = [seq.output_token_ids for seq in seqs]
    processors = [seq.processors for seq in seqs]
    # The unprocessed rows are kept only for requests that report their log-probabilities.
    raw = any(s.logprobs is not None and s.params.logprobs_mode == "raw" for s in seqs)
    processed = apply_processors(logits, processors, generated, step.drafts, step.rows, keep=raw)
    methods = [seq.params.method(sampling) for seq in seqs]
    out = verify_rounds(processed, step.rnd, methods, verifier_for)
    committed = out.committed(step.drafts)
    logprobs = round_logprobs(seqs, (logits, processed), step.rnd, step.rows, committed, out.errors)
    return Verdict(out, committed, logprobs)
