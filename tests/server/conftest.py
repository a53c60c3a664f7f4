"""The HTTP server under test, started for real with uvicorn on a free loopback port and driven
with the official ``openai`` client (and httpx / raw sockets where a client must misbehave)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
import uvicorn

from saguaro import LLM, SamplingParams
from saguaro.server.async_engine import AsyncEngine
from saguaro.server.routes import build_app

KEY = "test-key"
MODEL = "tiny"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]
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
def serve(llm: LLM, max_waiting: int | None = None) -> Iterator[Served]:
    app = build_app(llm, api_key=KEY, served_model_name=MODEL, max_waiting=max_waiting)
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


# ---- helpers ----------------------------------------------------------------------------------


def idle_free_blocks(server: Served) -> int:
    wait_until(lambda: not server.ae.engine.has_unfinished())
    return server.ae.engine.block_manager.num_free_blocks


def num_aborted(server: Served) -> int:
    return server.ae.stats.finished["abort"]


def send(server: Served, method: str, path: str, body, headers) -> httpx.Response:
    content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **headers}
    return httpx.request(method, server.url + path, content=content, headers=headers, timeout=30)


def check_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err
