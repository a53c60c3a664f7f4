"""The OpenAI-compatible request and response bodies, and a request's ``SamplingParams``.

Requests are strict: an unknown field, a wrong type (``"0.5"`` is not a temperature) or a value
outside OpenAI's range fails validation, which the routes answer with a 400. Every field of
OpenAI's completions and chat completions bodies is known. Those that change nothing saguaro
computes (``user``, ``metadata``, ``service_tier``, ...) are accepted; those asking for what
saguaro does not do (tools, audio, predicted outputs, ``suffix``, ...) are a 400 naming the field
(:meth:`GenerationRequest.refuse_unsupported`), never a silent default. vLLM's extensions
(``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, ``bad_words``,
``stop_token_ids``, ``ignore_eos``) are accepted under vLLM's names.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from saguaro.sampling import SamplingParams
from saguaro.sampling.params import MAX_LOGPROBS, MAX_SAMPLES, LogprobsMode, StructuredOutput
from saguaro.server.errors import APIError

# OpenAI's limits and defaults, so that its clients see the same API.
MAX_STOP_SEQUENCES = 4
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's bound on a completion's `logprobs`
MAX_TEMPERATURE = 2.0
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0
DEFAULT_COMPLETION_TOKENS = 16  # max_tokens of a completion that names none
# A seed may be any 64-bit word, signed or not.
MIN_SEED = -(2**63)
SEED_LIMIT = 2**64


class RequestBody(BaseModel):
    # Unknown fields are rejected, as OpenAI does; strict: "0.5" is not a temperature.
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(RequestBody):
    include_usage: bool | None = False
    include_obfuscation: bool | None = None  # OpenAI pads streamed chunks; nothing to hide here


class JSONSchemaFormat(RequestBody):
    name: str
    description: str | None = None
    # "schema" would shadow a pydantic BaseModel attribute: named by alias
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(RequestBody):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    def constraint(self) -> StructuredOutput | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return StructuredOutput("json_object", None)
        if self.json_schema is None:
            raise APIError(
                400, "response_format json_schema needs its json_schema", "response_format"
            )
        return StructuredOutput("json", self.json_schema.json_schema or {})


class StructuredOutputs(RequestBody):
    """vLLM's structured_outputs: exactly one of its constraints."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def constraint(self) -> StructuredOutput:
        given = {
            "json": self.json_,
            "regex": self.regex,
            "choice": self.choice,
            "grammar": self.grammar,
            "json_object": self.json_object or None,
        }
        named = [k for k, v in given.items() if v is not None]
        if len(named) != 1:
            raise APIError(
                400,
                f"structured_outputs takes exactly one constraint, got {named}",
                "structured_outputs",
            )
        kind = named[0]
        return StructuredOutput(kind, None if kind == "json_object" else given[kind])


