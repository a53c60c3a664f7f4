"""Compiled constraints are reused: each request gets a matcher of its own, copied from the
compiled one, and only an identical constraint (order included) hits the cache."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from tokenizers import decoders as tok_decoders

from saguaro.sampling import structured
from saguaro.sampling.params import StructuredOutput
from saguaro.sampling.structured import GrammarCompiler

LETTERS = "abcdefg"
EOS = 7


def compiler() -> GrammarCompiler:
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(LETTERS)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = tok_decoders.ByteLevel()
    tok.add_special_tokens(["</s>"])
    return GrammarCompiler(tok.to_str(), len(LETTERS) + 1, [EOS])


def allowed(grammar, generated: list[int]) -> list[int]:
    mask = grammar.banned(generated, [], range(0, 1))[0]
    return [t for t in range(len(LETTERS) + 1) if not mask[t]]


def test_requests_sharing_a_constraint_get_matchers_of_their_own(monkeypatch):
    grammars = compiler()
    compiled = []
    real = GrammarCompiler._compile
    monkeypatch.setattr(GrammarCompiler, "_compile", lambda s, c: compiled.append(c) or real(s, c))
    regex = StructuredOutput("regex", "[abc][dea]")
    first, second = grammars.compile(regex), grammars.compile(regex)
    assert len(compiled) == 1  # the second request copied the first's compiled matcher
    assert allowed(first, [0]) == [0, 3, 4]  # after "a": d, e or a
    assert allowed(second, []) == [0, 1, 2]  # the first's tokens are not the second's
    assert allowed(grammars.compile(regex), []) == [0, 1, 2]
    grammars.compile(StructuredOutput("regex", "[ab]"))
    assert len(compiled) == 2


def test_only_the_same_constraint_in_the_same_order_hits(monkeypatch):
    grammars = compiler()
    compiled = []
    real = GrammarCompiler._compile
    monkeypatch.setattr(GrammarCompiler, "_compile", lambda s, c: compiled.append(c) or real(s, c))
    props = {"a": {"type": "integer"}, "b": {"type": "integer"}}
    swapped = dict(reversed(props.items()))
    for spec in (props, swapped, json.loads(json.dumps(props))):
        grammars.compile(StructuredOutput("json", {"type": "object", "properties": spec}))
    assert [list(c.spec["properties"]) for c in compiled] == [["a", "b"], ["b", "a"]]


def test_the_cache_keeps_the_most_recent_constraints(monkeypatch):
    monkeypatch.setattr(structured, "COMPILED_CACHE_SIZE", 2)
    grammars = compiler()
    for spec in ("[ab]", "[bc]", "[cd]", "[cd]", "[bc]"):
        grammars.compile(StructuredOutput("regex", spec))
    assert len(grammars._compiled) == 2
    assert [k.split("\0")[1] for k in grammars._compiled] == ['"[cd]"', '"[bc]"']


def test_a_bad_constraint_is_not_kept():
    grammars = compiler()
    with pytest.raises(ValueError, match="regex"):
        grammars.compile(StructuredOutput("regex", "[a"))
    assert not grammars._compiled
