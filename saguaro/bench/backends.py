"""What the bench measures: a backend serves one batch of prompts and reports its tokens, timings
and speculation records. :class:`SaguaroBackend` is a :class:`saguaro.LLM` of one mode;
:class:`HFAssistedBackend` is transformers' assisted generation on the same checkpoints;
:class:`LlamaCppBackend` and :class:`LlamaCppSpecBackend` are llama.cpp peers (AR through
llama-cpp-python, draft-model speculation through llama.cpp's llama-speculative-simple binary) on
the same checkpoints written as GGUF."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from saguaro import LLM, placement
from saguaro.bench.config import LOOKUP_MODE, BenchConfig
from saguaro.bench.gguf_export import EXPORT_VERSION
from saguaro.bench.plan import Variant
from saguaro.bench.synthetic import synthetic_verifier
from saguaro.config import LOOKUP_DRAFT, paper_layout
from saguaro.core.records import RoundRecord
from saguaro.engine.loading import check_compatible
from saguaro.errors import IncompatibleModelsError, ModelLoadError
from saguaro.models.config import ModelConfig
from saguaro.models.gguf_import import GGUF_NAME
from saguaro.models.loader import safetensors_files
from saguaro.models.tokenizer import Tokenizer
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
    # The output as text, where the backend has it. llama.cpp-sd's token ids are its text
    # tokenised again, which can split differently from the ids llama.cpp produced: the greedy
    # check compares its text instead (check.py).
    text: str | None = None


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
    peer_stats: dict[str, Any] | None = None  # llama.cpp-sd: what the binary reported


class Backend(Protocol):
    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> Generation: ...

    def close(self) -> None: ...


def every_core(owner: object, threads: int | None = None) -> None:
    """Put this process on every core it had before an engine placed it, with ``threads`` torch
    threads (default one per core), for a backend that is not a saguaro engine: whatever SSD's
    engine did before, peers compute on the cores SSD's target and draft use together."""
    placement.place(owner, placement.on_cores(placement.process_cpus(), threads))


class SaguaroBackend:
    """An `LLM` of one mode, kept for the whole bench (SSD: its draft worker too)."""

    def __init__(self, variant: Variant, cfg: BenchConfig, max_model_len: int, max_seqs: int):
        self.variant = variant
        spec = variant.mode != "ar"
        lookup = variant.mode == LOOKUP_MODE
        self.llm = LLM(
            model=cfg.model,
            draft=LOOKUP_DRAFT if lookup else cfg.draft if spec else None,
            mode="sd" if lookup else variant.mode,
            num_speculative_tokens=variant.k or _AR_K,
            fanout=variant.fanout or "auto",
            sampling=variant.sampling,
            saguaro_c=variant.saguaro_c,
            device=cfg.device,
            draft_device=cfg.draft_device if variant.mode in ("ssd", "auto") else None,
            max_model_len=max_model_len,
            max_num_seqs=max_seqs,
            # Repeats and batch sizes reuse prompts: a prefix cache would flatter TTFT, and the
            # peer has none.
            enable_prefix_caching=False,
            seed=cfg.seed,
            compile=variant.forwards == "compiled",
            enforce_eager=variant.forwards != "graphs",
            dtype=variant.dtype,
            draft_dtype=variant.draft_dtype,
            **_set_only(
                # lookup mode sweeps the rule it copies by; the draft modes their chains'
                **{"copy_lookup" if lookup else "draft_lookup": variant.draft_lookup},
                draft_stop_below=variant.draft_stop_below,
                draft_head_tokens=variant.draft_head_tokens,
            ),
            tensor_parallel_size=variant.tensor_parallel_size,
            # Equal hardware by default: the engine's placement (AR/SD: every core; SSD: target
            # and worker on their own; auto: AR and SD on every core, SSD's target on the
            # worker's complement). The target on one core only where asked for.
            **(paper_layout(variant.mode, placement.process_cpus()) if variant.one_core else {}),
        )
        if cfg.synthetic_acceptance is not None and spec:
            # One verifier for the engine's life: its generator must run on across rounds (one
            # made per round would draw the same acceptances every round).
            verifier = synthetic_verifier(cfg.synthetic_acceptance, cfg.seed)
            self.llm.engine.verifier_for = lambda _method: verifier

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
                    o.text,
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


