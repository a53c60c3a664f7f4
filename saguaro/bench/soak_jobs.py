"""A soak's workload: mixed requests through the official ``openai`` client, and what each must
bring back.

Kinds, each a share of the requests (``MIX``): greedy, sampled, ``response_format`` json_schema,
``logprobs`` with ``top_logprobs``, ``n`` > 1, stop strings, and clients that disconnect
mid-stream. Chat and completions alternate; greedy, sampled and stop requests stream or not at
random. Exactness checks need a reference: a greedy request's text must equal what the same
server gave for the same (route, prompt, max_tokens) when it served one request at a time, and a
request stopped at ``STOP`` must give that text cut before its first ``STOP``.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from typing import Any

import openai

# The request mix: kind -> share. Disconnects are the 10%.
MIX: dict[str, float] = {
    "greedy": 0.25,
    "sampled": 0.15,
    "json": 0.1,
    "logprobs": 0.15,
    "n": 0.1,
    "stop": 0.15,
    "disconnect": 0.1,
}
GREEDY_LENGTHS = (8, 16)  # max_tokens of greedy and stop requests: few distinct references
STOP = "\n"
TOP_LOGPROBS = 2
N_CHOICES = 2
SAMPLED = {"temperature": 0.8, "top_p": 0.95}
JSON_MAX_TOKENS = 48  # enough for the schema's object; a cut one is counted, not failed
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "language": {"type": "string", "enum": ["python", "rust", "c"]},
        "typed": {"type": "boolean"},
    },
    "required": ["language", "typed"],
    "additionalProperties": False,
}
PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "def is_prime(n: int) -> bool:",
    "Explain what a Python generator is in one sentence.",
    "import numpy as np\n\ndef normalize(x):",
    "Write a function that reverses a linked list.",
    "class Stack:\n    def __init__(self):",
    "Which sorting algorithm is stable: quicksort or merge sort?",
    "# Parse a CSV file and return its rows as dictionaries\n",
)


@dataclass(frozen=True)
class Job:
    """One request: its kind, route (chat or completions), prompt and settings."""

    index: int
    kind: str
    chat: bool
    prompt: str
    stream: bool
    max_tokens: int
    seed: int

    @property
    def reference_key(self) -> tuple[bool, str, int]:
        """What a greedy or stop request's text is compared through."""
        return self.chat, self.prompt, self.max_tokens


@dataclass
class Outcome:
    """What came back: texts per choice, finish reasons, tokens, or the error."""

    job: Job
    ok: bool = False
    texts: list[str] = field(default_factory=list)
    reasons: list[str | None] = field(default_factory=list)
    completion_tokens: int = 0
    logprob_rows: int = -1  # tokens with logprobs (-1: none asked for)
    top_widths: set[int] = field(default_factory=set)
    error: str = ""
    latency_s: float = 0.0


def plan(requests: int, seed: int) -> list[Job]:
    """``requests`` jobs drawn from ``MIX``, reproducibly."""
    rng = random.Random(f"soak/{seed}")
    kinds, shares = zip(*MIX.items(), strict=True)
    jobs = []
    for i in range(requests):
        kind = rng.choices(kinds, shares)[0]
        streamable = kind in ("greedy", "sampled", "stop")
        max_tokens = JSON_MAX_TOKENS if kind == "json" else rng.choice(GREEDY_LENGTHS)
        jobs.append(
            Job(
                index=i,
                kind=kind,
                chat=rng.random() < 0.5 or kind == "json",
                prompt=rng.choice(PROMPTS),
                stream=kind == "disconnect" or (streamable and rng.random() < 0.5),
                max_tokens=max_tokens,
                seed=seed + i,
            )
        )
    return jobs


def references_needed(jobs: list[Job]) -> list[Job]:
    """One quiet greedy request per distinct reference the greedy and stop jobs compare with."""
    keys = sorted({j.reference_key for j in jobs if j.kind in ("greedy", "stop")})
    return [
        Job(-1 - n, "greedy", chat, prompt, False, max_tokens, 0)
        for n, (chat, prompt, max_tokens) in enumerate(keys)
    ]


def _settings(job: Job) -> dict[str, Any]:
    """The request's sampling and feature fields, by kind (keyword arguments of ``create``)."""
    if job.kind in ("greedy", "json"):
        extra: dict[str, Any] = {"temperature": 0.0}
    elif job.kind == "stop":
        extra = {"temperature": 0.0, "stop": [STOP]}
    elif job.kind == "n":
        extra = dict(SAMPLED, n=N_CHOICES, seed=job.seed)
    else:
        extra = dict(SAMPLED, seed=job.seed)
    if job.kind == "json":
        extra["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": SCHEMA},
        }
    if job.kind == "logprobs":
        extra |= (
            {"logprobs": True, "top_logprobs": TOP_LOGPROBS}
            if job.chat
            else {"logprobs": TOP_LOGPROBS}
        )
    return extra


