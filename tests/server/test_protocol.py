"""Request bodies: fuzzed ones never get a 5xx or hang, and the saguaro extensions and limits."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from saguaro import SamplingParams
from saguaro.server.errors import APIError
from saguaro.server.protocol import (
    DEFAULT_COMPLETION_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    ChatCompletionRequest,
    CompletionRequest,
)
from tests.server.conftest import AUTH, CHAT, CMPL, MODEL, PROMPTS, check_error, send

# ---- fuzz -----------------------------------------------------------------------------------

_garbage = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(2**70), 2**70),
    st.text(max_size=12),
    st.lists(st.integers(-3, 300), max_size=4),
    st.dictionaries(st.text(max_size=6), st.integers(), max_size=2),
)
_small_tokens = st.one_of(st.integers(-2, 6), st.text(max_size=3), st.floats(0, 8), st.booleans())
_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant", "developer", "tool", ""]),
        "content": st.one_of(
            st.text(max_size=20),
            st.lists(
                st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=8)}),
                max_size=2,
            ),
            _garbage,
        ),
    },
    optional={"name": st.text(max_size=5), "extra": _garbage},
)
_fields = {
    "model": st.one_of(st.just(MODEL), _garbage),
    "temperature": st.one_of(st.floats(-1, 3), _garbage),
    "top_p": st.one_of(st.floats(-0.5, 1.5), _garbage),
    "top_k": st.one_of(st.integers(-3, 300), _garbage),
    "seed": _garbage,
    "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=5), _garbage),
    "stream": st.one_of(st.booleans(), _garbage),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": st.booleans()}), _garbage),
    "n": st.one_of(st.integers(0, 3), _garbage),
    "user": _garbage,
    "ignore_eos": st.one_of(st.booleans(), _garbage),
    "max_completion_tokens": _small_tokens,
    "logprobs": _garbage,
    "logit_bias": _garbage,
    "presence_penalty": st.one_of(st.floats(-3, 3), _garbage),
    "response_format": _garbage,
    "tools": _garbage,
}
# max_tokens is always present and small, so a valid request generates a few tokens at most.
_completion_body = st.fixed_dictionaries(
    {
        "prompt": st.one_of(
            st.text(max_size=30),
            st.lists(st.integers(-2, 300), max_size=8),
            st.lists(st.text(max_size=10), max_size=2),
            _garbage,
        ),
        "max_tokens": _small_tokens,
    },
    optional=_fields,
)
_chat_body = st.fixed_dictionaries(
    {"messages": st.one_of(st.lists(_message, max_size=3), _garbage), "max_tokens": _small_tokens},
    optional=_fields,
)
_request = st.one_of(
    st.tuples(st.just(CMPL), _completion_body),
    st.tuples(st.just(CHAT), _chat_body),
    st.tuples(st.sampled_from([CMPL, CHAT]), st.binary(max_size=40)),
)


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(request=_request)
def test_fuzzed_requests_never_5xx_or_hang(server, request):
    path, body = request
    r = send(server, "POST", path, body, AUTH)  # the 30 s timeout catches a hang
    assert r.status_code in (200, 400, 404), r.text
    if r.status_code != 200:
        check_error(r, r.status_code)
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.endswith("data: [DONE]\n\n") and '"error"' not in r.text
    else:
        assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_server_still_answers_after_the_fuzz(client):
    assert client.completions.create(model=MODEL, prompt="ok", max_tokens=3).choices


# ---- limits and extensions ------------------------------------------------------------------


def test_five_stop_sequences_get_a_clear_message(server):
    body = {"model": MODEL, "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}
    r = httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH)
    assert r.status_code == 400
    assert "at most 4 stop sequences" in r.json()["error"]["message"]


def test_a_request_names_its_sampling_method(server, client, offline):
    """The `sampling` extension: a seeded coupled request gives coupled AR's text; an unknown
    method is a 400."""
    params = SamplingParams(temperature=0.8, seed=5, max_tokens=12, sampling="coupled")
    ref = offline.generate(PROMPTS[1], params)[0]
    out = client.completions.create(
        model=MODEL,
        prompt=PROMPTS[1],
        max_tokens=12,
        temperature=0.8,
        seed=5,
        extra_body={"sampling": "coupled"},
    )
    assert out.choices[0].text == ref.text
    body = {"model": MODEL, "prompt": "x", "sampling": "gumbel"}
    assert httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH).status_code == 400


# ---- conversion to SamplingParams (no server) -------------------------------------------------


def test_a_request_without_sampling_arguments_gets_openai_defaults():
    req = CompletionRequest.model_validate_json(b'{"prompt": "x"}')
    assert req.token_limit() == DEFAULT_COMPLETION_TOKENS
    assert req.sampling_params(req.token_limit(), None) == SamplingParams(
        temperature=DEFAULT_TEMPERATURE, top_p=DEFAULT_TOP_P, max_tokens=16
    )
    chat = ChatCompletionRequest.model_validate_json(
        b'{"messages": [{"role": "user", "content": "x"}]}'
    )
    assert chat.token_limit(room=100) == 100
    assert (
        ChatCompletionRequest.model_validate(
            {
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 7,
                "max_completion_tokens": 5,
            }
        ).token_limit(room=100)
        == 5
    )


def test_invalid_sampling_values_are_400s():
    req = CompletionRequest.model_validate({"prompt": "x", "stream_options": {}})
    with pytest.raises(APIError) as bad:
        req.sampling_params(4, None)
    assert (bad.value.status, bad.value.param) == (400, "stream")
    with pytest.raises(APIError) as bad:
        CompletionRequest.model_validate({"prompt": "x", "stop": [""]}).sampling_params(4, None)
    assert bad.value.status == 400


def test_prompts_are_a_list_of_text_or_token_lists():
    assert CompletionRequest.model_validate({"prompt": ["a"]}).prompts() == ["a"]
    assert CompletionRequest.model_validate({"prompt": "a"}).prompts() == ["a"]
    assert CompletionRequest.model_validate({"prompt": [[1, 2], [3]]}).prompts() == [[1, 2], [3]]
    assert CompletionRequest.model_validate({"prompt": [1, 2]}).prompts() == [[1, 2]]
    assert CompletionRequest.model_validate({"prompt": ["a", "b"]}).prompts() == ["a", "b"]
