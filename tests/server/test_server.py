"""The HTTP server, started for real with uvicorn on a free loopback port and driven with the
official ``openai`` client (and httpx / raw sockets where a client must misbehave)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from saguaro import LLM, SamplingParams
from saguaro.server.app import build_app
from saguaro.server.async_engine import AsyncEngine
from saguaro.server.chat import chat_prompt_ids

KEY = "test-key"
MODEL = "tiny"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPTS = [f"{word} {i}:" for i, word in enumerate(["def", "class", "for x in", "import"] * 8)]


@dataclass
class Served:
    url: str
    ae: AsyncEngine

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=KEY, max_retries=0, timeout=60)

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"{self.url}/metrics", headers=AUTH).text
        return {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line and not line.startswith("#")
        }


@contextlib.contextmanager
def serve(llm: LLM) -> Iterator[Served]:
    app = build_app(llm, api_key=KEY, served_model_name=MODEL)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # a free port, held from the start: no race with other tests
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started)
    try:
        yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}", app.state.async_engine)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def wait_until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def offline(tiny_llama):
    return LLM(model=str(tiny_llama), max_model_len=256)


@pytest.fixture(scope="module")
def server(tiny_llama):
    llm = LLM(model=str(tiny_llama), max_model_len=256)
    with serve(llm) as served:
        yield served


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kw)


# The same over the API (ignore_eos is a saguaro extension, sent as an extra argument).
GREEDY = dict(temperature=0, extra_body={"ignore_eos": True})


# ---- completions and chat ------------------------------------------------------------------


def test_completion_plain_and_streamed(client, offline):
    ref = offline.generate(PROMPTS[0], greedy(20))[0]
    kw = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=20, **GREEDY)
    out = client.completions.create(**kw)
    assert out.choices[0].text == ref.text and out.choices[0].finish_reason == "length"
    assert out.model == MODEL and out.object == "text_completion"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (
        len(ref.prompt_token_ids),
        len(ref.token_ids),
    )
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens

    chunks = list(
        client.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ref.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage == out.usage
    assert all(c.usage is None for c in chunks[:-1])

    # Token-id prompts, and a list holding one prompt, are the same request.
    by_ids = client.completions.create(**{**kw, "prompt": ref.prompt_token_ids})
    as_list = client.completions.create(**{**kw, "prompt": [PROMPTS[0]]})
    assert by_ids.choices[0].text == as_list.choices[0].text == ref.text


def test_stop_string_is_cut_and_never_streamed(client, offline):
    full = offline.generate(PROMPTS[1], greedy(30))[0].text
    stop = full[10:13]
    ref = offline.generate(PROMPTS[1], greedy(30, stop=[stop]))[0]
    assert ref.finish_reason == "stop"
    kw = dict(model=MODEL, prompt=PROMPTS[1], max_tokens=30, stop=[stop], **GREEDY)
    plain = client.completions.create(**kw)
    streamed = client.completions.create(**kw, stream=True)
    chunks = [c.choices[0] for c in streamed]
    assert plain.choices[0].text == "".join(c.text for c in chunks) == ref.text
    assert plain.choices[0].finish_reason == chunks[-1].finish_reason == "stop"


def test_chat_plain_and_streamed(client, offline):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Write a loop."},
    ]
    ids = chat_prompt_ids(offline.tokenizer, messages)
    ref = offline.generate(ids, greedy(12))[0]
    kw = dict(model=MODEL, messages=messages, **GREEDY)
    out = client.chat.completions.create(**kw, max_tokens=12)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == ref.text
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(ids), 12)

    stream = client.chat.completions.create(
        **kw, max_completion_tokens=12, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12 and chunks[-1].usage.prompt_tokens == len(ids)

    # Without max_tokens a chat reply may run to the end of the context.
    parts = [{"type": "text", "text": "Write a loop."}]
    long = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": parts}], **GREEDY
    )
    assert long.usage.total_tokens == 256 and long.choices[0].finish_reason == "length"


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    health = httpx.get(f"{server.url}/health")  # no key needed
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "mode": "ar", "draft": "none"}


def test_32_concurrent_greedy_requests_match_offline(server, offline):
    params = greedy(24)
    expected = [o.text for o in offline.generate(PROMPTS, params)]

    async def one(client: openai.AsyncOpenAI, i: int) -> str:
        kw = dict(model=MODEL, prompt=PROMPTS[i], max_tokens=24, **GREEDY)
        if i % 2:  # half streamed, half not: both share the batch
            chunks = await client.completions.create(**kw, stream=True)
            return "".join([c.choices[0].text async for c in chunks])
        out = await client.completions.create(**kw)
        return out.choices[0].text

    async def run() -> list[str]:
        async with openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=120
        ) as client:
            return await asyncio.gather(*(one(client, i) for i in range(len(PROMPTS))))

    assert asyncio.run(run()) == expected


def test_idle_engine_thread_sleeps(server):
    _idle(server)
    stat = Path(f"/proc/self/task/{server.ae._thread.native_id}/stat")

    def cpu_ticks() -> int:  # utime + stime of the engine thread
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    before = cpu_ticks()
    time.sleep(0.5)
    assert cpu_ticks() - before <= 1  # a spinning loop would burn ~50 ticks


# ---- cancellation ---------------------------------------------------------------------------


def _idle(server: Served) -> int:
    wait_until(lambda: not server.ae.engine.has_unfinished())
    return server.ae.engine.block_manager.num_free_blocks


def _aborted(server: Served) -> int:
    return server.ae.stats.finished["abort"]


def _long_request(stream: bool) -> dict:
    return {"prompt": "abc", "max_tokens": 250, "ignore_eos": True, "stream": stream}


def test_disconnect_mid_stream_frees_kv_blocks(server):
    free, aborted = _idle(server), _aborted(server)
    with httpx.Client(timeout=30) as http:
        body = _long_request(stream=True)
        with http.stream("POST", f"{server.url}/v1/completions", json=body, headers=AUTH) as r:
            assert r.status_code == 200
            data = (line for line in r.iter_lines() if line.startswith("data: "))
            next(data), next(data)  # two chunks in, then hang up
    wait_until(lambda: _aborted(server) == aborted + 1)
    assert _idle(server) == free


def test_disconnect_while_waiting_for_a_plain_completion_frees_kv_blocks(server):
    free, aborted = _idle(server), _aborted(server)
    body = json.dumps(_long_request(stream=False)).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_until(lambda: server.ae.engine.has_unfinished())
    wait_until(lambda: _aborted(server) == aborted + 1)
    assert _idle(server) == free


# ---- bad requests ---------------------------------------------------------------------------

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]


def bad(name, path, body, status=400, param=None, code=None, method="POST", headers=AUTH):
    return pytest.param(method, path, body, headers, status, param, code, id=name)


TOO_LONG = "context_length_exceeded"
BAD_REQUESTS = [
    bad("malformed JSON", CMPL, b'{"prompt": "x",'),
    bad("not an object", CMPL, b"[1, 2]"),
    bad("empty body", CHAT, b""),
    bad("unknown field", CMPL, {"prompt": "x", "frobnicate": 1}, param="frobnicate"),
    bad("unknown message field", CHAT, {"messages": [{**USER[0], "mood": 1}]}, param="messages"),
    bad("logprobs (unsupported)", CHAT, {"messages": USER, "logprobs": True}, param="logprobs"),
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
    bad("n = 2", CMPL, {"prompt": "x", "n": 2}, param="n"),
    bad("stream_options, no stream", CMPL, {"prompt": "x", "stream_options": {}}, param="stream"),
    bad("empty prompt", CMPL, {"prompt": ""}, param="prompt"),
    bad("token id out of vocab", CMPL, {"prompt": [1, 99999]}, param="prompt"),
    bad("two prompts", CMPL, {"prompt": ["a", "b"]}, param="prompt"),
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


def _send(server: Served, method: str, path: str, body, headers) -> httpx.Response:
    content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **headers}
    return httpx.request(method, server.url + path, content=content, headers=headers, timeout=30)


def _check_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


@pytest.mark.parametrize("method, path, body, headers, status, param, code", BAD_REQUESTS)
def test_bad_request_gets_an_openai_error(
    server, client, method, path, body, headers, status, param, code
):
    err = _check_error(_send(server, method, path, body, headers), status)
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
    assert _idle(server) == server.ae.engine.block_manager.num_blocks


# ---- metrics --------------------------------------------------------------------------------


def test_metrics_count_requests_tokens_and_latency(server, client):
    before = server.metrics()
    client.completions.create(model=MODEL, prompt="x", max_tokens=5, **GREEDY)
    after = server.metrics()

    def delta(key: str) -> float:
        return after[key] - before.get(key, 0.0)

    assert delta('saguaro_requests_total{finish_reason="length"}') == 1
    assert delta("saguaro_generation_tokens_total") == 5
    assert delta("saguaro_prompt_tokens_total") == 1
    assert delta("saguaro_request_latency_seconds_count") == 1
    assert delta("saguaro_time_to_first_token_seconds_count") == 1
    assert delta('saguaro_accepted_length_bucket{le="1"}') == 5  # AR: one token per round
    assert delta('saguaro_http_requests_total{route="/v1/completions",status="200"}') == 1
    assert after['saguaro_draft_worker_state{state="none"}'] == 1
    assert after["saguaro_engine_up"] == 1 and after["saguaro_mean_accepted_length"] == 1
    assert math.isnan(after["saguaro_ssd_cache_hit_rate"])
    assert after["saguaro_kv_blocks_free"] == after["saguaro_kv_blocks_total"]
    r = httpx.get(f"{server.url}/metrics", headers=AUTH)
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")


# ---- speculative modes ----------------------------------------------------------------------


def test_sd_streams_every_round_as_one_chunk(tiny_llama, offline):
    """Draft = target: every greedy proposal is accepted, so each round commits k + 1 = 5
    tokens, and each round's tokens must arrive together, as one chunk."""
    ref = offline.generate(PROMPTS[2], greedy(40))[0]
    llm = LLM(model=str(tiny_llama), draft=str(tiny_llama), mode="sd", max_model_len=256)
    with serve(llm) as served:
        chunks = list(
            served.client().completions.create(
                model=MODEL, prompt=PROMPTS[2], max_tokens=40, stream=True, **GREEDY
            )
        )
        metrics = served.metrics()
    assert "".join(c.choices[0].text for c in chunks) == ref.text
    assert len(chunks) <= 40 // 5 + 1
    assert metrics["saguaro_mean_accepted_length"] == 5
    assert metrics['saguaro_draft_worker_state{state="running"}'] == 1


