"""The OpenAI-compatible HTTP API: completions, chat completions, models, health and metrics.

Errors follow OpenAI (``saguaro.server.errors``). Anything wrong with a request body (malformed
JSON, an unrecognized argument, a wrong type, an out-of-range sampling value, a prompt that does
not fit the context) is a 400, as OpenAI answers it (the ``openai`` client raises
``BadRequestError``); a missing or wrong API key is a 401, an unknown route or model a 404, a
wrong method a 405, a body over ``MAX_BODY_BYTES`` a 413 and one not received within
``BODY_TIMEOUT_S`` a 408.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from jinja2.exceptions import TemplateError
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from saguaro.engine.engine import LLMEngine
from saguaro.errors import RequestError
from saguaro.sampling import SamplingParams
from saguaro.server.async_engine import (
    AsyncEngine,
    AtCapacity,
    RequestStream,
    ShuttingDown,
    StreamEvent,
)
from saguaro.server.errors import (
    EXCEPTION_HANDLERS,
    SERVER_ERROR,
    APIError,
    error_body,
    error_response,
    validation_error,
)
from saguaro.server.logprobs import Tokens, chat_logprobs, completion_logprobs
from saguaro.server.metrics import CONTENT_TYPE, metrics_registry
from saguaro.server.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionChoice,
    CompletionRequest,
    RequestBody,
    Usage,
)

MAX_BODY_BYTES = 8 << 20  # far above any prompt that fits a context; bounds a hostile upload
BODY_TIMEOUT_S = 30.0  # a request body not fully received by then gets 408
# A 429's Retry-After: about what a waiting request takes to get a place when the batch moves.
RETRY_AFTER_S = 1
ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
MODEL_CARD_ROUTE = "/v1/models/{model}"  # every model card's path counts as this route

router = APIRouter()


@dataclass
class ServedModel:
    """What the routes serve: the engine loop, the model's public name, the HTTP counts and the
    metrics registry reading them all."""

    ae: AsyncEngine
    model_name: str
    created: int = field(default_factory=lambda: int(time.time()))
    http_counts: Counter[tuple[str, int]] = field(default_factory=Counter)
    registry: CollectorRegistry = field(init=False)

    def __post_init__(self) -> None:
        self.registry = metrics_registry(self.ae, self.http_counts, self.model_name)

    @property
    def engine(self) -> LLMEngine:
        return self.ae.engine

    @property
    def tokens(self) -> Tokens:
        tokenizer, grammars = self.engine.tokenizer, self.engine.grammars

        def token_bytes(token: int) -> bytes:
            try:
                return grammars.token_bytes(token)
            except ValueError:  # a tokenizer llguidance cannot read: the decoded text's bytes
                return tokenizer.decode([token], skip_special_tokens=False).encode()

        return Tokens(tokenizer.decode, token_bytes)

    def check_model(self, name: str | None) -> None:
        """404 for a model other than the served one (None means the served one)."""
        if name is not None and name != self.model_name:
            raise APIError(404, f"The model `{name}` does not exist.", "model", "model_not_found")

    def model_card(self) -> dict[str, Any]:
        return {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "saguaro",
        }

    def prompt_ids(self, prompt: str | list[int], param: str) -> list[int]:
        """The engine's ids for ``prompt``; 400 (naming ``param``) if it does not fit the
        context or is otherwise invalid. Tokenises: call it off the event loop."""
        engine = self.engine
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

    def check(self, ids: list[int], params: SamplingParams) -> None:
        """400 for parameters the engine cannot serve (a token id the model lacks, a grammar
        that does not compile). Compiles a grammar: call it off the event loop."""
        try:
            self.engine.check_request(ids, params)
        except RequestError as e:
            raise APIError(400, str(e)) from e

    def submit(self, ids: list[int], params: SamplingParams) -> list[RequestStream]:
        try:
            return self.ae.submit(ids, params)
        except ShuttingDown as e:
            raise APIError(503, "the server is shutting down", kind=SERVER_ERROR) from e
        except AtCapacity as e:
            retry = {"Retry-After": str(RETRY_AFTER_S)}
            raise APIError(429, str(e), code="server_at_capacity", headers=retry) from e


def _served(request: Request) -> ServedModel:
    return request.app.state.served


# ---- requests and responses -------------------------------------------------------------------


async def _parse(request: Request, model: type[RequestBody]) -> Any:
    """The request's body, validated as ``model``: read in full within ``BODY_TIMEOUT_S`` and
    ``MAX_BODY_BYTES``."""
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
        raise validation_error(e) from e


def _sse(payload: BaseModel | dict[str, Any]) -> str:
    data = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(payload)
    return f"data: {data}\n\n"


def _abort_on_disconnect(request: Request, streams: list[RequestStream]) -> asyncio.Task[None]:
    """Watch the connection from the moment ``streams`` are submitted: a client that goes away
    aborts them, freeing their KV blocks, even if the response never started. Whoever consumes
    the streams cancels the watcher, and the streams (a no-op once finished), when done."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        for stream in streams:
            stream.cancel()

    return asyncio.create_task(watch())


