"""OpenAI-compatible HTTP API: completions, chat completions, models, health and metrics.

Errors follow OpenAI: ``{"error": {"message", "type", "param", "code"}}``. Anything wrong with a
request body (malformed JSON, an unrecognized argument, a wrong type, an out-of-range sampling
value, a prompt that does not fit the context) is a 400, as OpenAI answers it (the ``openai``
client raises ``BadRequestError``); a missing or wrong API key is a 401, an unknown route or
model a 404, a wrong method a 405 and a body over ``MAX_BODY_BYTES`` a 413.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import math
import os
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from jinja2.exceptions import TemplateError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from saguaro.errors import RequestError, SaguaroError
from saguaro.launch import build_llm, engine_options
from saguaro.sampling import SamplingParams
from saguaro.server.async_engine import (
    AsyncEngine,
    Histogram,
    RequestStream,
    ShuttingDown,
    StreamEvent,
)
from saguaro.server.chat import chat_prompt_ids

MAX_BODY_BYTES = 8 << 20
BODY_TIMEOUT_S = 30.0  # a request body not fully received by then gets 408
MAX_STOP_SEQUENCES = 4  # as OpenAI's API
SHUTDOWN_GRACE_S = 10.0  # on SIGTERM, requests in flight get this long to finish
DRAFT_STATES = ("none", "running", "restarting", "failed")
FINISH_REASONS = ("stop", "length", "abort", "error")
ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")


# ---- errors -----------------------------------------------------------------------------------


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind  # OpenAI's error "type"


def error_body(message: str, kind: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(e: APIError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(e.message, e.kind, e.param, e.code), e.status, headers)


# ---- request bodies -----------------------------------------------------------------------------


class _Body(BaseModel):
    # Unknown fields are rejected, as OpenAI does; strict: "0.5" is not a temperature.
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Body):
    include_usage: bool = False


class _GenerationRequest(_Body):
    model: str | None = None  # None: the served model
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int = Field(0, ge=-1)  # saguaro extension: 0 or -1 disable it
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)  # any 64-bit word
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1
    user: str | None = None  # accepted for compatibility; not used
    ignore_eos: bool = False  # saguaro extension
    sampling: Literal["rejection", "coupled"] | None = None  # saguaro extension: None = server's

    @field_validator("stop")
    @classmethod
    def _at_most_four(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences, got {len(stop)}")
        return stop

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed when stream is true", "stream")
        try:
            return SamplingParams(
                temperature=1.0 if self.temperature is None else self.temperature,
                top_p=1.0 if self.top_p is None else self.top_p,
                top_k=self.top_k,
                seed=self.seed,
                max_tokens=max_tokens,
                stop=self.stop,
                ignore_eos=self.ignore_eos,
                sampling=self.sampling,
            )
        except ValueError as e:
            raise APIError(400, str(e)) from e

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_GenerationRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def for_template(self) -> dict[str, str]:
        content = (
            self.content
            if isinstance(self.content, str)
            else "\n".join(p.text for p in self.content)
        )
        out = {"role": self.role, "content": content}
        if self.name is not None:
            out["name"] = self.name
        return out


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)  # None: up to the end of the context
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name for it


def _validation_error(e: ValidationError) -> APIError:
    """The first problem, named by its full path; ``param`` is the top-level argument."""
    err = e.errors()[0]
    loc = [str(x) for x in err["loc"]]
    param = loc[0] if loc else None
    if err["type"] == "json_invalid":
        return APIError(400, f"We could not parse the JSON body of your request: {err['msg']}")
    if err["type"] == "extra_forbidden":
        return APIError(400, f"Unrecognized request argument supplied: {'.'.join(loc)}", param)
    return APIError(400, f"Invalid value for '{'.'.join(loc) or 'body'}': {err['msg']}", param)


async def _parse(request: Request, model: type[_Body]) -> Any:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise APIError(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
    body = bytearray()
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):  # a client that never finishes its body
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    raise APIError(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
    except TimeoutError as e:
        raise APIError(408, f"request body not received within {BODY_TIMEOUT_S:g} s") from e
    try:
        return model.model_validate_json(bytes(body))
    except ValidationError as e:
        raise _validation_error(e) from e


# ---- responses --------------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, event: StreamEvent) -> Usage:
        return cls(
            prompt_tokens=event.prompt_tokens,
            completion_tokens=event.completion_tokens,
            total_tokens=event.prompt_tokens + event.completion_tokens,
        )


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None


class Completion(BaseModel):
    """A completion, and also each streamed chunk of one (OpenAI uses one shape for both)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: dict[str, str]
    logprobs: None = None
    finish_reason: str | None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: dict[str, str]
    logprobs: None = None
    finish_reason: str | None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


