"""Bad requests get OpenAI's error bodies and status codes; an engine failure is reported without
its exception text."""

from __future__ import annotations

import openai
import pytest

from tests.server.conftest import (
    AUTH,
    CHAT,
    CMPL,
    KEY,
    MODEL,
    USER,
    check_error,
    idle_free_blocks,
    send,
)


def bad(name, path, body, status=400, param=None, code=None, method="POST", headers=AUTH):
    return pytest.param(method, path, body, headers, status, param, code, id=name)


TOO_LONG = "context_length_exceeded"
BAD_REQUESTS = [
    bad("malformed JSON", CMPL, b'{"prompt": "x",'),
    bad("not an object", CMPL, b"[1, 2]"),
    bad("empty body", CHAT, b""),
    bad("unknown field", CMPL, {"prompt": "x", "frobnicate": 1}, param="frobnicate"),
    bad("unknown message field", CHAT, {"messages": [{**USER[0], "mood": 1}]}, param="messages"),
    bad("tools", CHAT, {"messages": USER, "tools": [{"type": "function"}]}, param="tools"),
    bad("top_logprobs alone", CHAT, {"messages": USER, "top_logprobs": 2}, param="top_logprobs"),
    bad(
        "top_logprobs > 20",
        CHAT,
        {"messages": USER, "logprobs": True, "top_logprobs": 21},
        param="top_logprobs",
    ),
    bad("audio output", CHAT, {"messages": USER, "modalities": ["audio"]}, param="modalities"),
    bad("predicted output", CHAT, {"messages": USER, "prediction": {}}, param="prediction"),
    bad("store", CHAT, {"messages": USER, "store": True}, param="store"),
    bad("suffix", CMPL, {"prompt": "x", "suffix": "y"}, param="suffix"),
    bad("best_of > n", CMPL, {"prompt": "x", "best_of": 3}, param="best_of"),
    bad("logprobs > 5", CMPL, {"prompt": "x", "logprobs": 6}, param="logprobs"),
    bad("penalty > 2", CMPL, {"prompt": "x", "presence_penalty": 2.5}, param="presence_penalty"),
    bad("logit_bias key", CMPL, {"prompt": "x", "logit_bias": {"a": 1}}, param="logit_bias"),
    bad("logit_bias out of vocab", CMPL, {"prompt": "x", "logit_bias": {"99999": 1}}),
    bad("logit_bias > 100", CMPL, {"prompt": "x", "logit_bias": {"5": 101}}),
    bad("bad regex", CMPL, {"prompt": "x", "structured_outputs": {"regex": "[a-"}}),
    bad(
        "two constraints",
        CMPL,
        {"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]},
    ),
    bad(
        "json_schema without schema",
        CHAT,
        {"messages": USER, "response_format": {"type": "json_schema"}},
        param="response_format",
    ),
    bad("negative temperature", CMPL, {"prompt": "x", "temperature": -0.5}, param="temperature"),
    bad("temperature > 2", CHAT, {"messages": USER, "temperature": 2.5}, param="temperature"),
    bad("temperature string", CMPL, {"prompt": "x", "temperature": "0.5"}, param="temperature"),
    bad("top_p = 0", CMPL, {"prompt": "x", "top_p": 0}, param="top_p"),
    bad("top_p > 1", CHAT, {"messages": USER, "top_p": 1.5}, param="top_p"),
    bad("max_tokens = 0", CMPL, {"prompt": "x", "max_tokens": 0}, param="max_tokens"),
    bad("max_tokens float", CHAT, {"messages": USER, "max_tokens": 1.5}, param="max_tokens"),
    bad("max_tokens bool", CMPL, {"prompt": "x", "max_tokens": True}, param="max_tokens"),
    bad("top_k < -1", CMPL, {"prompt": "x", "top_k": -2}, param="top_k"),
    bad("seed out of range", CMPL, {"prompt": "x", "seed": 2**64}, param="seed"),
    bad("empty stop string", CMPL, {"prompt": "x", "stop": [""]}),
    bad("five stop strings", CMPL, {"prompt": "x", "stop": list("abcde")}, param="stop"),
    bad("n = 0", CMPL, {"prompt": "x", "n": 0}, param="n"),
    bad("stream_options, no stream", CMPL, {"prompt": "x", "stream_options": {}}, param="stream"),
    bad("empty prompt", CMPL, {"prompt": ""}, param="prompt"),
    bad("token id out of vocab", CMPL, {"prompt": [1, 99999]}, param="prompt"),
    bad("an empty prompt among two", CMPL, {"prompt": ["a", ""]}, param="prompt"),
    bad("prompt too long", CMPL, {"prompt": "x" * 300}, param="prompt", code=TOO_LONG),
    bad("token prompt too long", CMPL, {"prompt": [65] * 256}, param="prompt", code=TOO_LONG),
    bad(
        "chat too long",
        CHAT,
        {"messages": [{"role": "user", "content": "x" * 300}]},
        param="messages",
        code=TOO_LONG,
    ),
    bad("no messages", CHAT, {"messages": []}, param="messages"),
    bad("missing messages", CHAT, {"model": MODEL}, param="messages"),
    bad("unknown role", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, param="messages"),
    bad("unknown model", CMPL, {"prompt": "x", "model": "gpt-5"}, 404, "model", "model_not_found"),
    bad(
        "unknown chat model",
        CHAT,
        {"messages": USER, "model": "gpt-5"},
        404,
        "model",
        "model_not_found",
    ),
    bad("unknown model card", "/v1/models/gpt-5", None, 404, "model", "model_not_found", "GET"),
    bad("unknown route", "/v1/embeddings", {"input": "x"}, 404),
    bad("wrong method", CMPL, None, 405, method="GET"),
    bad("body too large", CMPL, b"x" * (9 << 20), 413),
    bad("missing API key", CMPL, {"prompt": "x"}, 401, headers={}),
    bad(
        "wrong API key",
        CMPL,
        {"prompt": "x"},
        401,
        code="invalid_api_key",
        headers={"Authorization": "Bearer nope"},
    ),
    bad(
        "not a bearer token",
        "/v1/models",
        None,
        401,
        code="invalid_api_key",
        method="GET",
        headers={"Authorization": f"Basic {KEY}"},
    ),
    bad("metrics need the key", "/metrics", None, 401, method="GET", headers={}),
]


@pytest.mark.parametrize("method, path, body, headers, status, param, code", BAD_REQUESTS)
def test_bad_request_gets_an_openai_error(
    server, client, method, path, body, headers, status, param, code
):
    err = check_error(send(server, method, path, body, headers), status)
    assert (err["param"], err["code"]) == (param, code)
    assert err["type"] == "invalid_request_error"
    assert client.models.list().data[0].id == MODEL  # and the server still serves


def test_openai_client_raises_the_matching_errors(server, client):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="x", temperature=7)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=USER)
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=2).usage.completion_tokens


def test_engine_failure_fails_requests_in_flight_and_the_server_carries_on(
    server, client, monkeypatch
):
    def broken_step():
        monkeypatch.undo()  # fail once
        raise RuntimeError("boom")

    errors = server.ae.stats.finished["error"]
    monkeypatch.setattr(server.ae.engine, "step", broken_step)
    # the client learns that the engine failed, not what the exception said
    with pytest.raises(openai.InternalServerError, match="engine failed") as failed:
        client.completions.create(model=MODEL, prompt="x", max_tokens=4)
    assert "boom" not in str(failed.value)
    monkeypatch.setattr(server.ae.engine, "step", broken_step)
    stream = client.chat.completions.create(model=MODEL, messages=USER, stream=True)
    with pytest.raises(openai.APIError, match="engine failed") as failed:
        list(stream)
    assert "boom" not in str(failed.value)
    assert server.ae.stats.finished["error"] == errors + 2
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=4).choices
    assert idle_free_blocks(server) == server.ae.engine.block_manager.num_blocks