async def _collect_one(stream: RequestStream) -> StreamEvent:
    """The whole of one stream as one event: its text and log-probabilities, its last
    event's counts and finish reason."""
    parts, logprobs, prompt_logprobs = [], [], None
    async for event in stream:
        parts.append(event.text)
        logprobs += event.logprobs
        prompt_logprobs = prompt_logprobs or event.prompt_logprobs
    if event.error is not None:
        raise APIError(500, event.error, kind=SERVER_ERROR)
    event.text, event.logprobs, event.prompt_logprobs = "".join(parts), logprobs, prompt_logprobs
    return event


async def _collect(streams: list[RequestStream], watcher: asyncio.Task[None]) -> list[StreamEvent]:
    """Every stream's whole text, log-probabilities and last event; 500 if the engine failed
    one of them."""
    try:
        return list(await asyncio.gather(*(_collect_one(s) for s in streams)))
    finally:
        watcher.cancel()
        for stream in streams:
            stream.cancel()


async def _merged(streams: list[RequestStream]) -> AsyncIterator[tuple[int, StreamEvent]]:
    """The events of all ``streams`` as they come, each with its stream's index."""
    queue: asyncio.Queue[tuple[int, StreamEvent]] = asyncio.Queue()

    async def pump(i: int, stream: RequestStream) -> None:
        async for event in stream:
            await queue.put((i, event))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        for _ in range(len(streams)):
            while True:
                i, event = await queue.get()
                yield i, event
                if event.final:
                    break
    finally:
        for task in tasks:
            task.cancel()


# (choice index, what it gained: text, log-probabilities, finish reason) -> one chunk
ChunkFn = Callable[[int, StreamEvent], BaseModel]


def _event_stream(
    streams: list[RequestStream],
    watcher: asyncio.Task[None],
    chunk: ChunkFn,
    usage_chunk: Completion | ChatCompletionChunk,
    include_usage: bool,
    prompt_tokens: int,
    heads: list[BaseModel] = (),
) -> StreamingResponse:
    """Server-sent events: one chunk per engine step and choice (all the tokens it committed),
    an optional usage chunk, then ``[DONE]``. An engine failure mid-stream is sent as an error
    event and ends the response."""

    async def events() -> AsyncIterator[str]:
        completion_tokens = [0] * len(streams)
        try:
            for head in heads:
                yield _sse(head)
            async for i, event in _merged(streams):
                if event.error is not None:
                    yield _sse(error_body(event.error, SERVER_ERROR, None, None))
                    break
                completion_tokens[i] = event.completion_tokens
                yield _sse(chunk(i, event))
            else:
                if include_usage:
                    usage_chunk.usage = Usage.count(prompt_tokens, completion_tokens)
                    yield _sse(usage_chunk)
        finally:
            watcher.cancel()
            for stream in streams:
                stream.cancel()
        yield "data: [DONE]\n\n"

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


