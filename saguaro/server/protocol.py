"""The OpenAI-compatible request and response bodies, and a request's ``SamplingParams``.

Requests are strict: an unknown field, a wrong type (``"0.5"`` is not a temperature) or a value
outside OpenAI's range fails validation, which the routes answer with a 400.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from saguaro.sampling import SamplingParams
from saguaro.server.errors import APIError

if TYPE_CHECKING:
    from saguaro.server.async_engine import StreamEvent

# OpenAI's limits and defaults, so that its clients see the same API.
MAX_STOP_SEQUENCES = 4
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
    include_usage: bool = False


class GenerationRequest(RequestBody):
    """What completions and chat completions share: the model and how to sample."""

    model: str | None = None  # None: the served model
    temperature: float | None = Field(None, ge=0, le=MAX_TEMPERATURE)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int = Field(0, ge=-1)  # saguaro extension: 0 or -1 disable it
    seed: int | None = Field(None, ge=MIN_SEED, lt=SEED_LIMIT)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1
    user: str | None = None  # accepted for compatibility; not used
    ignore_eos: bool = False  # saguaro extension
    sampling: Literal["rejection", "coupled"] | None = None  # saguaro extension: None = server's

    @field_validator("stop")
    @classmethod
    def _few_stop_sequences(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences, got {len(stop)}")
        return stop

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The engine's parameters for this request; ``APIError`` (400) if they are invalid."""
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed when stream is true", "stream")
        try:
            return SamplingParams(
                temperature=DEFAULT_TEMPERATURE if self.temperature is None else self.temperature,
                top_p=DEFAULT_TOP_P if self.top_p is None else self.top_p,
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


class CompletionRequest(GenerationRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(DEFAULT_COMPLETION_TOKENS, ge=1)

    def single_prompt(self) -> str | list[int]:
        """The one prompt (text or token ids) this request holds; a list of prompts must have
        exactly one."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise APIError(400, "one prompt per request is supported", "prompt")
            return prompt[0]
        return prompt

    def token_limit(self) -> int:
        return self.max_tokens or DEFAULT_COMPLETION_TOKENS


class TextPart(RequestBody):
    type: Literal["text"]
    text: str


class ChatMessage(RequestBody):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

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

    def token_limit(self, room: int) -> int:
        """Tokens to generate at most; ``room``: what the context has left after the prompt."""
        return self.max_completion_tokens or self.max_tokens or room


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
