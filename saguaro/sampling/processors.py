"""Logits processors: what a request's own history does to its logits, before temperature.

For a scored row whose request has generated ``g`` so far (``c_t`` the count of token t in g,
``P`` the prompt's tokens), the processed logits are, in this order (vLLM's definitions):

1. ``l_t + bias_t`` (``logit_bias``);
2. ``-inf`` for a banned token: the last token of a bad word whose other tokens end ``g`` (a
   one-token word always), the end-of-sequence and stop tokens while ``|g| < min_tokens``,
   and every token a structured-output grammar refuses after ``g``
   (:mod:`saguaro.sampling.structured`);
3. for ``t in P or c_t > 0`` with repetition penalty ``r``: ``l_t / r`` where ``l_t > 0``,
   else ``l_t * r``;
4. ``l_t - frequency * c_t - presence * [c_t > 0]``.

Temperature, min-p, top-k and top-p act on the result (:mod:`saguaro.sampling.probs`).

Why speculation stays exact: position j of a round is scored with the draft tokens
``s_1..s_{j-1}`` before it, and it decides a token only if all of them were accepted, i.e.
committed. So processing row j over ``g + s_1..s_{j-1}`` gives it exactly the distribution AR
computes after committing the same tokens; verification (any method) then compares the draft
against that ``p``. The draft's own q may ignore the processors (any q is verified exactly); an
in-process draft applies them too (:func:`process_rows`), so that it proposes what the
target can accept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from saguaro.sampling.params import SamplingParams
from saguaro.sampling.structured import Grammar


@dataclass
class Processors:
    """One request's processors, with what they keep of its history between rounds."""

    params: SamplingParams
    bias_ids: np.ndarray  # [B] int64
    bias_values: np.ndarray  # [B] float32
    bad_words: list[tuple[int, ...]]  # token sequences never generated
    stop_ids: list[int]  # banned while fewer than min_tokens tokens are generated
    # The bookkeeping is NumPy's: a round takes a few small array operations per request, and
    # each costs NumPy less than torch; the logits themselves are touched once per batch
    # (:func:`process_rows`).
    prompt_mask: np.ndarray | None  # [V] bool, the prompt's tokens (repetition penalty only)
    counts: np.ndarray | None  # [V] float32, c_t over the generated tokens (penalties only)
    # Sorted ids whose logits a penalty can change: generated ones, and the prompt's under a
    # repetition penalty. Penalties touch only these columns, not the whole vocabulary.
    support: np.ndarray | None = None
    grammar: Grammar | None = None  # structured output
    counted: int = 0  # generated tokens already in ``counts``

    @classmethod
    def build(
        cls,
        params: SamplingParams,
        prompt_ids: Sequence[int],
        vocab_size: int,
        stop_ids: Sequence[int],
        bad_words: Sequence[Sequence[int]] = (),
        grammar: Grammar | None = None,
    ) -> Processors | None:
        """The processors of a request (None if none acts). ``stop_ids``: what min_tokens holds
        back (the end-of-sequence tokens unless ignored, and ``stop_token_ids``);
        ``bad_words``: the tokenized bad words; ``grammar``: its structured output, compiled.
        Token ids out of the vocabulary: ValueError."""
        if not params.has_processors:
            return None
        bias = params.logit_bias or {}
        out_of_range = [t for t in bias if t >= vocab_size]
        if out_of_range:
            raise ValueError(f"logit_bias token ids out of range [0, {vocab_size}): {out_of_range}")
        penalised = bool(params.presence_penalty or params.frequency_penalty)
        repeats = params.repetition_penalty != 1
        prompt_mask = None
        support = np.zeros(0, dtype=np.int64) if penalised or repeats else None
        if repeats:
            prompt_mask = np.zeros(vocab_size, dtype=bool)
            support = np.unique(np.asarray(prompt_ids, dtype=np.int64))
            prompt_mask[support] = True
        return cls(
            params=params,
            bias_ids=np.array(list(bias), dtype=np.int64),
            bias_values=np.array(list(bias.values()), dtype=np.float32),
            bad_words=[tuple(w) for w in bad_words if w],
            stop_ids=sorted(set(stop_ids)) if params.min_tokens else [],
            prompt_mask=prompt_mask,
            counts=np.zeros(vocab_size, dtype=np.float32) if penalised or repeats else None,
            support=support,
            grammar=grammar,
        )

    def _catch_up(self, generated: Sequence[int]) -> None:
        """Count the tokens generated since the last round into ``counts`` and ``support``."""
        assert self.counts is not None and self.support is not None
        new = generated[self.counted :]
        if new:
            ids = np.asarray(new, dtype=np.int64)
            np.add.at(self.counts, ids, 1.0)
            self.support = np.union1d(self.support, ids)
            self.counted = len(generated)

    def banned(self, generated: Sequence[int]) -> list[int]:
        """Tokens that cannot follow ``generated`` (step 2 of the module docstring)."""
        out = list(self.stop_ids) if len(generated) < self.params.min_tokens else []
        for word in self.bad_words:
            head = word[:-1]
            if not head or tuple(generated[len(generated) - len(head) :]) == head:
                out.append(word[-1])
        return out

    def apply(
        self, block: torch.Tensor, generated: list[int], drafts: list[int], first: int = 0
    ) -> torch.Tensor:
        """Process ``block`` [m, V] in place: row j follows ``generated + drafts[:first + j]``."""
        prefixes = [drafts[:j] for j in range(first, first + block.shape[0])]
        return process_rows(block, [RowsOf(self, generated, range(len(prefixes)), prefixes)])

    def apply_rows(
        self, block: torch.Tensor, generated: list[int], prefixes: list[list[int]]
    ) -> torch.Tensor:
        """Process ``block`` [m, V] in place: row j follows ``generated + prefixes[j]`` (rows of
        different continuations, as an SSD worker's branches are, processed in one call)."""
        return process_rows(block, [RowsOf(self, generated, range(len(prefixes)), prefixes)])

    def _penalties(
        self, generated: Sequence[int], prefixes: Sequence[Sequence[int]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Steps 3 and 4's entries for rows after ``generated + prefixes[j]``: (row j, column,
        count c_t, whether t is the prompt's), one per row and column of the support (with the
        row's prefix tokens added); every other column is left as it is."""
        self._catch_up(generated)
        assert self.counts is not None and self.support is not None
        ids, m = self.support, len(prefixes)
        pairs = [(j, t) for j, prefix in enumerate(prefixes) for t in prefix]
        if pairs:
            ids = np.union1d(ids, [t for _, t in pairs])
        counts = np.repeat(self.counts[ids][None], m, axis=0)  # [m, |support|]
        if pairs:  # row j also counts its prefix's tokens
            at, tokens = np.asarray(pairs, dtype=np.int64).T
            np.add.at(counts, (at, np.searchsorted(ids, tokens)), 1.0)
        in_prompt = (
            self.prompt_mask[ids] if self.prompt_mask is not None else np.zeros(len(ids), bool)
        )
        rows = np.repeat(np.arange(m), len(ids))
        return rows, np.tile(ids, m), counts.reshape(-1), np.tile(in_prompt, m)


@dataclass(frozen=True)
class RowsOf:
    """Rows of a block that one request's processors act on: ``rows[j]`` follows the request's
    ``generated`` tokens and then ``prefixes[j]``."""

    processors: Processors
    generated: Sequence[int]
    rows: Sequence[int]
    prefixes: Sequence[Sequence[int]]


def process_rows(block: torch.Tensor, jobs: Sequence[RowsOf]) -> torch.Tensor:
    """Steps 1 to 4 of the module docstring (and the grammar's refusals) on every job's rows of
    the float32 ``block``, in place.

    Each step gathers the entries it changes for the whole batch, computes them elementwise
    and scatters them back: one set of tensor operations per batch rather than per request.
    An entry's arithmetic is the same whatever else is gathered beside it (a penalty of 0 and
    a repetition penalty of 1 leave a value's bits as they are), so a row gets the bits it
    gets processed alone.
    """
    _add_bias(block, jobs)
    _ban(block, jobs)
    _penalise(block, jobs)
    for job in jobs:
        if job.processors.grammar is not None:
            _refuse(block, job.rows, _grammar_refusals(job))
    return block


def _grammar_refusals(job: RowsOf) -> list[torch.Tensor | None]:
    """Each row's mask of the tokens the grammar refuses; one pass over the drafts when the
    prefixes are those of one chain (a round's rows), one per prefix otherwise (branches)."""
    grammar, prefixes = job.processors.grammar, job.prefixes
    assert grammar is not None
    if not prefixes:
        return []
    chain, first = prefixes[-1], len(prefixes[0])
    if all(list(p) == list(chain[: first + j]) for j, p in enumerate(prefixes)):
        return grammar.banned(job.generated, chain, range(first, first + len(prefixes)))
    return [grammar.banned(job.generated, p, range(len(p), len(p) + 1))[0] for p in prefixes]


def _index(parts: list[np.ndarray], device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.concatenate(parts)).to(device)


def _add_bias(block: torch.Tensor, jobs: Sequence[RowsOf]) -> None:
    """Step 1: l_t + bias_t."""
    rows, cols, values = [], [], []
    for job in jobs:
        proc, m = job.processors, len(job.rows)
        if len(proc.bias_ids) and m:
            rows.append(np.repeat(np.asarray(job.rows, dtype=np.int64), len(proc.bias_ids)))
            cols.append(np.tile(proc.bias_ids, m))
            values.append(np.tile(proc.bias_values, m))
    if rows:
        at = (_index(rows, block.device), _index(cols, block.device))
        block[at] = block[at] + _index(values, block.device)


def _ban(block: torch.Tensor, jobs: Sequence[RowsOf]) -> None:
    """Step 2 but the grammar's: -inf for each row's banned tokens."""
    rows, cols = [], []
    for job in jobs:
        proc = job.processors
        if not (proc.stop_ids or proc.bad_words):
            continue
        for row, prefix in zip(job.rows, job.prefixes, strict=True):
            banned = proc.banned([*job.generated, *prefix])
            rows += [row] * len(banned)
            cols += banned
    if rows:
        block[
            torch.tensor(rows, device=block.device), torch.tensor(cols, device=block.device)
        ] = -torch.inf


def _penalise(block: torch.Tensor, jobs: Sequence[RowsOf]) -> None:
    """Steps 3 and 4: the repetition penalty r on seen and prompt tokens, then the frequency and
    presence penalties, with each entry's own request's r, frequency and presence."""
    rows, cols, counts, in_prompt, r, freq, pres = [], [], [], [], [], [], []
    for job in jobs:
        proc = job.processors
        if proc.counts is None or not len(job.rows):
            continue
        at, col, count, prompt = proc._penalties(job.generated, job.prefixes)
        rows.append(np.asarray(job.rows, dtype=np.int64)[at])
        cols.append(col)
        counts.append(count)
        in_prompt.append(prompt)
        p, n = proc.params, len(col)
        r.append(np.full(n, p.repetition_penalty, dtype=np.float32))
        freq.append(np.full(n, p.frequency_penalty, dtype=np.float32))
        pres.append(np.full(n, p.presence_penalty, dtype=np.float32))
    if not rows:
        return
    dev = block.device
    at = (_index(rows, dev), _index(cols, dev))
    values, c = block[at], _index(counts, dev)
    r_, seen = _index(r, dev), c > 0
    hit = seen | _index(in_prompt, dev)
    values = torch.where(hit, torch.where(values > 0, values / r_, values * r_), values)
    values = values - c * _index(freq, dev)
    block[at] = values - seen.float() * _index(pres, dev)


def _refuse(block: torch.Tensor, rows: Sequence[int], refused: list[torch.Tensor | None]) -> None:
    """-inf where the grammar refuses a token: in ``rows[j]`` where ``refused[j]`` (None: no
    mask, the row follows a refused token and decides nothing)."""
    for row, mask in zip(rows, refused, strict=True):
        if mask is not None:
            block[row].masked_fill_(mask.to(block.device), -torch.inf)


def process_draft_rows(
    logits: torch.Tensor,
    proc: Processors | None,
    generated: list[int],
    drafts: list[int],
    first: int | None = None,
) -> torch.Tensor:
    """A draft's logits rows [m, V], row j after ``generated + drafts[:first + j]`` (``first``
    None: one row after all of ``drafts``), processed as the target's rows at those positions
    are (a copy; the rows themselves when the request has no processors)."""
    if proc is None:
        return logits
    first = len(drafts) if first is None else first
    return proc.apply(logits.float().clone(), generated, drafts, first)


def apply_processors(
    logits: torch.Tensor,
    processors: Sequence[Processors | None],
    generated: Sequence[list[int]],
    drafts: Sequence[list[int]],
    rows: Sequence[list[int]],
    keep: bool = True,
) -> torch.Tensor:
    """The round's logits with each sequence's processors applied to its scored rows.

    Sequence i scores ``rows[i][j]`` for j = 0..len(drafts[i]) (its proposals ``drafts[i]``,
    after its generated tokens ``generated[i]``). With ``keep``, ``logits`` is left as it is
    (the processed rows go to a copy, made only when some sequence has processors); without, a
    float32 ``logits`` is processed in place.
    """
    jobs = [
        RowsOf(proc, gen, row[: len(draft) + 1], [draft[:j] for j in range(len(draft) + 1)])
        for proc, gen, draft, row in zip(processors, generated, drafts, rows, strict=True)
        if proc is not None
    ]
    if not jobs:
        return logits
    out = logits.float().clone() if keep or logits.dtype != torch.float32 else logits
    return process_rows(out, jobs)
