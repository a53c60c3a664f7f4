"""The routes end to end: completions and chat (plain and streamed), models, health, cancellation,
the speculative modes and a server that stays responsive."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from saguaro import LLM
from saguaro.server import routes
from tests.server.conftest import (
    AUTH,
    GREEDY,
    KEY,
    MODEL,
    PROMPTS,
    USER,
    greedy,
    idle_free_blocks,
    num_aborted,
    serve,
    wait_until,
)

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
    ids = offline.tokenizer.encode_chat(messages)
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
    idle_free_blocks(server)
    stat = Path(f"/proc/self/task/{server.ae._thread.native_id}/stat")

    def cpu_ticks() -> int:  # utime + stime of the engine thread
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    before = cpu_ticks()
    time.sleep(0.5)
    assert cpu_ticks() - before <= 1  # a spinning loop would burn ~50 ticks


# ---- cancellation ---------------------------------------------------------------------------


def _long_request(stream: bool) -> dict:
    return {"prompt": "abc", "max_tokens": 250, "ignore_eos": True, "stream": stream}


def test_disconnect_mid_stream_frees_kv_blocks(server):
    free, aborted = idle_free_blocks(server), num_aborted(server)
    with httpx.Client(timeout=30) as http:
        body = _long_request(stream=True)
        with http.stream("POST", f"{server.url}/v1/completions", json=body, headers=AUTH) as r:
            assert r.status_code == 200
            data = (line for line in r.iter_lines() if line.startswith("data: "))
            next(data), next(data)  # two chunks in, then hang up
    wait_until(lambda: num_aborted(server) == aborted + 1)
    assert idle_free_blocks(server) == free


def test_disconnect_while_waiting_for_a_plain_completion_frees_kv_blocks(server):
    free, aborted = idle_free_blocks(server), num_aborted(server)
    body = json.dumps(_long_request(stream=False)).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_until(lambda: server.ae.engine.has_unfinished())
    wait_until(lambda: num_aborted(server) == aborted + 1)
    assert idle_free_blocks(server) == free


def test_beyond_its_waiting_bound_the_server_answers_429_with_retry_after(tiny_llama):
    """One request runs (max_num_seqs 1) and one may wait (max_waiting 1): a third gets 429 with
    Retry-After, which the openai client reads as a rate limit; the two finish whole, and once
    they have, requests are taken again."""
    llm = LLM(model=str(tiny_llama), max_model_len=256, max_num_seqs=1)
    with llm, serve(llm, max_waiting=1) as served:
        client = served.client()
        long = dict(model=MODEL, prompt="def", max_tokens=200, stream=True, **GREEDY)
        first = client.completions.create(**long)
        chunks = iter(first)
        head = next(chunks).choices[0].text  # running
        second = client.completions.create(**long)  # waits for the one place
        wait_until(lambda: served.ae.in_flight() == 2)
        with pytest.raises(openai.RateLimitError) as refused:
            client.completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert refused.value.response.headers["retry-after"] == str(routes.RETRY_AFTER_S)
        assert "capacity" in refused.value.message
        for rest in (list(chunks), list(second)):  # both run to their length, not aborted
            assert head and rest[-1].choices[0].finish_reason == "length"
        wait_until(lambda: served.ae.in_flight() == 0)
        assert client.completions.create(model=MODEL, prompt="x", max_tokens=2).choices


# ---- speculative modes ----------------------------------------------------------------------


def test_sd_streams_every_round_as_one_chunk(tiny_llama, offline):
    """Draft = target: every greedy proposal is accepted, so each round commits k + 1 = 5
    tokens, and each round's tokens must arrive together, as one chunk."""
    ref = offline.generate(PROMPTS[2], greedy(40))[0]
    llm = LLM(
        model=str(tiny_llama),
        draft=str(tiny_llama),
        mode="sd",
        max_model_len=256,
        draft_quantization="none",  # the target's own weights: auto would quantize the draft
        draft_lookup=0,  # its own argmax at every depth: no copies from the context,
        draft_stop_below=0,  # and no stop where the target itself is unsure
    )
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


def test_copies_alone_serve_offline_text_plain_streamed_and_in_chat(tiny_llama, offline):
    """SD with no draft model (draft="lookup") behind the server: the official client gets
    offline AR's text, plain and streamed, and /metrics counts the rounds as copies alone."""
    llm = LLM(model=str(tiny_llama), draft="lookup", max_model_len=256, copy_lookup=1)
    with serve(llm) as served:
        client = served.client()
        for prompt in PROMPTS[:4]:
            ref = offline.generate(prompt, greedy(32))[0].text
            kw = dict(model=MODEL, prompt=prompt, max_tokens=32, **GREEDY)
            assert client.completions.create(**kw).choices[0].text == ref
            chunks = client.completions.create(stream=True, **kw)
            assert "".join(c.choices[0].text for c in chunks) == ref
        chat = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=16, **GREEDY)
        metrics = served.metrics()
    ids = offline.tokenizer.encode_chat(USER)
    assert chat.choices[0].message.content == offline.generate(ids, greedy(16))[0].text
    rounds = {k: v for k, v in metrics.items() if k.startswith("saguaro_rounds_total")}
    assert rounds and all('mode="lookup"' in k or 'mode="ar"' in k for k in rounds)
    assert sum(v for k, v in rounds.items() if 'mode="lookup"' in k and 'k="0"' not in k) > 0


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

        # the worker dies: the server carries on, exactly (AR)
        llm.engine.proposer.worker.proc.kill()
        out = client.completions.create(**kw)
        assert out.choices[0].text == ref.text
        health = httpx.get(f"{served.url}/health")
        assert health.status_code == 503  # degraded: exact, but without its draft for good
        assert health.json() == {"status": "degraded", "mode": "ssd", "draft": "failed"}
        assert served.metrics()['saguaro_draft_worker_state{state="failed"}'] == 1


# ---- robustness -----------------------------------------------------------------------------


def _read_response(s: socket.socket) -> str:
    """One whole HTTP response: uvicorn may send its head and its body in separate segments."""
    data = b""
    while True:
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            if len(body) >= length:
                return data.decode()
        chunk = s.recv(4096)
        assert chunk, "the connection closed before the response was complete"
        data += chunk


def test_a_body_that_never_completes_times_out(server, monkeypatch):
    """A client that sends half a body is answered 408 instead of holding the request open."""
    monkeypatch.setattr(routes, "BODY_TIMEOUT_S", 0.5)
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {KEY}\r\nContent-Length: 100\r\n\r\n".encode()
            + b'{"prompt": '
        )
        reply = _read_response(s)
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