# ---- routes -----------------------------------------------------------------------------------


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """200 "ok" while serving fully; 503 "degraded" while a speculative mode runs without
    its draft (restarting it, or for good: still exact, slower); 503 "engine failed" once the
    target cannot compute (a tensor-parallel rank is gone); 503 "engine stopped"."""
    served = _served(request)
    snap = served.engine.snapshot()
    draft = snap.draft_state
    status = "ok" if draft in ("none", "running") else "degraded"
    status = "engine failed" if snap.failure is not None else status
    status = status if served.ae.running else "engine stopped"
    body = {"status": status, "mode": served.engine.cfg.mode, "draft": draft}
    if snap.failure is not None:
        body["error"] = snap.failure
    return JSONResponse(body, 200 if status == "ok" else 503)


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_served(request).model_card()]}


@router.get("/v1/models/{model_id:path}")
async def model(model_id: str, request: Request) -> dict[str, Any]:
    served = _served(request)
    served.check_model(model_id)
    return served.model_card()


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    served = _served(request)
    return Response(generate_latest(served.registry), media_type=CONTENT_TYPE)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    served = _served(request)
    tokenizer = served.engine.tokenizer
    tokens = served.tokens
    req: CompletionRequest = await _parse(request, CompletionRequest)
    served.check_model(req.model)
    params = req.sampling_params(req.token_limit(), req.logprobs)
    if req.echo and req.logprobs is not None:  # the echoed prompt comes with its own
        params = replace(params, prompt_logprobs=req.logprobs)
    prompts = []
    for prompt in req.prompts():  # tokenising runs off the event loop: a huge prompt stalls no one
        prompts.append(await asyncio.to_thread(served.prompt_ids, prompt, "prompt"))
    await asyncio.to_thread(served.check, prompts[0], params)
    streams = [s for ids in prompts for s in served.submit(ids, params)]
    watcher = _abort_on_disconnect(request, streams)
    rid, now, name = f"cmpl-{uuid.uuid4().hex}", int(time.time()), served.model_name
    n = params.n
    echo = [tokenizer.decode(prompts[i // n]) if req.echo else "" for i in range(len(streams))]
    sent = [0] * len(streams)  # characters of each choice's text so far (for text_offset)
    prompt_tokens = sum(len(ids) for ids in prompts)
    # A prompt's log-probabilities come with its first sample, whose first event comes first.
    prompt_lps: dict[int, list] = {}

    def chunk(i: int, event: StreamEvent) -> Completion:
        prefix, echo[i] = echo[i], ""  # the prompt, before the first chunk's text
        lp = None
        if params.logprobs is not None:
            entries = [(lp.token, lp) for lp in event.logprobs]
            if event.prompt_logprobs is not None:
                prompt_lps[i // n] = event.prompt_logprobs
            if prefix and i // n in prompt_lps:  # this choice's first chunk: the echo
                ids = prompts[i // n]
                entries = list(zip(ids, prompt_lps[i // n], strict=True)) + entries
            lp = completion_logprobs(tokens, entries, sent[i])
        text = prefix + event.text
        sent[i] += len(text)
        choice = CompletionChoice(
            index=i, text=text, finish_reason=event.finish_reason, logprobs=lp
        )
        return Completion(id=rid, created=now, model=name, choices=[choice])

    if req.stream:
        usage_chunk = Completion(id=rid, created=now, model=name, choices=[])
        return _event_stream(streams, watcher, chunk, usage_chunk, req.include_usage, prompt_tokens)
    choices = await _collect(streams, watcher)
    done = Completion(id=rid, created=now, model=name, choices=[])
    for i, c in enumerate(choices):
        done.choices += chunk(i, c).choices
    done.usage = Usage.count(prompt_tokens, [c.completion_tokens for c in choices])
    return JSONResponse(done.model_dump())


async def _chat_ids(served: ServedModel, req: ChatCompletionRequest) -> list[int]:
    """The conversation in the chat template, as prompt ids; templating and tokenising run off
    the event loop, so that a huge prompt stalls no one."""
    messages = [m.for_template() for m in req.messages]
    try:
        ids = await asyncio.to_thread(served.engine.tokenizer.encode_chat, messages)
    except TemplateError as e:  # e.g. the template's raise_exception on role order
        raise APIError(400, f"chat template: {e}", "messages") from e
    return await asyncio.to_thread(served.prompt_ids, ids, "messages")


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    served = _served(request)
    engine = served.engine
    req: ChatCompletionRequest = await _parse(request, ChatCompletionRequest)
    served.check_model(req.model)
    ids = await _chat_ids(served, req)
    limit = req.token_limit(room=engine.max_model_len - len(ids))
    params = req.sampling_params(limit, req.logprob_count())
    await asyncio.to_thread(served.check, ids, params)
    streams = served.submit(ids, params)
    watcher = _abort_on_disconnect(request, streams)
    rid, now, name = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), served.model_name
    tokens = served.tokens

    def logprobs_of(found: list) -> dict[str, Any] | None:
        return None if params.logprobs is None else chat_logprobs(tokens, found)

    def chunk(i: int, event: StreamEvent) -> ChatCompletionChunk:
        delta = {"content": event.text} if event.text else {}
        choice = ChatChunkChoice(
            index=i,
            delta=delta,
            finish_reason=event.finish_reason,
            logprobs=logprobs_of(event.logprobs),
        )
        return ChatCompletionChunk(id=rid, created=now, model=name, choices=[choice])

    if req.stream:
        heads = _chat_heads(rid, now, name, len(streams))
        usage_chunk = ChatCompletionChunk(id=rid, created=now, model=name, choices=[])
        return _event_stream(
            streams, watcher, chunk, usage_chunk, req.include_usage, len(ids), heads
        )
    choices = await _collect(streams, watcher)
    done = ChatCompletion(
        id=rid,
        created=now,
        model=name,
        choices=[_chat_choice(i, c, logprobs_of(c.logprobs)) for i, c in enumerate(choices)],
        usage=Usage.count(len(ids), [c.completion_tokens for c in choices]),
    )
    return JSONResponse(done.model_dump())


def _chat_heads(rid: str, now: int, name: str, n: int) -> list[ChatCompletionChunk]:
    """A chat stream's first chunk for each of its ``n`` choices: the assistant's role, with
    empty content, before any text."""
    first = {"role": "assistant", "content": ""}
    return [
        ChatCompletionChunk(
            id=rid,
            created=now,
            model=name,
            choices=[ChatChunkChoice(index=i, delta=first, finish_reason=None)],
        )
        for i in range(n)
    ]


def _chat_choice(i: int, event: StreamEvent, logprobs: dict[str, Any] | None) -> ChatChoice:
    """Choice ``i`` of a whole (unstreamed) chat completion: the assistant's message."""
    return ChatChoice(
        index=i,
        message={"role": "assistant", "content": event.text},
        finish_reason=event.finish_reason,
        logprobs=logprobs,
    )


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
            route = MODEL_CARD_ROUTE
        else:
            route = path if path in ROUTES else "other"
        status = 500  # what the client gets if the app fails before it starts a response

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.counts[(route, status)] += 1


# ---- the app ----------------------------------------------------------------------------------


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Run the engine loop while the app serves."""
    ae: AsyncEngine = app.state.async_engine
    ae.start()
    try:
        yield
    finally:
        await asyncio.to_thread(ae.stop)


def build_app(
    llm: Any,
    api_key: str | None = None,
    served_model_name: str | None = None,
    max_waiting: int | None = None,
) -> FastAPI:
    """The HTTP app serving ``llm`` (a ``saguaro.LLM``). Its lifespan runs the engine loop;
    closing ``llm`` stays with the caller. ``served_model_name`` defaults to the model
    directory's name; beyond ``max_waiting`` requests waiting for a place in the batch, new
    ones get 429 (None: no bound)."""
    engine = llm.engine
    ae = AsyncEngine(engine, max_waiting)
    served = ServedModel(ae, served_model_name or engine.target_dir.name)
    app = FastAPI(
        title="saguaro",
        lifespan=_lifespan,
        exception_handlers=EXCEPTION_HANDLERS,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # the API is OpenAI's; its reference documents it
    )
    app.state.async_engine = ae
    app.state.served = served
    app.include_router(router)
    if api_key:
        app.add_middleware(BearerAuth, api_key=api_key)
    app.add_middleware(HTTPCounter, counts=served.http_counts)
    return app