def check_hf_pair(target_dir: Path, draft_dir: Path) -> None:
    """Raise, before anything loads, where transformers cannot run assisted generation on the
    pair: a model that is not a Hugging Face checkpoint (a GGUF file, a directory without
    config.json and safetensors weights), or a draft whose tokens differ from the target's."""
    for role, path in (("target", target_dir), ("draft", draft_dir)):
        if path.is_dir() and (path / "config.json").is_file() and _has_safetensors(path):
            continue
        raise ModelLoadError(
            f"mode hf-assisted runs transformers, which reads Hugging Face checkpoints "
            f"(config.json and safetensors weights), and the {role} {path} is not one "
            "(saguaro import-gguf writes a GGUF file as one; or leave hf-assisted out of --modes)"
        )
    check_compatible(target_dir, draft_dir, Tokenizer(target_dir))
    head = ModelConfig.from_dir(draft_dir).draft_vocab_size
    if head is not None:
        raise IncompatibleModelsError(
            f"mode hf-assisted: the draft {draft_dir} scores a reduced output vocabulary of "
            f"{head} tokens (draft_vocab_size), which transformers cannot load; leave "
            "hf-assisted out of --modes, or give a draft over the whole vocabulary"
        )


def _has_safetensors(model_dir: Path) -> bool:
    try:
        return bool(safetensors_files(model_dir))
    except ModelLoadError:
        return False


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

        every_core(self)

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


# ---- llama.cpp peers -----------------------------------------------------------------------------

PEER_EXTRA_HINT = "pip install 'saguaro-decoding[peer]' (llama-cpp-python)"
# Bumped when gguf_export writes different files for the same checkpoint: old cache entries are
# then not reused.
GGUF_FORMAT_VERSION = 1
# llama.cpp's samplers: top-k 0 and min-p 0 keep every token; top-k 1 is greedy.
_LLAMA_NO_TOP_K = 0
_LLAMA_GREEDY_TOP_K = 1
_LLAMA_NO_MIN_P = 0.0
_LLAMA_NO_PENALTY = 1.0
# The draft's own confidence cut-off: 0 drafts K tokens every round, as our modes do.
_LLAMA_NO_DRAFT_P_MIN = 0.0
SPEC_BINARY = "llama-speculative-simple"
# llama-speculative-simple writes the text (prompt, then the generated tokens) to stdout between
# two blank-line pairs; its timings and counts go to stderr.
_SPEC_TEXT_HEAD = "\n\n"
_SPEC_TEXT_TAIL = "\n\n\n\n"
_SPEC_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_SPEC_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
_SPEC_COUNTS = re.compile(r"\b(n_draft|n_predict|n_drafted|n_accept)\s*=\s*(\d+)")


def import_llama_cpp() -> Any:
    """The ``llama_cpp`` module, or an ImportError that says how to install it."""
    try:
        import llama_cpp
    except ImportError as e:
        raise ImportError(f"mode llama.cpp needs llama-cpp-python: {PEER_EXTRA_HINT} ({e})") from e
    return llama_cpp


def _require_gguf() -> None:
    try:
        import gguf  # noqa: F401
    except ImportError as e:
        raise ImportError(f"the llama.cpp modes need gguf: {PEER_EXTRA_HINT} ({e})") from e


def model_fingerprint(model_dir: Path) -> str:
    """A short key for a checkpoint's files as they are now (contents of the small files, size
    and modification time of the weights), so that a changed checkpoint gets a new GGUF file."""
    h = hashlib.sha256(f"gguf-v{GGUF_FORMAT_VERSION}".encode())
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        path = model_dir / name
        h.update(name.encode() + (path.read_bytes() if path.is_file() else b"-"))
    for f in safetensors_files(model_dir):
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:12]


def cached_gguf(model_dir: Path, cache_dir: str | Path, dtype: str) -> Path:
    """The GGUF file of ``model_dir`` in ``cache_dir``, written on first use."""
    from saguaro.bench.gguf_export import export_gguf

    _require_gguf()
    model_dir = Path(model_dir).resolve()
    path = Path(cache_dir).expanduser() / (
        f"{model_dir.name}-{model_fingerprint(model_dir)}-v{EXPORT_VERSION}-{dtype}.gguf"
    )
    if not path.is_file():
        export_gguf(model_dir, path, dtype)
    return path


def peer_gguf(model_dir: Path, cache_dir: str | Path, dtype: str) -> Path:
    """The file llama.cpp runs for ``model_dir``: a GGUF file given as the model, or the
    directory's own GGUF file where it keeps one (the very blocks saguaro's kernels run), else
    the checkpoint written as GGUF."""
    if Path(model_dir).suffix == ".gguf":
        return Path(model_dir)
    own = Path(model_dir) / GGUF_NAME
    return own if own.is_file() else cached_gguf(model_dir, cache_dir, dtype)


def peer_threads(cfg: BenchConfig) -> int:
    """The peers' threads: --llama-cpp-threads, else every core this process had before an SSD
    engine placed it (the cores SSD's target and draft use together)."""
    return cfg.llama_cpp_threads or len(placement.process_cpus())


