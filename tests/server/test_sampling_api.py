"""The sampling features over HTTP, through the official ``openai`` client and LangChain's
``ChatOpenAI`` with their default settings: logprobs in both shapes, n, batched prompts,
penalties and biases, structured output, and the fields clients send."""

from __future__ import annotations

import json
import math

import httpx
import pytest

from saguaro import LLM
from tests.server.conftest import AUTH, CHAT, GREEDY, MODEL, PROMPTS, USER, greedy, serve

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["S", "M", "L"]}},
    "required": ["ok", "size"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def sd_server(tiny_llama, close_draft):
    llm = LLM(model=str(tiny_llama), draft=str(close_draft), mode="sd", max_model_len=256)
    with serve(llm) as served:
        yield served


@pytest.fixture(scope="module")
def sd_client(sd_server):
    return sd_server.client()


def test_chat_logprobs_plain_and_streamed_are_ars(sd_client, offline):
    """Under SD the reported values are AR's (raw: the model's own softmax)."""
    ids = offline.tokenizer.encode_chat(USER)
    ref = offline.generate(ids, greedy(12, logprobs=3))[0]
    kw = dict(model=MODEL, messages=USER, max_tokens=12, logprobs=True, top_logprobs=3, **GREEDY)
    out = sd_client.chat.completions.create(**kw)
    content = out.choices[0].logprobs.content
    assert len(content) == len(ref.token_ids) == out.usage.completion_tokens
    for entry, lp in zip(content, ref.logprobs, strict=True):
        assert math.isclose(entry.logprob, lp.logprob, abs_tol=1e-5)
        assert len(entry.top_logprobs) == 3 and entry.bytes is not None
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
    chunks = list(sd_client.chat.completions.create(**kw, stream=True))
    streamed = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert [e.logprob for e in streamed] == [e.logprob for e in content]
    plain = sd_client.chat.completions.create(model=MODEL, messages=USER, max_tokens=3)
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_are_parallel_lists(client, offline):
    ref = offline.generate(PROMPTS[1], greedy(10, logprobs=2))[0]
    out = client.completions.create(
        model=MODEL, prompt=PROMPTS[1], max_tokens=10, logprobs=2, **GREEDY
    )
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 10
    assert lp.token_logprobs == pytest.approx([t.logprob for t in ref.logprobs], abs=1e-5)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert all(1 <= len(top) <= 2 for top in lp.top_logprobs)


def test_n_samples_and_batched_prompts(sd_client):
    kw = dict(model=MODEL, max_tokens=8, temperature=1.0, seed=3, extra_body={"ignore_eos": True})
    out = sd_client.completions.create(prompt=PROMPTS[:2], n=3, **kw)
    assert [c.index for c in out.choices] == list(range(6))
    texts = [c.text for c in out.choices]
    assert len(set(texts[:3])) > 1
    assert out.usage.completion_tokens == 6 * 8
    for p, first in ((0, 0), (1, 3)):  # sample 0 of a seeded prompt is the prompt with n = 1
        alone = sd_client.completions.create(prompt=PROMPTS[p], **kw)
        assert texts[first] == alone.choices[0].text
    again = sd_client.completions.create(prompt=PROMPTS[:2], n=3, **kw)
    assert [c.text for c in again.choices] == texts
    chunks = list(sd_client.completions.create(prompt=PROMPTS[:2], n=3, stream=True, **kw))
    streamed = [""] * 6
    for c in chunks:
        for choice in c.choices:
            streamed[choice.index] += choice.text
    assert streamed == texts


def test_chat_n_streams_every_choice(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=USER, n=2, max_tokens=5, seed=1, stream=True, temperature=1.0
        )
    )
    roles = {c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.role}
    finished = {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason}
    assert roles == finished == {0, 1}


