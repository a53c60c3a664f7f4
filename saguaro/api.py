"""Public Python entry point: ``LLM`` and ``SamplingParams``.

>>> from saguaro import LLM, SamplingParams
>>> llm = LLM()                                   # SmolLM2-135M-Instruct, AR
>>> out = llm.generate(["def fibonacci(n):"], SamplingParams(temperature=0, max_tokens=32))
>>> print(out[0].text, out[0].metrics["mean_accepted_length"])
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tqdm import tqdm

from saguaro.config import EngineConfig
from saguaro.core.metrics import summarize
from saguaro.core.records import RoundRecord
from saguaro.core.sequence import Sequence as Seq
from saguaro.core.snapshot import EngineSnapshot
from saguaro.engine.engine import LLMEngine
from saguaro.sampling import SamplingParams
from saguaro.sampling.logprobs import TokenLogprob
from saguaro.speculation.factory import make_proposer

Prompt = str | list[int]


@dataclass
class RequestOutput:
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort" | "error"
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why this request failed (finish_reason "error")
    records: list[RoundRecord] = field(default_factory=list)  # what each decoding round did
    logprobs: list[TokenLogprob] | None = None  # per token, when the request asked for them
    prompt_logprobs: list[TokenLogprob | None] | None = None  # per prompt token (first: None)
    # n > 1: every sample of the prompt, this one (sample 0) first; empty for n = 1
    samples: list[RequestOutput] = field(default_factory=list)


def request_metrics(seq: Seq) -> dict[str, Any]:
    out = summarize(seq.records)
    out["output_tokens"] = seq.num_output_tokens
    out["prompt_tokens"] = seq.num_prompt_tokens
    out["cached_prompt_tokens"] = seq.num_cached_tokens
    out["preemptions"] = seq.num_preemptions
    if seq.first_token_time is not None:
        out["ttft_s"] = seq.first_token_time - seq.arrival_time
    if seq.finish_time is not None:
        total = seq.finish_time - seq.arrival_time
        out["latency_s"] = total
        out["tokens_per_s"] = seq.num_output_tokens / total if total > 0 else None
        if seq.num_output_tokens > 1 and seq.first_token_time is not None:
            out["tpot_s"] = (seq.finish_time - seq.first_token_time) / (seq.num_output_tokens - 1)
    return out


class LLM:
    """An engine instance. ``mode`` is ``"ar"``, ``"sd"`` or ``"ssd"``; with no ``model`` the
    default model, SmolLM2-135M-Instruct (and, for speculation, the draft trained for it) is
    used."""

    def __init__(self, model: str | None = None, draft: str | None = None, **kwargs: Any) -> None:
        """``model``/``draft``: local Hugging Face directories or names in the models directory
        (None: the default pair); every other :class:`~saguaro.config.EngineConfig` field by
        keyword (``mode``, ``num_speculative_tokens``, ...)."""
        self.config = EngineConfig(model=model, draft=draft, **kwargs)
        self.engine = LLMEngine(self.config, make_proposer)
        self.tokenizer = self.engine.tokenizer
        self.last_run: dict[str, Any] = {}

    def _add_all(
        self, prompts: Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams] | None
    ) -> list[tuple[Prompt, list[Seq]]]:
        """Each prompt's samples (``params.n`` of them), added after every prompt is valid."""
        if isinstance(params, SamplingParams) or params is None:
            params_list = [params or SamplingParams()] * len(prompts)
        else:
            params_list = list(params)
            if len(params_list) != len(prompts):
                raise ValueError(f"{len(params_list)} SamplingParams for {len(prompts)} prompts")
        # Validate every prompt before starting any work.
        encoded = [self.engine.encode_prompt(p) for p in prompts]
        return [
            (p, self.engine.add_samples(ids, sp))
            for p, ids, sp in zip(prompts, encoded, params_list, strict=True)
        ]

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Generate for every prompt (string or token ids); one result per prompt, in order."""
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        added = self._add_all(prompts, params)
        seqs = [s for _, samples in added for s in samples]
        start = time.perf_counter()
        bar = tqdm(total=len(seqs), disable=not use_tqdm, desc="generate")
        try:
            while any(not s.is_finished for s in seqs):
                done = sum(s.is_finished for s in seqs)
                self.engine.step()
                bar.update(sum(s.is_finished for s in seqs) - done)
        except BaseException:
            for s in seqs:
                self.engine.abort(s.seq_id)
            raise
        finally:
            bar.close()
        elapsed = time.perf_counter() - start
        self.last_run = summarize(r for s in seqs for r in s.records)
        self.last_run["elapsed_s"] = elapsed
        self.last_run["output_tokens"] = sum(s.num_output_tokens for s in seqs)
        self.last_run["tokens_per_s"] = (
            self.last_run["output_tokens"] / elapsed if elapsed else None
        )
        draft_stats = self.engine.draft_stats(min(len(seqs), self.config.max_num_seqs))
        if draft_stats:
            self.last_run[self.config.mode] = draft_stats
        failure = self.engine.draft_health().failure
        if failure:
            self.last_run["draft_failure"] = failure
        return [self._outputs(p, samples) for p, samples in added]

    def stream(self, prompt: Prompt, params: SamplingParams | None = None) -> Iterator[str]:
        """Yield text deltas as tokens are committed (several per round under speculation)."""
        if params is not None and params.n != 1:
            raise ValueError(f"stream() yields one sample's text; got n={params.n}")
        [(_, [seq])] = self._add_all([prompt], params)
        sent = 0
        try:
            while not seq.is_finished:
                self.engine.step()
                text = self.engine.stream_text(seq)
                if len(text) > sent:
                    yield text[sent:]
                    sent = len(text)
        finally:
            self.engine.abort(seq.seq_id)
        if len(seq.text) > sent:
            yield seq.text[sent:]
        self.last_output = self._output(prompt, seq)

    def _outputs(self, prompt: Prompt, samples: list[Seq]) -> RequestOutput:
        outs = [self._output(prompt, s) for s in samples]
        return replace(outs[0], samples=outs) if len(outs) > 1 else outs[0]

    def _output(self, prompt: Prompt, seq: Seq) -> RequestOutput:
        return RequestOutput(
            prompt=prompt if isinstance(prompt, str) else None,
            prompt_token_ids=seq.token_ids[: seq.num_prompt_tokens],
            text=seq.text,
            token_ids=seq.output_token_ids,
            finish_reason=seq.finish_reason,
            metrics=request_metrics(seq),
            error=seq.error,
            records=list(seq.records),
            logprobs=None if seq.logprobs is None else list(seq.logprobs),
            prompt_logprobs=None if seq.prompt_logprobs is None else list(seq.prompt_logprobs),
        )

    def snapshot(self) -> EngineSnapshot:
        """The engine's state: queues, KV blocks, the draft's state and restarts."""
        return self.engine.snapshot()

    def draft_stats(self, batch: int = 1) -> dict[str, Any]:
        """The running strategy's own figures (SSD: fan-out, budget, cumulative ``totals`` of
        draft-side seconds, backup policy) for a batch of ``batch``; empty for AR."""
        return self.engine.draft_stats(batch)

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
