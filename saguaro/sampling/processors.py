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
in-process draft applies them too (:func:`process_draft_rows`), so that it proposes what the
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
    bias_ids: torch.Tensor  # [B] int64
    bias_values: torch.Tensor  # [B] float32
    bad_words: list[tuple[int, ...]]  # token sequences never generated
    stop_ids: list[int]  # banned while fewer than min_tokens tokens are generated
    # The penalties' bookkeeping is NumPy's: a round takes a few small array operations per
    # request, and each costs NumPy less than torch.
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
            bias_ids=torch.tensor(list(bias), dtype=torch.int64),
            bias_values=torch.tensor(list(bias.values()), dtype=torch.float32),
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
        rows = range(first, first + block.shape[0])
        self._process(block, generated, [drafts[:j] for j in rows])
        if self.grammar is not None:  # one pass over the drafts for every row
            _refuse(block, self.grammar.banned(generated, drafts, rows))
        return block

    def apply_rows(
        self, block: torch.Tensor, generated: list[int], prefixes: list[list[int]]
    ) -> torch.Tensor:
        """Process ``block`` [m, V] in place: row j follows ``generated + prefixes[j]`` (rows of
        different continuations, as an SSD worker's branches are, processed in one call)."""
        self._process(block, generated, prefixes)
        if self.grammar is not None:
            grammar = self.grammar
            after = [grammar.banned(generated, p, range(len(p), len(p) + 1))[0] for p in prefixes]
            _refuse(block, after)
        return block

    def _process(self, block: torch.Tensor, generated: list[int], prefixes: list[list[int]]):
        """Steps 1 to 4 of the module docstring, row j after ``generated + prefixes[j]``."""
        if len(self.bias_ids):
            block[:, self.bias_ids] += self.bias_values.to(block.device)
        self._ban(block, generated, prefixes)
        if self.counts is not None:
            self._penalise(block, generated, prefixes)

    def _penalise(self, block: torch.Tensor, generated: list[int], prefixes: list[list[int]]):
        """Steps 3 and 4 of the module docstring, row j after ``generated + prefixes[j]``, in
        place, column by column of the support (every other column is left as it is)."""
        p = self.params
        self._catch_up(generated)
        assert self.counts is not None and self.support is not None
        ids = self.support
        pairs = [(j, t) for j, prefix in enumerate(prefixes) for t in prefix]
        if pairs:
            ids = np.union1d(ids, [t for _, t in pairs])
        counts = np.repeat(self.counts[ids][None], len(prefixes), axis=0)  # [m, |support|]
        if pairs:  # row j also counts its prefix's tokens
            at, tokens = np.asarray(pairs, dtype=np.int64).T
            np.add.at(counts, (at, np.searchsorted(ids, tokens)), 1.0)
        columns = torch.from_numpy(ids).to(block.device)
        values = block[:, columns]
        counts = torch.from_numpy(counts).to(block.device)
        seen = counts > 0
        if p.repetition_penalty != 1:
            assert self.prompt_mask is not None
            r = p.repetition_penalty
            hit = seen | torch.from_numpy(self.prompt_mask[ids]).to(block.device)
            values = torch.where(hit, torch.where(values > 0, values / r, values * r), values)
        if p.frequency_penalty:
            values = values - counts * p.frequency_penalty
        if p.presence_penalty:
            values = values - seen.float() * p.presence_penalty
        block[:, columns] = values

    def _ban(self, block: torch.Tensor, generated: list[int], prefixes: list[list[int]]):
        """Step 2 of the module docstring (but the grammar's), row j after ``generated +
        prefixes[j]``, in place."""
        if self.stop_ids or self.bad_words:
            pairs = [
                (j, t) for j, prefix in enumerate(prefixes) for t in self.banned(generated + prefix)
            ]
            if pairs:
                rows_, tokens = zip(*pairs, strict=True)
                block[list(rows_), list(tokens)] = -torch.inf


def _refuse(block: torch.Tensor, refused: list[torch.Tensor | None]) -> None:
    """-inf where the grammar refuses a token: row j where ``refused[j]`` (None: no mask, the
    row follows a refused token and decides nothing)."""
    for j, mask in enumerate(refused):
        if mask is not None:
            block[j].masked_fill_(mask.to(block.device), -torch.inf)


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
    if all(p is None for p in processors):
        return logits
    out = logits.float().clone() if keep or logits.dtype != torch.float32 else logits
    for proc, gen, draft, row in zip(processors, generated, drafts, rows, strict=True):
        if proc is None:
            continue
        scored = row[: len(draft) + 1]
        if scored == list(range(scored[0], scored[0] + len(scored))):  # in place, on a view
            proc.apply(out[scored[0] : scored[0] + len(scored)], gen, draft)
        else:
            idx = torch.tensor(scored, device=logits.device)
            out[idx] = proc.apply(out[idx], gen, draft)
    return out