class GenerationRequest(RequestBody):
    """What completions and chat completions share: the model and how to sample."""

    model: str | None = None  # None: the served model
    temperature: float | None = Field(None, ge=0, le=MAX_TEMPERATURE)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=MIN_SEED, lt=SEED_LIMIT)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(1, ge=1, le=MAX_SAMPLES)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias in [-100, 100]
    # Accepted, and meaning nothing here: who asks, and hints for OpenAI's own platform.
    user: str | None = None
    metadata: dict[str, str] | None = None
    service_tier: Literal["auto", "default"] | None = None
    # vLLM's extensions
    top_k: int | None = Field(None, ge=-1)  # 0 or -1 disable it
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    min_tokens: int = Field(0, ge=0)
    bad_words: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs_mode: LogprobsMode = "raw"  # saguaro: which distribution logprobs are of
    # Structured output: OpenAI's response_format, vLLM's structured_outputs and guided_*.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    sampling: Literal["rejection", "coupled"] | None = None  # saguaro: None = the server's

    @field_validator("stop")
    @classmethod
    def _few_stop_sequences(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences, got {len(stop)}")
        return stop

    def refuse_unsupported(self) -> None:
        """400 for the first field that asks for something saguaro does not do."""
        for name, value in self.unsupported().items():
            if value is not None:
                raise APIError(400, f"{name} is not supported by this server", name)

    def unsupported(self) -> dict[str, Any]:
        """Fields (name -> value, None where the request leaves it unset or harmless) asking for
        what saguaro cannot do."""
        return {}

    def sampling_params(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        """The engine's parameters for this request; ``APIError`` (400) if they are invalid."""
        self.refuse_unsupported()
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed when stream is true", "stream")
        try:
            bias = {int(k): v for k, v in (self.logit_bias or {}).items()}
        except ValueError as e:
            raise APIError(400, "logit_bias keys must be token ids", "logit_bias") from e
        try:
            return SamplingParams(
                temperature=DEFAULT_TEMPERATURE if self.temperature is None else self.temperature,
                top_p=DEFAULT_TOP_P if self.top_p is None else self.top_p,
                top_k=self.top_k or 0,
                min_p=self.min_p or 0.0,
                presence_penalty=self.presence_penalty or 0.0,
                frequency_penalty=self.frequency_penalty or 0.0,
                repetition_penalty=self.repetition_penalty or 1.0,
                logit_bias=bias,
                min_tokens=self.min_tokens,
                bad_words=self.bad_words,
                stop_token_ids=self.stop_token_ids,
                seed=self.seed,
                max_tokens=max_tokens,
                stop=self.stop,
                ignore_eos=self.ignore_eos,
                n=self.n or 1,
                logprobs=logprobs,
                logprobs_mode=self.logprobs_mode,
                sampling=self.sampling,
                structured=self.structured(),
            )
        except ValueError as e:
            raise APIError(400, str(e)) from e

    def structured(self) -> StructuredOutput | None:
        """The one structured-output constraint the request names (400 for two)."""
        named = {
            "response_format": self.response_format and self.response_format.constraint(),
            "structured_outputs": self.structured_outputs and self.structured_outputs.constraint(),
            "guided_json": self.guided_json and StructuredOutput("json", self.guided_json),
            "guided_regex": self.guided_regex and StructuredOutput("regex", self.guided_regex),
            "guided_choice": self.guided_choice and StructuredOutput("choice", self.guided_choice),
            "guided_grammar": self.guided_grammar
            and StructuredOutput("grammar", self.guided_grammar),
        }
        given = {k: v for k, v in named.items() if v}
        if len(given) > 1:
            raise APIError(400, f"one structured-output constraint at most, got {sorted(given)}")
        return next(iter(given.values()), None)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(GenerationRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(DEFAULT_COMPLETION_TOKENS, ge=1)
    echo: bool | None = False
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    best_of: int | None = Field(None, ge=1, le=MAX_SAMPLES)
    suffix: str | None = None

    def unsupported(self) -> dict[str, Any]:
        # best_of = n returns every sample it drew: what n alone does.
        best_of = self.best_of if self.best_of not in (None, self.n or 1) else None
        return {"suffix": self.suffix, "best_of": best_of}

    def prompts(self) -> list[str | list[int]]:
        """The prompts (text or token ids) this request holds: one choice each (times n)."""
        prompt = self.prompt
        if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
            return [prompt]  # type: ignore[list-item]
        return list(prompt)  # type: ignore[arg-type]

    def token_limit(self) -> int:
        return self.max_tokens or DEFAULT_COMPLETION_TOKENS


class TextPart(RequestBody):
    type: Literal["text"]
    text: str


class ChatMessage(RequestBody):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None
    refusal: str | None = None  # an assistant's earlier refusal: nothing to template

    def for_template(self) -> dict[str, str]:
        """The message as a chat template takes it: text parts joined by newlines."""
        content = (
            self.content
            if isinstance(self.content, str)
            else "\n".join(p.text for p in self.content)
        )
        out = {"role": self.role, "content": content}
        if self.name is not None:
            out["name"] = self.name
        return out


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)  # None: up to the end of the context
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name for it
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    store: bool | None = None
    prompt_cache_key: str | None = None  # prefix caching needs no key
    safety_identifier: str | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    parallel_tool_calls: bool | None = None  # meaningful only with tools
    tool_choice: Any = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: Any = None

    def unsupported(self) -> dict[str, Any]:
        return {
            "tools": self.tools or None,
            "tool_choice": None if self.tool_choice in (None, "none") else self.tool_choice,
            "functions": self.functions or None,
            "function_call": None if self.function_call in (None, "none") else self.function_call,
            "audio": self.audio,
            "modalities": [m for m in self.modalities or [] if m != "text"] or None,
            "prediction": self.prediction,
            "reasoning_effort": self.reasoning_effort,  # the model does not reason
            "verbosity": self.verbosity,
            "web_search_options": self.web_search_options,
            "store": self.store or None,  # nothing is stored
        }

    def logprob_count(self) -> int | None:
        """Alternatives per token (None: no logprobs); 400 for top_logprobs without logprobs."""
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs set to true", "top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None

    def token_limit(self, room: int) -> int:
        """Tokens to generate at most; ``room``: what the context has left after the prompt."""
        return self.max_completion_tokens or self.max_tokens or room


# ---- responses --------------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def count(cls, prompt_tokens: int, completion_tokens: list[int]) -> Usage:
        """A request's usage: its prompts' tokens and every choice's generated tokens."""
        completion = sum(completion_tokens)
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion,
            total_tokens=prompt_tokens + completion,
        )


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: dict[str, Any] | None = None
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
    logprobs: dict[str, Any] | None = None
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
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