async def _create(api: openai.AsyncOpenAI, model: str, job: Job) -> Any:
    args: dict[str, Any] = dict(model=model, max_tokens=job.max_tokens, **_settings(job))
    if job.stream:
        args |= {"stream": True, "stream_options": {"include_usage": True}}
    if job.chat:
        messages = [{"role": "user", "content": job.prompt}]
        return await api.chat.completions.create(messages=messages, **args)
    return await api.completions.create(prompt=job.prompt, **args)


def _read_choice(job: Job, out: Outcome, choice: Any) -> None:
    text = choice.message.content if job.chat else choice.text
    out.texts.append(text or "")
    out.reasons.append(choice.finish_reason)
    if job.kind != "logprobs" or choice.logprobs is None:
        return
    if job.chat:
        rows = choice.logprobs.content or []
        out.logprob_rows = len(rows)
        out.top_widths = {len(r.top_logprobs) for r in rows}
    else:
        out.logprob_rows = len(choice.logprobs.tokens or [])
        out.top_widths = {len(t) for t in choice.logprobs.top_logprobs or []}


async def _read_stream(job: Job, out: Outcome, stream: Any) -> None:
    text, reason = "", None
    async for chunk in stream:
        if chunk.usage is not None:
            out.completion_tokens = chunk.usage.completion_tokens
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        piece = (c.delta.content if job.chat else c.text) or ""
        text += piece
        reason = c.finish_reason or reason
        if job.kind == "disconnect" and piece:
            await stream.close()  # the client goes away mid-stream
            break
    out.texts, out.reasons = [text], [reason]


async def send(api: openai.AsyncOpenAI, model: str, job: Job) -> Outcome:
    """Run one job; an error is recorded, never raised."""
    out = Outcome(job)
    start = asyncio.get_running_loop().time()
    try:
        response = await _create(api, model, job)
        if job.stream:
            await _read_stream(job, out, response)
        else:
            for choice in response.choices:
                _read_choice(job, out, choice)
            out.completion_tokens = response.usage.completion_tokens if response.usage else 0
        out.ok = True
    except (openai.OpenAIError, asyncio.TimeoutError) as e:
        out.error = f"{type(e).__name__}: {e}"
    out.latency_s = asyncio.get_running_loop().time() - start
    return out


def expected_text(job: Job, references: dict[tuple[bool, str, int], str]) -> str | None:
    """What a greedy or stop job must return, from the quiet server's references (None: no
    exact expectation for this kind)."""
    if job.kind not in ("greedy", "stop"):
        return None
    text = references[job.reference_key]
    return text.split(STOP, 1)[0] if job.kind == "stop" else text


def _json_problem(text: str) -> str | None:
    try:
        value = json.loads(text)
    except ValueError:
        return f"not JSON: {text!r}"
    if not isinstance(value, dict) or set(value) != set(SCHEMA["required"]):
        return f"keys differ from the schema's: {text!r}"
    if value["language"] not in SCHEMA["properties"]["language"]["enum"]:
        return f"language outside the enum: {text!r}"
    return None if isinstance(value["typed"], bool) else f"typed not a boolean: {text!r}"


def problem(out: Outcome, references: dict[tuple[bool, str, int], str]) -> str | None:
    """Why ``out`` is wrong for its job, or None. A disconnect is never wrong: its client left."""
    job = out.job
    if job.kind == "disconnect":
        return None
    if not out.ok:
        return out.error
    choices = N_CHOICES if job.kind == "n" else 1
    if len(out.texts) != choices or any(r not in ("stop", "length") for r in out.reasons):
        return f"{len(out.texts)} choices, finish reasons {out.reasons}"
    want = expected_text(job, references)
    if want is not None and out.texts[0] != want:
        return f"text {out.texts[0]!r} differs from the quiet server's {want!r}"
    if job.kind == "json" and out.reasons[0] == "stop":
        return _json_problem(out.texts[0])
    if job.kind == "logprobs" and (
        out.logprob_rows != out.completion_tokens or out.top_widths - {TOP_LOGPROBS}
    ):
        return (
            f"{out.logprob_rows} logprob rows for {out.completion_tokens} tokens, "
            f"top widths {sorted(out.top_widths)}"
        )
    return None