class LlamaCppBackend:
    """llama.cpp's autoregressive decoding through llama-cpp-python, on the target written as
    GGUF. Token ids in, token ids out: no tokenisation on llama.cpp's side. llama.cpp serves one
    sequence at a time here, so a batch of b requests is served one after another (latency from
    the batch's start, as for hf-assisted). At T = 0 it samples greedily; at T > 0 with its own
    sampler (temperature, top-p, seeded per request), so only its greedy tokens are comparable."""

    def __init__(self, cfg: BenchConfig, target_dir: Path, max_model_len: int):
        llama_cpp = import_llama_cpp()
        self.gguf_path = peer_gguf(target_dir, cfg.llama_cpp_cache, cfg.llama_cpp_dtype)
        self.threads = peer_threads(cfg)
        self.llm = llama_cpp.Llama(
            model_path=str(self.gguf_path),
            n_threads=self.threads,
            n_threads_batch=self.threads,
            n_ctx=max_model_len,
            n_gpu_layers=0,
            logits_all=False,
            seed=cfg.seed,
            verbose=False,
        )

    def _sampler_args(self, p: SamplingParams) -> dict[str, Any]:
        if p.temperature == 0:
            return dict(temp=0.0, top_k=_LLAMA_GREEDY_TOP_K, top_p=_NO_TOP_P)
        self.llm.set_seed(p.seed)
        return dict(temp=p.temperature, top_k=_LLAMA_NO_TOP_K, top_p=p.top_p)

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> Generation:
        every_core(self)  # ggml's threads inherit this thread's cores
        requests = []
        start = time.perf_counter()
        for ids, p in zip(prompts, params, strict=True):
            self.llm.reset()  # no prefix reuse between requests: the same work as our modes
            tokens: list[int] = []
            first: float | None = None
            for tok in self.llm.generate(
                ids,
                min_p=_LLAMA_NO_MIN_P,
                repeat_penalty=_LLAMA_NO_PENALTY,
                **self._sampler_args(p),
            ):
                tokens.append(int(tok))
                if first is None:
                    first = time.perf_counter()
                if len(tokens) >= p.max_tokens:  # EOS does not stop it (ignore_eos)
                    break
            now = time.perf_counter()
            tpot = (now - first) / (len(tokens) - 1) if first and len(tokens) > 1 else None
            requests.append(
                RequestResult("", tokens, now - start, first - start if first else None, tpot)
            )
        return Generation(time.perf_counter() - start, requests)

    def close(self) -> None:
        self.llm.close()


def parse_spec_output(stdout: str, stderr: str, prompt_text: str) -> dict[str, Any]:
    """What one llama-speculative-simple run reported: the generated text, the prompt's and the
    generation's token counts and seconds, the decode speed, and the draft counts."""
    enc, dec = _SPEC_ENCODED.search(stderr), _SPEC_DECODED.search(stderr)
    if enc is None or dec is None:
        raise RuntimeError(f"{SPEC_BINARY}: no timings in its output:\n{stderr[-2000:]}")
    text = stdout
    if text.startswith(_SPEC_TEXT_HEAD):
        text = text[len(_SPEC_TEXT_HEAD) :]
    if text.endswith(_SPEC_TEXT_TAIL):
        text = text[: -len(_SPEC_TEXT_TAIL)]
    if not text.startswith(prompt_text):
        raise RuntimeError(f"{SPEC_BINARY}: its output does not start with the prompt")
    out: dict[str, Any] = {
        "text": text[len(prompt_text) :],
        "prompt_tokens": int(enc.group(1)),
        "encode_s": float(enc.group(2)),
        "decoded_tokens": int(dec.group(1)),
        "decode_s": float(dec.group(2)),
        "tokens_per_s": float(dec.group(3)),
    }
    out.update({k: int(v) for k, v in _SPEC_COUNTS.findall(stderr)})
    return out