def test_ssd_serves_exactly_and_reports_a_failed_draft_worker(tiny_llama, tiny_draft, offline):
    ref = offline.generate(PROMPTS[3], greedy(16))[0]
    kw = dict(model=MODEL, prompt=PROMPTS[3], max_tokens=16, **GREEDY)
    with (
        LLM(
            model=str(tiny_llama),
            draft=str(tiny_draft),
            mode="ssd",
            max_model_len=256,
            draft_restarts=0,
        ) as llm,
        serve(llm) as served,
    ):
        client = served.client()
        out = client.completions.create(**kw)
        assert out.choices[0].text == ref.text
        metrics = served.metrics()
        assert metrics["saguaro_ssd_rounds_total"] > 0
        assert 0 <= metrics["saguaro_ssd_cache_hit_rate"] <= 1
        assert httpx.get(f"{served.url}/health").json()["draft"] == "running"

        llm.engine.proposer.proc.kill()  # the worker dies: the server carries on, exactly (AR)
        out = client.completions.create(**kw)
        assert out.choices[0].text == ref.text
        health = httpx.get(f"{served.url}/health")
        assert health.status_code == 503  # degraded: exact, but without its draft for good
        assert health.json() == {"status": "degraded", "mode": "ssd", "draft": "failed"}
        assert served.metrics()['saguaro_draft_worker_state{state="failed"}'] == 1


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
    "logprobs": _garbage,  # an OpenAI argument saguaro does not take
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
    r = _send(server, "POST", path, body, AUTH)  # the 30 s timeout catches a hang
    assert r.status_code in (200, 400, 404), r.text
    if r.status_code != 200:
        _check_error(r, r.status_code)
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.endswith("data: [DONE]\n\n") and '"error"' not in r.text
    else:
        assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_server_still_answers_after_the_fuzz(client):
    assert client.completions.create(model=MODEL, prompt="ok", max_tokens=3).choices