def _sse(payload: BaseModel | dict[str, Any]) -> str:
    data = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(payload)
    return f"data: {data}\n\n"


def _abort_on_disconnect(request: Request, stream: RequestStream) -> asyncio.Task[None]:
    """Watch the connection from the moment ``stream`` is submitted: a client that goes away
    aborts it, freeing its KV blocks, even if the response never started. Whoever consumes
    the stream cancels the watcher, and the stream (a no-op once finished), when done."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        stream.cancel()

    return asyncio.create_task(watch())


async def _collect(stream: RequestStream, watcher: asyncio.Task[None]) -> tuple[str, StreamEvent]:
    parts = []
    try:
        async for event in stream:
            parts.append(event.text)
    finally:
        watcher.cancel()
        stream.cancel()
    if event.error is not None:
        raise APIError(500, event.error, kind="server_error")
    return "".join(parts), event


# ---- middleware ---------------------------------------------------------------------------------


class BearerAuth:
    """401 unless ``Authorization: Bearer <api_key>``, on every path but /health."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            header = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, token = header.partition(b" ")
            if not header:
                e = APIError(401, "You didn't provide an API key (Authorization: Bearer KEY).")
            elif scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
                e = APIError(401, "Incorrect API key provided.", code="invalid_api_key")
            else:
                return await self.app(scope, receive, send)
            response = error_response(e, {"WWW-Authenticate": "Bearer"})
            return await response(scope, receive, send)
        await self.app(scope, receive, send)


class HTTPCounter:
    """Counts responses by route and status for /metrics (unknown paths count as "other")."""

    def __init__(self, app: ASGIApp, counts: Counter[tuple[str, int]]) -> None:
        self.app = app
        self.counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        if path.startswith("/v1/models/"):
            route = "/v1/models/{model}"
        else:
            route = path if path in ROUTES else "other"
        status = 500

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.counts[(route, status)] += 1


# ---- metrics ----------------------------------------------------------------------------------


def _num(value: float) -> str:
    if isinstance(value, int):  # counters stay exact (":g" would round them)
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    return repr(value) if math.isfinite(value) else ("+Inf" if value > 0 else "-Inf")


def _labels(**labels: object) -> str:
    def esc(v: object) -> str:
        return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}" if labels else ""


