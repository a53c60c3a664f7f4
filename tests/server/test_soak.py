"""A bounded soak of a real `saguaro serve` process in SSD mode: ordinary traffic, requests that
fill the context, poison sampling values, client disconnects and a draft worker SIGKILLed twice,
then SIGTERM. Everything a well-formed request asks for must come back, exactly."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from saguaro import LLM, SamplingParams
from saguaro.bench.serve_stats import parse_prometheus
from saguaro.bench.soak import rss_mib
from saguaro.distributed.channel import free_port
from saguaro.distributed.processes import children

CONTEXT = 128
REQUESTS = 240
CONCURRENCY = 12
KILL_AT = (REQUESTS // 3, 2 * REQUESTS // 3)  # SIGKILL the draft worker at these requests
RSS_GROWTH_BOUND_MB = 150  # the server's RSS after the soak vs after its warm-up requests
PROMPTS = ["def add(a, b):", "import os\n", "hello world", "for i in range(3):", "x = [", "#"]
POISON = [dict(temperature=1e-38), dict(temperature=1.0, top_p=1e-50), dict(top_k=2**63)]


def _metrics(url: str) -> dict[str, float]:
    return parse_prometheus(httpx.get(f"{url}/metrics").text)


def _wait(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@contextlib.contextmanager
def server_process(port: int, *args: str):
    """``saguaro serve --port port *args``, once its /health answers 200; killed on the way out
    if still running."""
    cmd = [sys.executable, "-m", "saguaro", "serve", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def plan(rng: random.Random) -> list[dict]:
    """The workload: one dict per request (what to send, what to expect)."""
    jobs = []
    for i in range(REQUESTS):
        prompt = PROMPTS[i % len(PROMPTS)]
        kind = rng.choice(["greedy", "greedy", "sampled", "to_the_end", "poison", "disconnect"])
        job = dict(
            i=i, kind=kind, prompt=prompt, chat=rng.random() < 0.5, stream=rng.random() < 0.5
        )
        body: dict = {"max_tokens": rng.randint(4, 24)}
        if kind == "greedy":
            body["temperature"] = 0
        elif kind == "sampled":
            body.update(temperature=0.8, top_p=0.9, seed=i)
        elif kind == "to_the_end":  # chat without max_tokens fills the context
            body = {"temperature": 0} if job["chat"] else {"temperature": 0, "max_tokens": CONTEXT}
        elif kind == "poison":
            body.update(POISON[i % len(POISON)])
        else:
            job["stream"] = True
        job["body"] = body
        jobs.append(job)
    return jobs


def send(url: str, job: dict) -> dict:
    """Run one request; return its text, finish reason, status and latency."""
    body = dict(job["body"], stream=job["stream"])
    if job["chat"]:
        route, body["messages"] = (
            "/v1/chat/completions",
            [{"role": "user", "content": job["prompt"]}],
        )
    else:
        route, body["prompt"] = "/v1/completions", job["prompt"]
    t0 = time.perf_counter()
    text, reason = "", None
    with httpx.Client(timeout=120) as client:
        if not job["stream"]:
            r = client.post(url + route, json=body)
            if r.status_code != 200:
                return dict(status=r.status_code, error=r.text, latency=time.perf_counter() - t0)
            choice = r.json()["choices"][0]
            text = choice["message"]["content"] if job["chat"] else choice["text"]
            reason = choice["finish_reason"]
        else:
            with client.stream("POST", url + route, json=body) as r:
                if r.status_code != 200:
                    return dict(status=r.status_code, error=r.read(), latency=0.0)
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        return dict(status=500, error=event, latency=time.perf_counter() - t0)
                    if not event["choices"]:
                        continue
                    c = event["choices"][0]
                    text += (c.get("delta") or {}).get("content", "") if job["chat"] else c["text"]
                    reason = c["finish_reason"] or reason
                    if job["kind"] == "disconnect":
                        break  # the client goes away mid-stream
    return dict(status=200, text=text, reason=reason, latency=time.perf_counter() - t0)


@pytest.mark.slow
def test_soak_ssd_server(tiny_llama, close_draft):
    rng = random.Random(0)
    jobs = plan(rng)
    offline = LLM(model=str(tiny_llama), max_model_len=CONTEXT)
    tok = offline.engine.tokenizer
    port = free_port()
    args = ["--model", str(tiny_llama), "--draft", str(close_draft), "--mode", "ssd", "--k", "3"]
    # SSD on every round, whatever the cost model would choose: the worker is what is soaked
    args += ["--max-model-len", str(CONTEXT), "--shutdown-grace-s", "5", "--no-ar-fallback"]
    with server_process(port, *args) as (proc, url):
        warm = [send(url, j) for j in jobs[:12]]
        assert all(r["status"] == 200 for r in warm), warm
        rss_before = rss_mib(proc.pid)
        results: dict[int, dict] = {}
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            futures = {job["i"]: pool.submit(send, url, job) for job in jobs}
            for threshold in KILL_AT:  # the draft worker dies under load, twice
                _wait(lambda t=threshold: sum(f.done() for f in futures.values()) >= t)
                _wait(lambda: bool(children(proc.pid)))  # back from the last kill
                for w in children(proc.pid):
                    os.kill(w, signal.SIGKILL)
            for i, f in futures.items():
                results[i] = f.result()
        rss_after = rss_mib(proc.pid)

        def restarted() -> bool:  # a restart is due once its backoff passed, at an engine step
            assert send(url, dict(jobs[0], stream=False))["status"] == 200
            m = _metrics(url)
            return m["saguaro_draft_worker_restarts_total"] == len(KILL_AT) and bool(
                m['saguaro_draft_worker_state{state="running"}']
            )

        _wait(restarted)
        rounds = _metrics(url)["saguaro_ssd_rounds_total"]  # and SSD rounds go on
        assert send(url, dict(jobs[0], stream=False))["status"] == 200
        m = _metrics(url)
        assert m["saguaro_ssd_rounds_total"] > rounds
        assert m["saguaro_engine_sequences"] == 0 and m["saguaro_requests_running"] == 0
        assert m["saguaro_kv_blocks_free"] == m["saguaro_kv_blocks_total"]
        assert rss_after - rss_before < RSS_GROWTH_BOUND_MB, (rss_before, rss_after)

        # SIGTERM with streams in flight: each ends with a final chunk, nothing is left behind
        worker = children(proc.pid)
        long_job = dict(
            jobs[0], kind="sampled", stream=True, body={"temperature": 0.7, "max_tokens": 100}
        )
        with ThreadPoolExecutor(4) as pool:
            streams = [pool.submit(send, url, long_job) for _ in range(4)]
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            ended = [s.result() for s in streams]
        assert proc.wait(timeout=30) is not None
        assert all(r["status"] == 200 and r["reason"] is not None for r in ended), [
            {k: v for k, v in r.items() if k != "text"} for r in ended
        ]
        assert worker and not any(os.path.exists(f"/proc/{w}") for w in worker), "orphan worker"
        assert _port_free(port)

    errors = {
        i: r for i, r in results.items() if r["status"] != 200 and jobs[i]["kind"] != "disconnect"
    }
    assert not errors, errors
    greedy = [
        job for job in jobs if job["body"].get("temperature") == 0 and job["kind"] != "disconnect"
    ]
    prompts, params = [], []
    for job in greedy:
        if job["chat"]:  # greedy chat: the same prompt ids the server builds
            ids = tok.encode_chat([{"role": "user", "content": job["prompt"]}])
        else:
            ids = offline.engine.encode_prompt(job["prompt"])
        max_tokens = job["body"].get("max_tokens") or CONTEXT - len(ids)
        prompts.append(ids)
        params.append(SamplingParams(temperature=0, max_tokens=min(max_tokens, CONTEXT - len(ids))))
    # one batch, as the server ran them: greedy tokens do not depend on a request's batch
    for job, out in zip(greedy, offline.generate(prompts, params), strict=True):
        assert results[job["i"]]["text"] == out.text, job
    assert len(greedy) > REQUESTS // 3
    latencies = sorted(r["latency"] for r in results.values() if r["status"] == 200)
    print(
        f"soak: {len(results)} requests, {len(errors)} errors, p50 "
        f"{statistics.median(latencies):.3f} s, p99 {latencies[int(0.99 * len(latencies))]:.3f} s, "
        f"restarts {int(m['saguaro_draft_worker_restarts_total'])}, RSS {rss_before:.0f} -> "
        f"{rss_after:.0f} MB"
    )