def test_penalties_bias_and_vllm_extensions_reach_the_engine(client, offline):
    settings = dict(
        presence_penalty=0.8,
        frequency_penalty=0.5,
        logit_bias={26: 5.0, 120: -100.0},
        repetition_penalty=1.3,
        min_tokens=4,
        bad_words=["w"],
        min_p=0.1,
    )
    ref = offline.generate(PROMPTS[2], greedy(16, **settings))[0]
    plain = offline.generate(PROMPTS[2], greedy(16))[0]
    assert ref.text != plain.text
    openai_args = {k: settings[k] for k in ("presence_penalty", "frequency_penalty")}
    extra = {k: v for k, v in settings.items() if k not in openai_args}
    extra["logit_bias"] = {str(k): v for k, v in settings["logit_bias"].items()}
    out = client.completions.create(
        model=MODEL,
        prompt=PROMPTS[2],
        max_tokens=16,
        temperature=0,
        extra_body={"ignore_eos": True, **extra},
        **openai_args,
    )
    assert out.choices[0].text == ref.text


@pytest.mark.parametrize(
    "body",
    [
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": SCHEMA},
            }
        },
        {"structured_outputs": {"json": SCHEMA}},
        {"guided_json": SCHEMA},
    ],
)
def test_json_schema_output_parses_in_every_spelling(sd_server, body):
    r = httpx.post(
        sd_server.url + CHAT,
        headers=AUTH,
        json={"messages": USER, "max_tokens": 160, "temperature": 0, **body},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    value = json.loads(choice["message"]["content"])
    assert set(value) == {"ok", "size"} and value["size"] in ("S", "M", "L")


def test_choice_regex_and_json_object_through_the_openai_client(sd_client):
    out = sd_client.chat.completions.create(
        model=MODEL,
        messages=USER,
        max_tokens=20,
        extra_body={"guided_choice": ["cat", "dog"]},
    )
    assert out.choices[0].message.content in ("cat", "dog")
    out = sd_client.completions.create(
        model=MODEL, prompt="x", max_tokens=20, extra_body={"guided_regex": "[0-9]{4}"}
    )
    assert len(out.choices[0].text) == 4 and out.choices[0].text.isdigit()
    out = sd_client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=160, response_format={"type": "json_object"}
    )
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(out.choices[0].message.content), dict)


def test_harmless_fields_are_accepted(client):
    out = client.chat.completions.create(
        model=MODEL,
        messages=USER,
        max_completion_tokens=3,
        user="u",
        metadata={"k": "v"},
        service_tier="auto",
        store=False,
        prompt_cache_key="k",
        safety_identifier="s",
        parallel_tool_calls=False,
        tool_choice="none",
        modalities=["text"],
        response_format={"type": "text"},
        stream_options=None,
        n=1,
    )
    assert out.choices[0].finish_reason == "length"
    out = client.completions.create(model=MODEL, prompt="x", max_tokens=2, best_of=1, echo=True)
    assert out.choices[0].text.startswith("x")


def test_langchain_chat_openai_with_its_defaults(sd_server):
    from langchain_openai import ChatOpenAI

    from tests.server.conftest import KEY

    llm = ChatOpenAI(model=MODEL, base_url=f"{sd_server.url}/v1", api_key=KEY, max_tokens=8)
    reply = llm.invoke("hi")
    assert isinstance(reply.content, str) and reply.response_metadata["finish_reason"]
    streamed = "".join(c.content for c in llm.stream("hi"))
    assert isinstance(streamed, str)
    constrained = ChatOpenAI(
        model=MODEL, base_url=f"{sd_server.url}/v1", api_key=KEY, max_tokens=160, temperature=0
    ).with_structured_output({"title": "Item", **SCHEMA}, method="json_schema")
    value = constrained.invoke("hi")
    assert set(value) == {"ok", "size"}


def test_echo_with_logprobs_reports_the_prompt_too(client, offline):
    ids = offline.tokenizer.encode(PROMPTS[0])
    out = client.completions.create(
        model=MODEL, prompt=PROMPTS[0], max_tokens=4, echo=True, logprobs=1, **GREEDY
    )
    lp = out.choices[0].logprobs
    assert out.choices[0].text.startswith(PROMPTS[0])
    assert len(lp.tokens) == len(ids) + 4 and lp.token_logprobs[0] is None
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