class _Exposition:
    """Prometheus text format, one metric family at a time."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        self.lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        self.lines += [f"{name}{labels} {_num(value)}" for labels, value in samples]

    def histogram(self, name: str, help_: str, h: Histogram) -> None:
        self.lines += [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        total = 0
        for bound, n in zip([*h.bounds, math.inf], h.counts, strict=True):
            total += n
            le = "+Inf" if bound == math.inf else f"{bound:g}"
            self.lines.append(f"{name}_bucket{_labels(le=le)} {total}")
        self.lines += [f"{name}_sum {_num(h.total)}", f"{name}_count {total}"]


def render_metrics(ae: AsyncEngine, http: Counter[tuple[str, int]], model: str) -> str:
    snap = ae.engine.snapshot()
    out = _Exposition()
    with ae.stats_lock:
        st = ae.stats
        acc = st.accepted_length
        families: list[tuple[str, str, str, list[tuple[str, float]]]] = [
            (
                "saguaro_info",
                "gauge",
                "Served model and decoding mode (k: speculation length).",
                [(_labels(model=model, mode=snap.mode, k=snap.lookahead), 1)],
            ),
            (
                "saguaro_engine_up",
                "gauge",
                "1 while the engine loop runs.",
                [("", int(ae.running))],
            ),
            (
                "saguaro_draft_worker_state",
                "gauge",
                "Draft: none (AR), running, restarting or failed (exact either way, without "
                "speculation while not running).",
                [(_labels(state=s), int(s == snap.draft_state)) for s in DRAFT_STATES],
            ),
            (
                "saguaro_draft_worker_restarts_total",
                "counter",
                "Restarts of a failed SSD draft worker.",
                [("", snap.draft_restarts)],
            ),
            (
                "saguaro_http_requests_total",
                "counter",
                "HTTP responses by route and status code.",
                [(_labels(route=r, status=c), n) for (r, c), n in sorted(http.items())],
            ),
            (
                "saguaro_requests_total",
                "counter",
                "Generation requests finished, by reason (abort: the client went away).",
                [(_labels(finish_reason=r), st.finished[r]) for r in FINISH_REASONS],
            ),
            (
                "saguaro_requests_running",
                "gauge",
                "Sequences in the batch.",
                [("", snap.running)],
            ),
            ("saguaro_requests_waiting", "gauge", "Sequences queued.", [("", snap.waiting)]),
            (
                "saguaro_engine_sequences",
                "gauge",
                "Requests the engine holds (finished ones leave none behind).",
                [("", snap.sequences)],
            ),
            ("saguaro_prompt_tokens_total", "counter", "Prompt tokens.", [("", st.prompt_tokens)]),
            (
                "saguaro_generation_tokens_total",
                "counter",
                "Tokens generated.",
                [("", st.generation_tokens)],
            ),
            (
                "saguaro_mean_accepted_length",
                "gauge",
                "Mean tokens committed per decoding round, over the server's life.",
                [("", acc.total / acc.count if acc.count else math.nan)],
            ),
            (
                "saguaro_spec_draft_tokens_total",
                "counter",
                "Tokens proposed.",
                [("", st.drafted_tokens)],
            ),
            (
                "saguaro_spec_accepted_tokens_total",
                "counter",
                "Proposals accepted.",
                [("", st.accepted_tokens)],
            ),
            ("saguaro_ssd_rounds_total", "counter", "SSD rounds.", [("", st.ssd_rounds)]),
            (
                "saguaro_ssd_cache_hits_total",
                "counter",
                "SSD rounds whose outcome the speculation cache had prepared.",
                [("", st.ssd_hits)],
            ),
            (
                "saguaro_ssd_cache_hit_rate",
                "gauge",
                "SSD speculation-cache hit rate, over the server's life.",
                [("", st.ssd_hits / st.ssd_rounds if st.ssd_rounds else math.nan)],
            ),
            ("saguaro_kv_blocks_total", "gauge", "KV cache blocks.", [("", snap.kv_blocks_total)]),
            (
                "saguaro_kv_blocks_free",
                "gauge",
                "Free KV cache blocks.",
                [("", snap.kv_blocks_free)],
            ),
            (
                "saguaro_prefix_cache_hit_tokens_total",
                "counter",
                "Prompt tokens served from the prefix cache.",
                [("", snap.prefix_hit_tokens)],
            ),
        ]
        for family in families:
            out.family(*family)
        out.histogram("saguaro_request_latency_seconds", "Arrival to finish.", st.latency)
        out.histogram("saguaro_time_to_first_token_seconds", "Arrival to first token.", st.ttft)
        out.histogram("saguaro_time_per_output_token_seconds", "Decode time per token.", st.tpot)
        out.histogram(
            "saguaro_accepted_length", "Tokens committed per decoding round (1 + accepted).", acc
        )
    return "\n".join(out.lines) + "\n"


def draft_state(ae: AsyncEngine) -> str:
    """One of DRAFT_STATES."""
    return ae.engine.snapshot().draft_state


# ---- the app ----------------------------------------------------------------------------------


def build_app(
    llm: Any, api_key: str | None = None, served_model_name: str | None = None
) -> FastAPI:
    """The HTTP app serving ``llm`` (a ``saguaro.LLM``). Its lifespan runs the engine loop;
    closing ``llm`` stays with the caller. ``served_model_name`` defaults to the model
    directory's name."""
    engine = llm.engine
    ae = AsyncEngine(engine)
    model_name = served_model_name or engine.target_dir.name
    created = int(time.time())
    http_counts: Counter[tuple[str, int]] = Counter()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        ae.start()
        try:
            yield
        finally:
            await asyncio.to_thread(ae.stop)

    app = FastAPI(
        title="saguaro",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # the API is OpenAI's; its reference documents it
    )
    app.state.async_engine = ae
    if api_key:
        app.add_middleware(BearerAuth, api_key=api_key)
    app.add_middleware(HTTPCounter, counts=http_counts)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError) -> JSONResponse:
        return error_response(e)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, e: HTTPException) -> JSONResponse:
        message = (
            f"Invalid URL ({request.method} {request.url.path})"
            if e.status_code == 404
            else str(e.detail)
        )
        return error_response(APIError(e.status_code, message), e.headers)

    @app.exception_handler(Exception)
    async def _internal(_: Request, e: Exception) -> JSONResponse:
        return error_response(APIError(500, "internal server error", kind="server_error"))

    def submit(ids: list[int], params: SamplingParams) -> RequestStream:
        try:
            return ae.submit(ids, params)
        except ShuttingDown as e:
            raise APIError(503, "the server is shutting down", kind="server_error") from e

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise APIError(404, f"The model `{name}` does not exist.", "model", "model_not_found")

    def validated(prompt: str | list[int], param: str) -> list[int]:
        if isinstance(prompt, str) and prompt:
            prompt = engine.tokenizer.encode(prompt)  # as encode_prompt would tokenize it
        if len(prompt) >= engine.max_model_len:
            raise APIError(
                400,
                f"This model's maximum context length is {engine.max_model_len} tokens; "
                f"the prompt has {len(prompt)} (room is needed for at least one new token).",
                param,
                "context_length_exceeded",
            )
        try:
            return engine.encode_prompt(prompt)
        except RequestError as e:
            raise APIError(400, str(e), param) from e

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 "ok" while serving fully; 503 "degraded" while a speculative mode runs without
        its draft (restarting it, or for good: still exact, slower); 503 "engine stopped"."""
        draft = draft_state(ae)
        status = "ok" if draft in ("none", "running") else "degraded"
        status = status if ae.running else "engine stopped"
        body = {"status": status, "mode": engine.cfg.mode, "draft": draft}
        return JSONResponse(body, 200 if status == "ok" else 503)

    def model_card() -> dict[str, Any]:
        return {"id": model_name, "object": "model", "created": created, "owned_by": "saguaro"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        check_model(model_id)
        return model_card()

    @app.get("/metrics")
    async def metrics() -> Response:
        return PlainTextResponse(
            render_metrics(ae, http_counts, model_name),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req: CompletionRequest = await _parse(request, CompletionRequest)
        check_model(req.model)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise APIError(400, "one prompt per request is supported", "prompt")
            prompt = prompt[0]
        ids = await asyncio.to_thread(validated, prompt, "prompt")  # keep the loop responsive
        params = req.sampling_params(req.max_tokens or 16)
        stream = submit(ids, params)
        watcher = _abort_on_disconnect(request, stream)
        rid, now = f"cmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(text: str, reason: str | None) -> Completion:
            choice = CompletionChoice(text=text, finish_reason=reason)
            return Completion(id=rid, created=now, model=model_name, choices=[choice])

        if req.stream:
            usage_chunk = Completion(id=rid, created=now, model=model_name, choices=[])
            return _event_stream(stream, watcher, chunk, usage_chunk, req.include_usage)
        text, last = await _collect(stream, watcher)
        done = chunk(text, last.finish_reason)
        done.usage = Usage.of(last)
        return JSONResponse(done.model_dump())

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req: ChatCompletionRequest = await _parse(request, ChatCompletionRequest)
        check_model(req.model)
        messages = [m.for_template() for m in req.messages]
        try:  # templating and tokenising run off the event loop: a huge prompt stalls no one
            ids = await asyncio.to_thread(chat_prompt_ids, engine.tokenizer, messages)
        except TemplateError as e:  # e.g. the template's raise_exception on role order
            raise APIError(400, f"chat template: {e}", "messages") from e
        ids = await asyncio.to_thread(validated, ids, "messages")
        limit = req.max_completion_tokens or req.max_tokens or engine.max_model_len - len(ids)
        stream = submit(ids, req.sampling_params(limit))
        watcher = _abort_on_disconnect(request, stream)
        rid, now = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(text: str, reason: str | None) -> ChatCompletionChunk:
            delta = {"content": text} if text else {}
            choice = ChatChunkChoice(delta=delta, finish_reason=reason)
            return ChatCompletionChunk(id=rid, created=now, model=model_name, choices=[choice])

        if req.stream:
            first = ChatChunkChoice(delta={"role": "assistant", "content": ""}, finish_reason=None)
            head = ChatCompletionChunk(id=rid, created=now, model=model_name, choices=[first])
            usage_chunk = ChatCompletionChunk(id=rid, created=now, model=model_name, choices=[])
            return _event_stream(stream, watcher, chunk, usage_chunk, req.include_usage, head)
        text, last = await _collect(stream, watcher)
        message = {"role": "assistant", "content": text}
        return JSONResponse(
            ChatCompletion(
                id=rid,
                created=now,
                model=model_name,
                choices=[ChatChoice(message=message, finish_reason=last.finish_reason)],
                usage=Usage.of(last),
            ).model_dump()
        )

    return app


def _event_stream(
    stream: RequestStream,
    watcher: asyncio.Task[None],
    chunk: Callable[[str, str | None], BaseModel],
    usage_chunk: Completion | ChatCompletionChunk,
    include_usage: bool,
    head: BaseModel | None = None,
) -> StreamingResponse:
    """Server-sent events: one chunk per engine step (all the tokens it committed), an optional
    usage chunk, then ``[DONE]``. An engine failure mid-stream is sent as an error event."""

    async def events() -> AsyncIterator[str]:
        try:
            if head is not None:
                yield _sse(head)
            async for event in stream:
                if event.error is not None:
                    yield _sse(error_body(event.error, "server_error", None, None))
                    break
                yield _sse(chunk(event.text, event.finish_reason))
            else:
                if include_usage:
                    usage_chunk.usage = Usage.of(event)
                    yield _sse(usage_chunk)
        finally:
            watcher.cancel()
            stream.cancel()
        yield "data: [DONE]\n\n"

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


# ---- saguaro serve ------------------------------------------------------------------------------


def serve_main(argv: list[str] | None = None) -> int:
    """``saguaro serve [--model DIR] [--draft DIR] [--mode M] [--k K] [--host H] [--port N]
    [--api-key KEY] [--max-model-len N] ...``: serve until interrupted."""
    import uvicorn

    parser = argparse.ArgumentParser(
        prog="saguaro serve", description="Serve a model over an OpenAI-compatible HTTP API."
    )
    engine_options(parser)
    parser.add_argument(
        "--host", default="127.0.0.1", help="bind address (loopback by default; 0.0.0.0: all)"
    )
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--api-key",
        default=os.environ.get("SAGUARO_API_KEY"),
        help="require 'Authorization: Bearer KEY' on every endpoint but /health "
        "(default: $SAGUARO_API_KEY; unset: no auth)",
    )
    parser.add_argument("--served-model-name", help="model id clients use (default: dir name)")
    parser.add_argument(
        "--shutdown-grace-s",
        type=float,
        default=SHUTDOWN_GRACE_S,
        help="on SIGTERM / SIGINT, how long requests in flight may take to finish before they "
        f"are ended (default {SHUTDOWN_GRACE_S:g}; a second signal stops at once)",
    )
    args = parser.parse_args(argv)
    try:
        llm = build_llm(args)
    except (SaguaroError, ValueError) as e:
        print(f"saguaro serve: error: {e}", file=sys.stderr)
        return 2
    # uvicorn re-raises the signal that stopped it once it is done; SIGTERM's default action
    # would then end the process before the engine (and its draft worker) is closed.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with llm:
        app = build_app(llm, args.api_key, args.served_model_name)
        config = uvicorn.Config(app, host=args.host, port=args.port, timeout_graceful_shutdown=5)
        _draining_server(config, app.state.async_engine, args.shutdown_grace_s).run()
    return 0


def _exit_on_sigterm(sig: int, _frame: object) -> None:
    raise SystemExit(128 + sig)


def _draining_server(config: Any, ae: AsyncEngine, grace_s: float) -> Any:
    """A uvicorn server whose first SIGTERM / SIGINT drains before it stops: new requests get
    503, those in flight have ``grace_s`` seconds to finish, the rest end with a final chunk
    (finish_reason "abort"); then uvicorn shuts down as usual. A second signal stops at once."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        draining = False

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.draining:
                return super().handle_exit(sig, frame)
            self.draining = True

            def drain_then_exit() -> None:
                ae.drain(grace_s)
                uvicorn.Server.handle_exit(self, sig, frame)

            threading.Thread(target=drain_then_exit, name="saguaro-drain", daemon=True).start()

    return DrainingServer(config)
