"""What the bench measures: a backend serves one batch of prompts and reports its tokens, timings
and speculation records. :class:`SaguaroBackend` is a :class:`saguaro.LLM` of one mode;
:class:`HFAssistedBackend` is transformers' assisted generation on the same checkpoints."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from saguaro import LLM
from saguaro.bench.config import BenchConfig
from saguaro.bench.plan import Variant
from saguaro.core.records import RoundRecord
from saguaro.sampling import SamplingParams

# AR has no speculation length, but EngineConfig requires a valid one.
_AR_K = 1
# transformers' streamer gets the prompt in its first put, the first generated token in its second.
_FIRST_TOKEN_PUT = 2
# transformers' settings that turn a filter off: top-k 0 and top-p 1 keep every token, a
# confidence threshold of 0 never ends a round of drafting early.
_NO_TOP_K = 0
_NO_TOP_P = 1.0
_NO_CONFIDENCE_CUTOFF = 0.0
# Padding token where the target's generation config names no EOS to pad with.
_FALLBACK_PAD_ID = 0


@dataclass
class RequestResult:
    prompt_id: str
    token_ids: list[int]
    latency_s: float  # from the batch's start, so sequential serving pays its queueing
    ttft_s: float | None
    tpot_s: float | None


@dataclass
class Generation:
    """What one backend call on one batch of prompts produced."""

    elapsed_s: float
    requests: list[RequestResult]
    records: list[list[RoundRecord]] = field(default_factory=list)  # per request (saguaro)
    target_forwards: int | None = None  # hf-assisted: target forward passes (one per round)
    predicted_speedup: float | None = None  # SSD: docs/design.md §7, relative to one verification
    ssd_stats: dict[str, Any] | None = None
    ssd_totals: dict[str, float] | None = None  # SSD: draft-side seconds during this call
    draft_failure: str | None = None


class Backend(Protocol):
    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> Generation: ...

    def close(self) -> None: ...


class SaguaroBackend:
    """An `LLM` of one mode, kept for the whole bench (SSD: its draft worker too)."""

    def __init__(self, variant: Variant, cfg: BenchConfig, max_model_len: int, max_seqs: int):
        self.variant = variant
        spec = variant.mode != "ar"
        self.llm = LLM(
            model=cfg.model,
            draft=cfg.draft if spec else None,
            mode=variant.mode,
            num_speculative_tokens=variant.k or _AR_K,
            fanout=variant.fanout or "auto",
            sampling=variant.sampling,
            saguaro_c=variant.saguaro_c,
            device=cfg.device,
            max_model_len=max_model_len,
            max_num_seqs=max_seqs,
            # Repeats and batch sizes reuse prompts: a prefix cache would flatter TTFT, and the
            # peer has none.
            enable_prefix_caching=False,
            seed=cfg.seed,
        )

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> Generation:
        # SSD's figures are cumulative per worker: diff them unless a restart replaced it.
        restarts = self.llm.snapshot().draft_restarts
        before = self.llm.draft_stats().get("totals")
        outs = self.llm.generate(prompts, params)
        snap = self.llm.snapshot()
        gen = Generation(
            elapsed_s=self.llm.last_run["elapsed_s"],
            requests=[
                RequestResult(
                    "",
                    o.token_ids,
                    o.metrics["latency_s"],
                    o.metrics.get("ttft_s"),
                    o.metrics.get("tpot_s"),
                )
                for o in outs
            ],
            records=[o.records for o in outs],
            draft_failure=snap.draft_failure,
        )
        stats = self.llm.draft_stats(len(prompts))
        if "totals" in stats and before is not None and snap.draft_restarts == restarts:
            gen.ssd_stats = stats
            gen.predicted_speedup = stats["predicted_speedup"]
            gen.ssd_totals = {k: v - before[k] for k, v in stats["totals"].items()}
        return gen

    def close(self) -> None:
        self.llm.close()


class _FirstTokenClock:
    """A `generate` streamer that only notes when the first generated tokens arrive."""

    def __init__(self) -> None:
        self.puts = 0
        self.first_token_time: float | None = None

    def put(self, value: torch.Tensor) -> None:
        self.puts += 1
        if self.puts == _FIRST_TOKEN_PUT:
            self.first_token_time = time.perf_counter()

    def end(self) -> None:
        pass


class HFAssistedBackend:
    """transformers' assisted generation on the same checkpoints. It supports batch size 1 only,
    so a batch of b requests is served one after another."""

    def __init__(self, variant: Variant, target_dir: Path, draft_dir: Path, device: str):
        import transformers
        from transformers import AutoModelForCausalLM

        transformers.logging.set_verbosity_error()  # per-call deprecation chatter
        transformers.logging.disable_progress_bar()
        self.device = device
        self.target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
        self.draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32)
        self.target.to(device).eval()
        self.draft.to(device).eval()
        # The same K as our speculative modes, every round: no heuristic length schedule and no
        # confidence cut-off.
        dcfg = self.draft.generation_config
        dcfg.num_assistant_tokens = variant.k
        dcfg.num_assistant_tokens_schedule = "constant"
        dcfg.assistant_confidence_threshold = _NO_CONFIDENCE_CUTOFF
        eos = self.target.generation_config.eos_token_id
        self.pad_id = (eos[0] if isinstance(eos, list) else eos) or _FALLBACK_PAD_ID
        self.forwards = 0
        self.target.register_forward_hook(self._count)

    def _count(self, *_: Any) -> None:
        self.forwards += 1

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> Generation:
        """Each request's latency runs from the batch's start; its TPOT is (end - first token) /
        (tokens - 1)."""
        from transformers import GenerationConfig

        self.forwards = 0
        requests = []
        start = time.perf_counter()
        for ids, p in zip(prompts, params, strict=True):
            sampling = p.temperature > 0
            if sampling:
                torch.manual_seed(p.seed)
            gcfg = GenerationConfig(
                max_new_tokens=p.max_tokens,
                do_sample=sampling,
                temperature=p.temperature if sampling else None,
                top_k=_NO_TOP_K,
                top_p=p.top_p if sampling else _NO_TOP_P,
                eos_token_id=None,  # the same output length as our modes (ignore_eos)
                pad_token_id=self.pad_id,
            )
            x = torch.tensor([ids], device=self.device)
            clock = _FirstTokenClock()
            out = self.target.generate(
                x,
                attention_mask=torch.ones_like(x),
                assistant_model=self.draft,
                generation_config=gcfg,
                streamer=clock,
            )
            tokens = out[0, len(ids) :].tolist()
            now = time.perf_counter()
            first = clock.first_token_time
            tpot = (now - first) / (len(tokens) - 1) if first and len(tokens) > 1 else None
            requests.append(
                RequestResult("", tokens, now - start, first - start if first else None, tpot)
            )
        return Generation(time.perf_counter() - start, requests, target_forwards=self.forwards)

    def close(self) -> None:
        pass
