"""Structured output: the tokens a grammar allows next, at every scored position.

A constraint (a JSON schema, any JSON object, a regular expression, a choice among strings, a
Lark grammar) compiles to an llguidance grammar over the model's tokenizer. llguidance was
chosen over xgrammar and outlines-core: a dependency-free abi3 wheel (xgrammar pulls torch,
transformers and triton; outlines-core builds a vocabulary-wide index per schema), masks computed
per step from the token trie with no index to build (docs/bench/features has their cost), and
``rollback``, which speculation needs.

For a prefix with generated tokens ``g``, the mask ``A(g)`` is the set of tokens the grammar
accepts after ``g`` (end-of-sequence once it is complete); the processed logits are ``-inf``
outside it, one more ban in :mod:`saguaro.sampling.processors`' step 2, so the same argument
keeps speculation exact: row j of a round is masked after the matcher has consumed
``s_1..s_j``, and the matcher is rolled back afterwards, so it only ever holds committed tokens
between rounds. A draft token outside its row's mask has ``p = 0`` and is always rejected: the
rows after it decide nothing and are left unmasked.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from saguaro.sampling.params import StructuredOutput

ANY_JSON_OBJECT = {"type": "object"}  # response_format json_object
# Compiled constraints kept per tokenizer. A workload often shares one schema among its
# requests; each then costs a copy of the compiled matcher (a microsecond) instead of a
# validation and a compilation (about a millisecond each).
COMPILED_CACHE_SIZE = 64


def grammar_text(constraint: StructuredOutput) -> str:
    """The llguidance grammar of a constraint (not yet checked: :class:`GrammarCompiler`)."""
    from llguidance import LLMatcher

    kind, spec = constraint.kind, constraint.spec
    if kind == "json_object":
        return LLMatcher.grammar_from_json_schema(ANY_JSON_OBJECT)
    if kind == "json":
        return LLMatcher.grammar_from_json_schema(spec)
    if kind == "regex":
        return LLMatcher.grammar_from_regex(spec)
    if kind == "choice":
        options = " | ".join(json.dumps(c, ensure_ascii=False) for c in spec)
        return LLMatcher.grammar_from_lark(f"start: {options}")
    return LLMatcher.grammar_from_lark(spec)


class GrammarCompiler:
    """Compiles constraints over one tokenizer (its llguidance view, which walks the whole
    vocabulary, is built on the first request that needs it, and kept), keeping the last
    ``COMPILED_CACHE_SIZE`` compiled constraints for the requests that repeat them."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: Sequence[int]) -> None:
        self.tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self.eos_ids = sorted(eos_ids)
        self._tokenizer = None
        self._compiled: OrderedDict[str, object] = OrderedDict()  # key -> unused LLMatcher
        self._lock = threading.Lock()

    @property
    def tokenizer(self):  # llguidance.LLTokenizer, imported only when a request needs it
        if self._tokenizer is None:
            from llguidance import LLTokenizer

            try:
                self._tokenizer = LLTokenizer(
                    self.tokenizer_json, n_vocab=self.vocab_size, eos_token=self.eos_ids
                )
            except Exception as e:
                raise ValueError(f"llguidance cannot read this tokenizer: {e}") from e
            except BaseException as e:  # a Rust panic: fail the request, not the thread
                if isinstance(e, (KeyboardInterrupt, SystemExit)):
                    raise
                raise ValueError(f"llguidance cannot read this tokenizer: {e}") from None
        return self._tokenizer

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token stands for (a byte-level token may be part of a UTF-8 character)."""
        return self.tokenizer.decode_bytes([token])

    def compile(self, constraint: StructuredOutput) -> Grammar:
        """A fresh matcher for one request; ValueError naming what is wrong with the constraint."""
        # The spec's own order is kept: a schema's property order is the order it generates.
        key = f"{constraint.kind}\0{json.dumps(constraint.spec, ensure_ascii=False, default=str)}"
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is not None:
                self._compiled.move_to_end(key)
                return Grammar(compiled.deep_copy(), self.vocab_size)
        compiled = self._compile(constraint)
        with self._lock:
            self._compiled[key] = compiled
            if len(self._compiled) > COMPILED_CACHE_SIZE:
                self._compiled.popitem(last=False)
            return Grammar(compiled.deep_copy(), self.vocab_size)

    def _compile(self, constraint: StructuredOutput):
        from llguidance import LLMatcher

        try:
            text = grammar_text(constraint)
        except ValueError as e:
            raise ValueError(f"structured output ({constraint.kind}): {e}") from e
        failed, messages = LLMatcher.validate_grammar_with_warnings(text, self.tokenizer)
        if failed:
            raise ValueError(f"structured output ({constraint.kind}): {messages[0].strip()}")
        matcher = LLMatcher(self.tokenizer, text, log_level=0)
        if matcher.is_error():
            raise ValueError(f"structured output ({constraint.kind}): {matcher.get_error()}")
        return matcher


@dataclass
class Grammar:
    """One request's matcher, holding its committed tokens between rounds."""

    matcher: object  # llguidance.LLMatcher
    vocab_size: int
    consumed: int = 0  # generated tokens the matcher holds

    def _catch_up(self, generated: Sequence[int]) -> None:
        new = list(generated[self.consumed :])
        if new and self.matcher.try_consume_tokens(new) != len(new):
            # Committed tokens were drawn from masked rows: only a bug gets here.
            raise RuntimeError(f"a committed token left the grammar: {new}")
        self.consumed = len(generated)

    def _banned(self) -> torch.Tensor:
        allowed = np.frombuffer(self.matcher.compute_logit_bias(), dtype=np.uint8)
        return torch.from_numpy(allowed[: self.vocab_size] == 0)

    def banned(self, generated: Sequence[int], drafts: Sequence[int], rows: range) -> list:
        """For each j in ``rows``: the [V] bool mask of tokens the grammar refuses after
        ``generated + drafts[:j]``, or None where a draft token before it was refused."""
        self._catch_up(generated)
        out: list[torch.Tensor | None] = []
        pushed = 0
        for j in range(rows.stop):
            if j >= rows.start:
                out.append(self._banned())
            if j + 1 < rows.stop:
                if self.matcher.try_consume_tokens([drafts[j]]) != 1:
                    out += [None] * (rows.stop - max(j + 1, rows.start))
                    break
                pushed += 1
        if pushed:
            self.matcher.rollback(pushed)
        return out
