"""The load a serving benchmark offers: chat completions streamed through the official ``openai``
client (``AsyncOpenAI``), each chunk timed as it arrives, sent at a fixed concurrency (a closed
loop: each of C clients sends its next request when its last one ends) or at Poisson arrivals
(an open loop: requests arrive at a mean rate, however many are in flight)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import openai

from saguaro.bench.serve_stats import RequestRecord

# The openai client retries nothing (it would also retry server errors): a failure counts.
NO_RETRIES = 0
# ...but a request that failed at once on a connection the server had closed is sent again this
# many times at most, and the retry is recorded (RequestRecord.retries).
STALE_CONNECTION_RETRIES = 1

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class RequestShape:
    """What every request of a run asks for."""

    max_tokens: int
    temperature: float
    seed: int  # request i is seeded seed + i
    ignore_eos: bool  # every request generates max_tokens (both servers accept it)
    timeout_s: float


def client(url: str, timeout_s: float) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="none", max_retries=NO_RETRIES, timeout=timeout_s
    )


async def _stream(
    api: openai.AsyncOpenAI,
    model: str,
    prompt: str,
    shape: RequestShape,
    rec: RequestRecord,
    sent: float,
) -> None:
    """Send the request and time into ``rec`` each chunk that carries text, from ``sent``."""
    stream = await api.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=shape.max_tokens,
        temperature=shape.temperature,
        seed=shape.seed + rec.index,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": shape.ignore_eos},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            rec.chunk_s.append(time.perf_counter() - sent)
        if chunk.usage is not None:
            rec.output_tokens = chunk.usage.completion_tokens
            rec.prompt_tokens = chunk.usage.prompt_tokens


def _stale_connection(e: Exception, rec: RequestRecord) -> bool:
    """A connection error before any response, not a timeout, with a retry left: the server
    closed a kept-alive connection as the client's pool reused it (seen with llama-server)."""
    return (
        isinstance(e, openai.APIConnectionError)
        and not isinstance(e, openai.APITimeoutError)
        and not rec.chunk_s
        and rec.retries < STALE_CONNECTION_RETRIES
    )


async def one_request(
    api: openai.AsyncOpenAI,
    model: str,
    prompt: str,
    index: int,
    shape: RequestShape,
    level_start: float,
) -> RequestRecord:
    """Stream one chat completion, timing each chunk that carries text from the first send
    (a retry on a stale connection included)."""
    sent = time.perf_counter()
    rec = RequestRecord(
        index=index, ok=False, sent_s=sent - level_start, latency_s=0.0, ttft_s=None
    )
    while not rec.ok:
        try:
            await _stream(api, model, prompt, shape, rec, sent)
            rec.ok = True
        except (openai.OpenAIError, asyncio.TimeoutError) as e:
            if not _stale_connection(e, rec):
                rec.error = f"{type(e).__name__}: {e}"
                break
            rec.retries += 1
    rec.latency_s = time.perf_counter() - sent
    rec.ttft_s = rec.chunk_s[0] if rec.chunk_s else None
    if rec.ok and not rec.output_tokens:  # a server without usage: count its chunks
        rec.output_tokens = len(rec.chunk_s)
    return rec


async def closed_loop(
    items: list[T], concurrency: int, run: Callable[[T], Awaitable[R]]
) -> list[R]:
    """``run`` over every item by ``concurrency`` clients, each taking the next item when its
    last one ends; the results in the order they finished."""
    queue: asyncio.Queue[T] = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)
    results: list[R] = []

    async def client_loop() -> None:
        while not queue.empty():
            results.append(await run(queue.get_nowait()))

    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    return results


async def fixed_concurrency(
    url: str, model: str, prompts: list[str], concurrency: int, shape: RequestShape
) -> tuple[list[RequestRecord], float]:
    """Every prompt sent by ``concurrency`` clients in turn; the records and the wall time from
    the first send to the last response."""
    api = client(url, shape.timeout_s)
    start = time.perf_counter()

    async def one(i: int) -> RequestRecord:
        return await one_request(api, model, prompts[i], i, shape, start)

    async with api:
        records = await closed_loop(list(range(len(prompts))), concurrency, one)
    return sorted(records, key=lambda r: r.index), time.perf_counter() - start


async def poisson_arrivals(
    url: str, model: str, prompts: list[str], rate: float, shape: RequestShape
) -> tuple[list[RequestRecord], float]:
    """Every prompt sent at the arrivals of a Poisson process of ``rate`` requests per second
    (seeded: the same schedule for every engine), whatever is still in flight."""
    api = client(url, shape.timeout_s)
    gaps = random.Random(f"{shape.seed}/poisson/{rate}")
    start = time.perf_counter()
    tasks = []
    async with api:
        due = 0.0
        for i, prompt in enumerate(prompts):
            due += gaps.expovariate(rate)
            await asyncio.sleep(max(0.0, due - (time.perf_counter() - start)))
            tasks.append(asyncio.create_task(one_request(api, model, prompt, i, shape, start)))
        records = list(await asyncio.gather(*tasks))
    return records, time.perf_counter() - start
