"""Structured output in every mode: the text always satisfies its constraint, greedy SD and SSD
give AR's tokens, and at T > 0 the first two tokens follow the masked target's exact law."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from tokenizers import decoders as tok_decoders

from saguaro import LLM, SamplingParams
from saguaro.errors import RequestError
from saguaro.sampling import SamplingTensors, logits_to_probs
from saguaro.sampling.params import StructuredOutput
from tests.conftest import EOS, FIRST_TWO_SAMPLES, PROMPTS, SMALL_VOCAB, sample_first_two
from tests.speculation.test_sampling_features import MODES
from tests.stats import assert_first_two_follow

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["S", "M", "L"]}},
    "required": ["ok", "size"],
    "additionalProperties": False,
}
GRAMMAR = 'start: "(" NUM ("+" NUM)* ")"\nNUM: /[0-9]/'
CONSTRAINTS = {
    "json schema": StructuredOutput("json", SCHEMA),
    "json object": StructuredOutput("json_object"),
    "regex": StructuredOutput("regex", "[ab]{3}-[0-9]{2}"),
    "choice": StructuredOutput("choice", ["red", "green", "blue"]),
    "grammar": StructuredOutput("grammar", GRAMMAR),
}
BATCH = PROMPTS[:4]
MAX_TOKENS = 160  # the schema's flexible whitespace can run long under a random model


def satisfies(kind: str, text: str) -> bool:
    if kind == "json schema":
        value = json.loads(text)
        return (
            set(value) == {"ok", "size"}
            and isinstance(value["ok"], bool)
            and value["size"] in ("S", "M", "L")
        )
    if kind == "json object":
        return isinstance(json.loads(text), dict)
    if kind == "regex":
        return re.fullmatch(r"[ab]{3}-[0-9]{2}", text) is not None
    if kind == "choice":
        return text in ("red", "green", "blue")
    return re.fullmatch(r"\([0-9](\+[0-9])*\)", text) is not None


def params(kind: str, **kw) -> SamplingParams:
    kw.setdefault("temperature", 0)
    return SamplingParams(max_tokens=MAX_TOKENS, structured=CONSTRAINTS[kind], **kw)


def check(outs, kind):
    for o in outs:
        if o.finish_reason == "stop":  # a length cut ends any text mid-grammar
            assert satisfies(kind, o.text), (kind, o.text)
    assert sum(o.finish_reason == "stop" for o in outs) >= len(outs) // 2, kind


@pytest.fixture(scope="module")
def ar(tiny_llama):
    llm = LLM(model=str(tiny_llama), max_model_len=256)
    return {kind: llm.generate(BATCH, params(kind)) for kind in CONSTRAINTS}


def test_ar_output_satisfies_every_constraint(ar):
    for kind, outs in ar.items():
        check(outs, kind)


@pytest.mark.parametrize("mode", MODES)
def test_speculation_under_a_grammar_gives_ars_tokens(tiny_llama, close_draft, ar, mode):
    kw = dict(MODES[mode], max_model_len=256, max_num_seqs=8, draft_timeout_s=60)
    with LLM(model=str(tiny_llama), draft=str(close_draft), **kw) as llm:
        for kind in CONSTRAINTS:
            outs = llm.generate(BATCH, params(kind))
            assert [o.token_ids for o in outs] == [o.token_ids for o in ar[kind]], (mode, kind)
            check(outs, kind)
        sampled = llm.generate(
            BATCH * 2, [params("json schema", temperature=1.0, seed=i) for i in range(8)]
        )
        check(sampled, "json schema")
        assert llm.last_run["accepted"] > 0


def test_a_bad_constraint_is_a_request_error(tiny_llama):
    llm = LLM(model=str(tiny_llama), max_model_len=256)
    for bad in (StructuredOutput("regex", "[a-"), StructuredOutput("grammar", "start: (")):
        with pytest.raises(RequestError, match="structured output"):
            llm.generate("x", SamplingParams(structured=bad))
    with pytest.raises(ValueError, match="ignore_eos"):
        SamplingParams(structured=CONSTRAINTS["regex"], ignore_eos=True)
    with pytest.raises(ValueError, match="choice"):
        StructuredOutput("choice", [])


# ---- exactness at temperature > 0 (vocabulary of 8: exact enumeration) ------------------------

V = SMALL_VOCAB
LETTERS = "abcdefg"  # tokens 0..6; EOS is token 7
REGEX = "[abc][dea]"  # the first token one of a, b, c; the second one of d, e, a
FIRST, SECOND = [0, 1, 2], [3, 4, 0]
TV_SAMPLES = FIRST_TWO_SAMPLES
TV_BATCH = 1_000
TV_PROMPT = [1, 4, 2]  # sample_first_two's


def letter_tokenizer() -> Tokenizer:
    """Seven byte-level letter tokens and EOS: a vocabulary of 8 llguidance can read."""
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(LETTERS)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = tok_decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    return tok


@pytest.fixture(scope="module")
def letter_pair(small_vocab_pair, tmp_path_factory):
    """The small-vocabulary target and close draft, with a letter tokenizer."""
    out = []
    for src in small_vocab_pair[:2]:
        dst = tmp_path_factory.mktemp("letters")
        shutil.copytree(src, dst, dirs_exist_ok=True)
        letter_tokenizer().save(str(dst / "tokenizer.json"))
        out.append(dst)
    return out


def exact_first_two_masked(target, temperature: float) -> torch.Tensor:
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(target).eval()
    st = SamplingTensors.from_params([SamplingParams(temperature=temperature)])

    def p_next(prefix: list[int], allowed: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logits = ref(torch.tensor([TV_PROMPT + prefix])).logits[0, -1]
        masked = torch.full_like(logits, -torch.inf)
        masked[allowed] = logits[allowed]
        return logits_to_probs(masked[None], st)[0]

    p1 = p_next([], FIRST)
    return torch.stack([p1[t] * p_next([t], SECOND) for t in range(V)])


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, engine",
    [
        ("ar", dict(mode="ar")),
        ("sd", dict(mode="sd", num_speculative_tokens=3)),
        ("sd coupled", dict(mode="sd", num_speculative_tokens=3, sampling="coupled")),
        ("ssd hits", dict(mode="ssd", num_speculative_tokens=3, fanout=[3, 2, 2, 3])),
        ("ssd misses", dict(mode="ssd", num_speculative_tokens=3, fanout="0", backup="neural")),
    ],
)
def test_first_two_tokens_follow_the_masked_target(letter_pair, name, engine):
    target, draft = letter_pair
    temperature = 1.0
    expected = exact_first_two_masked(target, temperature)
    engine.setdefault("sampling", "rejection")
    constraint = StructuredOutput("regex", REGEX)

    def params(seed: int) -> SamplingParams:
        return SamplingParams(
            temperature=temperature, max_tokens=3, seed=seed, structured=constraint
        )

    def check(out) -> None:
        assert out.text[:2] == LETTERS[out.token_ids[0]] + LETTERS[out.token_ids[1]]
        assert re.fullmatch(REGEX, out.text), out.text

    drafted = None if name == "ar" else draft
    counts, _ = sample_first_two(
        target, drafted, params, TV_SAMPLES, TV_BATCH, check=check, **engine
    )
    assert_first_two_follow(counts, expected, name)