# ---- robustness -----------------------------------------------------------------------------


def test_five_stop_sequences_get_a_clear_message(server):
    body = {"model": MODEL, "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}
    r = httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH)
    assert r.status_code == 400
    assert "at most 4 stop sequences" in r.json()["error"]["message"]


def test_a_body_that_never_completes_times_out(server, monkeypatch):
    """A client that sends half a body is answered 408 instead of holding the request open."""
    from saguaro.server import app as app_module

    monkeypatch.setattr(app_module, "BODY_TIMEOUT_S", 0.5)
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {KEY}\r\nContent-Length: 100\r\n\r\n".encode()
            + b'{"prompt": '
        )
        reply = s.recv(4096).decode()
    assert reply.startswith("HTTP/1.1 408") and "not received within" in reply


def test_a_huge_prompt_does_not_stall_other_requests(server):
    """Tokenising a multi-megabyte prompt happens off the event loop: /health answers
    meanwhile."""
    big = "word " * 1_500_000  # 7.5 MB of text
    done = threading.Event()

    def post() -> None:
        body = {"model": MODEL, "prompt": big, "max_tokens": 1}
        httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=120)
        done.set()

    threading.Thread(target=post, daemon=True).start()
    time.sleep(0.3)  # the big request is being tokenised
    worst = 0.0
    while not done.is_set():
        t0 = time.perf_counter()
        assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
        worst = max(worst, time.perf_counter() - t0)
        time.sleep(0.05)
    assert worst < 1.0, f"/health took {worst:.2f} s while a huge prompt was tokenised"


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
