"""Bounded load run against a running saguaro server: a fixed number of completion requests at a
fixed concurrency, then latency percentiles, errors and throughput. Exits 1 if any request failed.

    python scripts/load_test.py [--url http://127.0.0.1:8000] [--requests 200] [--concurrency 16]
        [--max-tokens 32] [--temperature 0.8] [--stream] [--api-key KEY]

Every request sets ``ignore_eos`` (a saguaro extension) so each generates exactly
``--max-tokens`` tokens, and a per-request seed, so runs are repeatable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from dataclasses import dataclass

import httpx

PROMPTS = [
    "def fibonacci(n):",
    "class Stack:\n    def __init__(self):",
    "import numpy as np\n\n",
    "for i in range(10):",
    "# Parse a CSV file and return the rows\n",
    "def quicksort(xs):",
]


@dataclass
class Result:
    ok: bool
    latency_s: float
    ttft_s: float | None = None
    tokens: int = 0
    error: str = ""


async def one(http: httpx.AsyncClient, args: argparse.Namespace, i: int) -> Result:
    body = {
        "prompt": PROMPTS[i % len(PROMPTS)],
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "seed": i,
        "ignore_eos": True,
        "stream": args.stream,
    }
    if args.stream:
        body["stream_options"] = {"include_usage": True}
    start = time.perf_counter()
    try:
        if not args.stream:
            r = await http.post("/v1/completions", json=body)
            if r.status_code != 200:
                return Result(False, time.perf_counter() - start, error=f"{r.status_code} {r.text}")
            tokens = r.json()["usage"]["completion_tokens"]
            return Result(True, time.perf_counter() - start, tokens=tokens)
        ttft, tokens = None, 0
        async with http.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return Result(False, time.perf_counter() - start, error=f"{r.status_code} {r.text}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line.removeprefix("data: "))
                if "error" in chunk:
                    return Result(False, time.perf_counter() - start, error=str(chunk["error"]))
                if ttft is None and chunk["choices"] and chunk["choices"][0]["text"]:
                    ttft = time.perf_counter() - start
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
        return Result(True, time.perf_counter() - start, ttft, tokens)
    except httpx.HTTPError as e:
        return Result(False, time.perf_counter() - start, error=f"{type(e).__name__}: {e}")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in (0, 100])."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)] if ordered else math.nan


async def run(args: argparse.Namespace) -> list[Result]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.concurrency)
    todo = iter(range(args.requests))
    results: list[Result] = []

    async def worker(http: httpx.AsyncClient) -> None:
        for i in todo:  # a shared iterator: each request is taken by exactly one worker
            results.append(await one(http, args, i))

    async with httpx.AsyncClient(
        base_url=args.url, headers=headers, timeout=args.timeout, limits=limits
    ) as http:
        await asyncio.gather(*(worker(http) for _ in range(args.concurrency)))
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--stream", action="store_true", help="use SSE and report time to first token")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--api-key", default=os.environ.get("SAGUARO_API_KEY"))
    args = p.parse_args(argv)

    start = time.perf_counter()
    results = asyncio.run(run(args))
    wall = time.perf_counter() - start
    ok = [r for r in results if r.ok]
    errors = [r for r in results if not r.ok]
    latencies = [r.latency_s for r in ok]
    tokens = sum(r.tokens for r in ok)
    print(
        f"{len(results)} requests, concurrency {args.concurrency}, {args.max_tokens} tokens each"
        f"{' (streamed)' if args.stream else ''}: {wall:.1f}s, {len(results) / wall:.1f} req/s, "
        f"{tokens / wall:.0f} output tok/s"
    )
    print(
        f"latency p50 {percentile(latencies, 50) * 1000:.0f} ms, "
        f"p99 {percentile(latencies, 99) * 1000:.0f} ms"
    )
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    if ttfts:
        print(
            f"time to first token p50 {percentile(ttfts, 50) * 1000:.0f} ms, "
            f"p99 {percentile(ttfts, 99) * 1000:.0f} ms"
        )
    print(f"errors {len(errors)}")
    for r in errors[:5]:
        print(f"  {r.error[:200]}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