class LlamaCppSpecBackend:
    """llama.cpp's speculative decoding with the draft model: its ``llama-speculative-simple``
    binary (llama-cpp-python drives no draft model), one process per request, on the target and
    draft written as GGUF. The binary takes the prompt as text: our prompt ids, detokenised
    (without the BOS, which llama.cpp adds itself); it returns text, which is tokenised again with
    our tokenizer and cut at max_tokens. Models do not always emit the canonical tokenisation of
    their text, so those ids can differ from llama.cpp's own while the text is the same: the
    greedy check compares this peer's text with AR's (as a peer: prefix statistics). The binary
    decodes up to K tokens past max_tokens; the text keeps them, the check compares AR's length.

    Its timings are the binary's: a request's TTFT is the cumulative time of the earlier requests
    plus its prompt encoding, its latency the cumulative time to its end, its TPOT the decode
    time per decoded token (the binary may decode up to K tokens past max_tokens and counts them);
    process start and model loading are outside, as the other backends' loading is."""

    def __init__(
        self,
        variant: Variant,
        cfg: BenchConfig,
        target_dir: Path,
        draft_dir: Path,
        max_model_len: int,
    ):
        if not cfg.llama_cpp_bin:
            raise ValueError("mode llama.cpp-sd needs --llama-cpp-bin DIR")
        self.binary = Path(cfg.llama_cpp_bin).expanduser() / SPEC_BINARY
        if not os.access(self.binary, os.X_OK):
            raise ValueError(f"{self.binary}: not an executable (build llama.cpp's {SPEC_BINARY})")
        self.target = peer_gguf(target_dir, cfg.llama_cpp_cache, cfg.llama_cpp_dtype)
        self.draft = peer_gguf(draft_dir, cfg.llama_cpp_cache, cfg.llama_cpp_dtype)
        self.tokenizer = Tokenizer(target_dir)
        self.k = variant.k or 1
        self.threads = peer_threads(cfg)
        self.ctx = max_model_len

    def prompt_text(self, ids: list[int]) -> str:
        """The prompt as the binary reads it: without a leading BOS, which it adds itself."""
        bos = self.tokenizer.bos_token_id
        body = ids[1:] if ids and bos is not None and ids[0] == bos else ids
        return self.tokenizer.decode(body, skip_special_tokens=False)

    def command(self, text: str, p: SamplingParams) -> list[str]:
        greedy = p.temperature == 0
        sampling = ["--temp", "0", "--top-k", str(_LLAMA_GREEDY_TOP_K)] if greedy else [
            "--temp", f"{p.temperature:g}", "--top-k", str(_LLAMA_NO_TOP_K),
            "--top-p", f"{p.top_p:g}", "--seed", str(p.seed),
        ]  # fmt: skip
        return [
            str(self.binary),
            "-m", str(self.target), "-md", str(self.draft), "--spec-type", "draft-simple",
            "-p", text, "-n", str(p.max_tokens),
            "--spec-draft-n-max", str(self.k), "--spec-draft-n-min", "0",
            "--spec-draft-p-min", f"{_LLAMA_NO_DRAFT_P_MIN:g}",
            "-t", str(self.threads), "-tb", str(self.threads),
            "-td", str(self.threads), "-tbd", str(self.threads),
            "-c", str(self.ctx),
            "--min-p", f"{_LLAMA_NO_MIN_P:g}", "--ignore-eos",
            *sampling,
        ]  # fmt: skip

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> Generation:
        every_core(self)  # the binary inherits this process's cores
        requests, reports = [], []
        clock = 0.0  # the binary's own seconds, summed over the batch's requests
        for ids, p in zip(prompts, params, strict=True):
            text = self.prompt_text(ids)
            with tempfile.TemporaryDirectory() as tmp:  # the binary may write a cache file
                proc = subprocess.run(
                    self.command(text, p), capture_output=True, text=True, cwd=tmp, check=False
                )
            if proc.returncode != 0:
                raise RuntimeError(
                    f"{SPEC_BINARY} exited {proc.returncode}:\n{proc.stderr[-2000:]}"
                )
            # it echoes the prompt as given, special tokens and all, but not the BOS it adds
            rep = parse_spec_output(proc.stdout, proc.stderr, text)
            text = rep.pop("text")
            tokens = self.tokenizer.encode(text, add_special_tokens=False)
            ttft = clock + rep["encode_s"]
            clock += rep["encode_s"] + rep["decode_s"]
            n = rep["decoded_tokens"]
            tpot = rep["decode_s"] / n if n else None
            requests.append(RequestResult("", tokens[: p.max_tokens], clock, ttft, tpot, text))
            reports.append(rep)
        stats = {
            key: sum(r.get(key, 0) for r in reports)
            for key in ("decoded_tokens", "decode_s", "encode_s", "n_drafted", "n_accept")
        }
        return Generation(clock, requests, peer_stats={**stats, "requests": reports})

    def close(self) -> None:
        pass


def peer_backend(
    variant: Variant,
    cfg: BenchConfig,
    target_dir: Path,
    draft_dir: Path | None,
    max_model_len: int,
) -> Backend:
    """The backend of a llama.cpp peer variant."""
    if variant.mode == "llama.cpp":
        return LlamaCppBackend(cfg, target_dir, max_model_len)
    if variant.mode == "llama.cpp-sd":
        if draft_dir is None:
            raise ValueError("mode llama.cpp-sd needs a draft model")
        return LlamaCppSpecBackend(variant, cfg, target_dir, draft_dir, max_model_len)
    raise ValueError(f"{variant.mode!r} is not a llama.cpp peer mode")


def _set_only(**fields: object) -> dict[str, object]:
    """The engine fields a variant sets (None: the engine's default)."""
    return {name: value for name, value in fields.items() if value is not None}
