"""A real ``saguaro serve`` process with a two-rank target: concurrent requests give the
one-process greedy text; SIGTERM ends every rank; a killed rank turns the server into a clear
503 / 500 (no hang), and shutting it down still leaves nothing behind."""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor

import httpx

from saguaro import LLM, SamplingParams
from saguaro.distributed.channel import free_port
from saguaro.distributed.processes import alive, children
from tests.server.test_soak import _port_free, _wait, server_process

PROMPTS = ["def add(a, b):", "import os\n", "hello world", "for i in range(3):", "x = [", "#"]
MAX_TOKENS = 16


def _complete(url: str, prompt: str) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60)


def test_two_rank_server_serves_concurrently_and_stops_every_rank(tiny_llama):
    offline = LLM(str(tiny_llama))
    want = [o.text for o in offline.generate(PROMPTS, SamplingParams(0, max_tokens=MAX_TOKENS))]
    offline.close()
    port = free_port()
    with server_process(port, "--model", str(tiny_llama), "--tensor-parallel-size", "2") as (
        proc,
        url,
    ):
        (rank,) = children(proc.pid)
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            got = list(pool.map(lambda p: _complete(url, p), PROMPTS * 2))
        assert [r.json()["choices"][0]["text"] for r in got] == want * 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM  # drained, then ended
    assert not alive(rank), "a rank outlived its server"
    assert _port_free(port)


def test_a_killed_rank_fails_the_server_clearly_and_leaves_nothing_behind(tiny_llama):
    port = free_port()
    args = ["--model", str(tiny_llama), "--tensor-parallel-size", "2"]
    args += ["--tensor-parallel-timeout-s", "20"]
    with server_process(port, *args) as (proc, url):
        (rank,) = children(proc.pid)
        assert _complete(url, "x").status_code == 200
        os.kill(rank, signal.SIGKILL)
        r = _complete(url, "def f(x):")  # within the rank timeout: a dead peer is seen at once
        assert r.status_code == 500
        _wait(lambda: httpx.get(f"{url}/health").status_code == 503, timeout_s=20)
        health = httpx.get(f"{url}/health").json()
        assert health["status"] == "engine failed"
        assert "rank 1 exited (killed by SIGKILL)" in health["error"]
        again = _complete(url, "y")  # later requests are refused with the reason
        assert again.status_code == 500 and "rank 1" in again.json()["error"]["message"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM  # drained, then ended
        assert not alive(rank)
    assert _port_free(port)
