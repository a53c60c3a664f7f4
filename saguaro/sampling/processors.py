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
from dataclasses import dataclass, field

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
    # Ids whose logits a penalty can change, in the order they came: the prompt's under a
    # repetition penalty, then generated ones; ``column`` maps each to its place. Penalties
    # touch only these columns, not the whole vocabulary.
    support: list[int] = field(default_factory=list)
    column: dict[int, int] = field(default_factory=dict)
    grammar: Grammar | None = None  # structured output
    counted: int = 0  # generated tokens already in ``counts``
    _support_ids: np.ndarray | None = None  # ``support`` as an array (None: to be made)

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
        prompt_mask, support = None, []
        if repeats:
            prompt_mask = np.zeros(vocab_size, dtype=bool)
            support = np.unique(np.asarray(prompt_ids, dtype=np.int64)).tolist()
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
            column={t: i for i, t in enumerate(support)},
            grammar=grammar,
        )

    def _catch_up(self, generated: Sequence[int]) -> None:
        """Count the tokens generated since the last round into ``counts`` and ``support``."""
        assert self.counts is not None
        new = generated[self.counted :]
        if new:
            np.add.at(self.counts, np.asarray(new, dtype=np.int64), 1.0)
            for t in new:
                if t not in self.column:
                    self.column[t] = len(self.support)
                    self.support.append(t)
                    self._support_ids = None
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
        return self.apply_rows(
            block, generated, [drafts[:j] for j in range(first, first + block.shape[0])]
        )

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
        assert self.counts is not None
        if self._support_ids is None:
            self._support_ids = np.asarray(self.support, dtype=np.int64)
        extra: dict[int, int] = {}  # prefix tokens outside the support -> their column
        for prefix in prefixes:
            for t in prefix:
                if t not in self.column and t not in extra:
                    extra[t] = len(self.support) + len(extra)
        ids = self._support_ids
        if extra:
            ids = np.concatenate([ids, np.fromiter(extra, dtype=np.int64, count=len(extra))])
        m, n = len(prefixes), len(ids)
        counts = _repeated(self.counts[ids], m)
        # row j also counts its prefix's tokens
        at = [
            j * n + (extra[t] if t in extra else self.column[t])
            for j, p in enumerate(prefixes)
            for t in p
        ]
        if at:
            np.add.at(counts, np.asarray(at, dtype=np.int64), 1.0)
        if self.prompt_mask is not None:
            in_prompt = _repeated(self.prompt_mask[ids], m)
        else:
            in_prompt = np.zeros(m * n, dtype=bool)
        return np.arange(m).repeat(n), _repeated(ids, m), counts, in_prompt


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
    the float32 ``block``, in place (jobs own disjoint rows).

    Each step gathers the entries it changes for the whole batch, computes them elementwise
    and scatters them back: one set of tensor operations per batch rather than per request.
    An entry's arithmetic is the same whatever else is gathered beside it (a penalty of 0 and
    a repetition penalty of 1 leave a value's bits as they are), so a row gets the bits it
    gets processed alone.
    """
    if not block.is_contiguous():  # the entries are addressed in the flat block
        block.copy_(process_rows(block.contiguous(), jobs))
        return block
    flat = block.view(-1)
    _add_bias(flat, block.shape[-1], jobs)
    _ban(flat, block.shape[-1], jobs)
    _penalise(flat, block.shape[-1], jobs)
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


def _repeated(x: np.ndarray, m: int) -> np.ndarray:
    """``x`` repeated ``m`` times end to end (np.tile, without its Python-level overhead)."""
    out = np.empty((m, len(x)), dtype=x.dtype)
    out[:] = x
    return out.reshape(-1)


def _joined(parts: list[np.ndarray], device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.concatenate(parts)).to(device)


def _add_bias(flat: torch.Tensor, vocab: int, jobs: Sequence[RowsOf]) -> None:
    """Step 1: l_t + bias_t."""
    at, values = [], []
    for job in jobs:
        proc, m = job.processors, len(job.rows)
        n = len(proc.bias_ids)
        if n and m:
            rows = np.asarray(job.rows, dtype=np.int64)[:, None]
            at.append((rows * vocab + proc.bias_ids).reshape(-1))
            values.append(_repeated(proc.bias_values, m))
    if at:
        idx = _joined(at, flat.device)
        flat.index_copy_(0, idx, flat.take(idx) + _joined(values, flat.device))


def _ban(flat: torch.Tensor, vocab: int, jobs: Sequence[RowsOf]) -> None:
    """Step 2 but the grammar's: -inf for each row's banned tokens."""
    at: list[int] = []
    for job in jobs:
        proc = job.processors
        if not (proc.stop_ids or proc.bad_words):
            continue
        for row, prefix in zip(job.rows, job.prefixes, strict=True):
            at += [row * vocab + t for t in proc.banned([*job.generated, *prefix])]
    if at:
        flat.index_fill_(0, torch.tensor(at, device=flat.device), -torch.inf)


def _penalise(flat: torch.Tensor, vocab: int, jobs: Sequence[RowsOf]) -> None:
    """Steps 3 and 4: the repetition penalty r on seen and prompt tokens, then the frequency and
    presence penalties, with each entry's own request's r, frequency and presence."""
    at, counts, in_prompt, sizes, penalties = [], [], [], [], []
    for job in jobs:
        proc = job.processors
        if proc.counts is None or not len(job.rows):
            continue
        row, col, count, prompt = proc._penalties(job.generated, job.prefixes)
        at.append(np.asarray(job.rows, dtype=np.int64)[row] * vocab + col)
        counts.append(count)
        in_prompt.append(prompt)
        p = proc.params
        sizes.append(len(col))
        penalties.append((p.repetition_penalty, p.frequency_penalty, p.presence_penalty))
    if not at:
        return
    dev = flat.device
    # each entry's own request's r, frequency and presence
    r, freq, pres = torch.from_numpy(
        np.repeat(np.asarray(penalties, dtype=np.float32), sizes, axis=0).T.copy()
    ).to(dev)
    idx = _joined(at, dev)
    values, c = flat.take(idx), _joined(counts, dev)
    seen = c > 0
    hit = seen | _joined(in_prompt, dev)
    values = torch.where(hit, torch.where(values > 0, values / r, values * r), values)
    values = values - c * freq
    flat.index_copy_(0, idx, values - seen.float() * pres)


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
