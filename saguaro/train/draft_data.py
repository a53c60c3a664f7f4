"""The target's own outputs, for distilling a draft: prompts, rollouts, and shards on disk.

A draft is judged on the text the *target* writes when it serves, so it is trained there: the
target answers prompts like the ones it serves (ShareGPT's human turns in its chat template, and
Python code to complete), sampled at the temperatures it serves. The rollouts are written in
shards of ``SHARD`` sequences, each a pure function of ``(seed, shard index)``, so an interrupted
run resumes at the first missing shard and regenerates nothing.

The target writes them through transformers (a plain batched loop that also keeps its
top tokens at every position, which saguaro's engine has no reason to return). Replies that
exist already (ShareGPT's) cost only one forward each to score: answer shards hold the target's
top tokens along them, off the target's own path but many more tokens per second.

ShareGPT's held-out tenth (``saguaro.bench.datasets.sharegpt_heldout``) and the standard
library's held-out files are never prompts here: the bench measures acceptance on them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from tqdm import tqdm

from saguaro.options import opt
from saguaro.sampling import SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from transformers.modeling_outputs import CausalLMOutputWithPast

SHARD = 128  # sequences per shard file: one batch of the target
SEED_STRIDE = 1_000_003  # a run's sampling seeds: rollout_seed * SEED_STRIDE + index
# Prompts longer than this many tokens are left out rather than cut: a cut question is not one
# the target would be asked.
MAX_PROMPT_TOKENS = 256
ROLLOUT_DIR = "rollouts"
# The target's likeliest tokens kept per output position: the draft's loss reads p there only
# (the rest of a served distribution's mass is negligible to what a draft can match).
TOP_K = 64
# Characters of code read to cut ``new_tokens`` tokens from: code runs about 4.4 characters a
# token in SmolLM2's tokenizer, and tokenizing the rest of a file would cost more than scoring.
CODE_CHARS_PER_TOKEN = 8
# What greedy rows (temperature 0) divide their logits by: their sample is discarded, so this
# only keeps the division finite.
MIN_TEMPERATURE = 1e-6


def floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(","))


@dataclass(frozen=True)
class RolloutConfig:
    shards: int = opt(48, f"shards of {SHARD} target rollouts to generate and train on")
    new_tokens: int = opt(192, "tokens the target writes per prompt (fewer where its turn ends)")
    temperatures: tuple[float, ...] = opt(
        (0.0, 0.7), "served temperatures, cycled over the prompts", parse=floats, metavar="T,..."
    )
    code_fraction: float = opt(0.3, "share of prompts that are Python code to complete")
    answer_shards: int = opt(
        0, f"shards of {SHARD} ShareGPT replies the target scores as written (teacher forcing)"
    )
    code_shards: int = opt(
        0,
        f"shards of {SHARD} functions of the standard library's training split, their bodies "
        "scored by the target as written (teacher forcing)",
    )
    draft_shards: int = opt(
        0,
        f"shards of {SHARD} continuations the --init draft writes itself, scored by the target "
        "(teacher forcing): on-policy data, where the draft's own chains go wrong",
    )
    rollout_seed: int = opt(0, "prompt order and sampling noise")
    rollout_dtype: Literal["float32", "bfloat16"] = opt(
        "bfloat16", "the target's precision as it writes (bfloat16 is faster on most CPUs)"
    )

    @classmethod
    def recorded(cls, run_dir: Path, cfg: RolloutConfig) -> RolloutConfig:
        """The run's own settings where it has rollouts already (only the shard counts may
        change: more shards extend the same prompt order), else ``cfg``, which is recorded."""
        path = run_dir / ROLLOUT_DIR / "config.json"
        if path.is_file():
            saved = json.loads(path.read_text())
            saved["temperatures"] = tuple(saved["temperatures"])
            counts = {f: getattr(cfg, f) for f in SHARD_COUNTS}
            return dataclasses.replace(cls(**{**dataclasses.asdict(cls()), **saved}), **counts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dataclasses.asdict(cfg)))
        return cfg


SHARD_COUNTS = ("shards", "answer_shards", "code_shards", "draft_shards")


def chat_prompts(tokenizer) -> Iterator[list[int]]:
    """The trainable part of ShareGPT: each conversation's first human turn as a chat prompt."""
    from saguaro.bench.datasets import sharegpt_prompts

    for p in sharegpt_prompts(heldout=False):
        yield tokenizer.encode_chat([{"role": "user", "content": p.text}])


def code_prompts(tokenizer) -> Iterator[list[int]]:
    """The standard library's training split cut after each function's signature (and
    docstring), with the code before it: the form of ``saguaro generate "def f(x):"``."""
    from saguaro.bench.datasets import function_prompts
    from saguaro.corpus import read_documents, split_files, stdlib_root

    for text in read_documents(split_files(stdlib_root()).train):
        for prompt in function_prompts(text):
            yield tokenizer.encode(prompt)


def training_prompts(tokenizer, cfg: RolloutConfig, count: int) -> list[list[int]]:
    """The first ``count`` prompts of the run: prompt ``k`` is code where ``floor((k + 1) f)``
    passes ``floor(k f)`` (``f = cfg.code_fraction``), else chat, each pool read in a seeded
    order and cycled. Prompt ``k`` depends on ``(seed, k)`` only, so more shards extend a run."""
    rng = random.Random(cfg.rollout_seed)
    pools = []
    for source in (chat_prompts, code_prompts):
        pool = [ids for ids in source(tokenizer) if len(ids) <= MAX_PROMPT_TOKENS]
        rng.shuffle(pool)
        pools.append(pool)
    f = cfg.code_fraction
    out, taken = [], [0, 0]
    for k in range(count):
        kind = int(math.floor((k + 1) * f) > math.floor(k * f))
        if not pools[kind]:
            raise ValueError(f"no {('chat', 'code')[kind]} prompts")
        out.append(pools[kind][taken[kind] % len(pools[kind])])
        taken[kind] += 1
    return out


def shard_path(run_dir: Path, index: int) -> Path:
    return run_dir / ROLLOUT_DIR / f"shard-{index:05d}.pt"


def answer_path(run_dir: Path, index: int, kind: str = "answers") -> Path:
    """Where scored shard ``index`` of ``kind`` (``answers``: ShareGPT's, ``code``: the
    standard library's) is written."""
    return run_dir / ROLLOUT_DIR / f"{kind}-{index:05d}.pt"


@dataclass
class Shard:
    """Rollouts of one batch: each sequence (prompt + output ids), its prompt's length, and at
    each output position the target's ``TOP_K`` likeliest tokens and their log-probabilities
    (temperature 1), the distribution the draft learns."""

    sequences: list[list[int]]
    prompt_lens: list[int]
    top_ids: list[torch.Tensor]  # [outputs, TOP_K] int32 per sequence
    top_logp: list[torch.Tensor]  # [outputs, TOP_K] float16 per sequence


def save_whole(obj: object, path: Path) -> None:
    """Write then rename: a kill mid-write leaves the previous file (or none), never half."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


def right_padded(
    seqs: list[list[int]], prompt_lens: list[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``seqs`` right-padded with 0, their attention mask, and the output positions: ``t``
    where token ``t + 1`` follows the prompt (what predicts an output token)."""
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    outputs = torch.zeros(len(seqs), width, dtype=torch.bool)
    for r, (s, n) in enumerate(zip(seqs, prompt_lens, strict=True)):
        ids[r, : len(s)] = torch.tensor(s)
        mask[r, : len(s)] = 1
        outputs[r, n - 1 : len(s) - 1] = True
    return ids, mask, outputs


@torch.no_grad()
def rollout_batch(
    model,
    prompts: list[list[int]],
    temps: list[float],
    cfg: RolloutConfig,
    stop: set[int],
    seed: int,
) -> Shard:
    """The target (a transformers ``*ForCausalLM``) continues every prompt at once: prompts
    left-padded, each row sampled at its own temperature (0: greedy) from a seeded generator,
    a row done after a stop token (kept) or ``cfg.new_tokens``."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    temp = torch.tensor(temps, device=device)[:, None]
    decoder = _Decoder.prefill(model, prompts, device)
    alive = torch.ones(len(prompts), dtype=torch.bool, device=device)
    stop_ids = torch.tensor(sorted(stop), dtype=torch.long, device=device)
    written = _Written()
    for _ in range(cfg.new_tokens):
        logp = decoder.next_logp()
        tok = _next_tokens(logp, temp, gen)
        written.add(tok, logp, alive)
        alive = alive & ~torch.isin(tok, stop_ids)
        if not alive.any():
            break
        decoder.advance(tok)
    return written.shard(prompts)


def _next_tokens(logp: torch.Tensor, temp: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Each row's next token from its log-probabilities ``logp`` [rows, vocab]: the Gumbel-max
    sample ``argmax(logp / T + g)`` at its temperature ``T`` (``temp`` [rows, 1], ``g`` drawn
    from ``gen``), or ``argmax(logp)`` where ``T`` is 0."""
    noise = -torch.empty_like(logp).exponential_(generator=gen).log()  # Gumbel
    sampled = (logp / temp.clamp(min=MIN_TEMPERATURE) + noise).argmax(-1)
    return torch.where(temp[:, 0] > 0, sampled, logp.argmax(-1))


@dataclass
class _Decoder:
    """A transformers model decoding left-padded rows with its KV cache: its last output
    ``out`` (logits and cache), the attention mask so far, each row's last position ``last``
    [rows, 1], and ``cache``, the name of the cache's argument and output field."""

    model: PreTrainedModel
    out: CausalLMOutputWithPast
    mask: torch.Tensor
    last: torch.Tensor
    cache: str

    @classmethod
    def prefill(
        cls, model: PreTrainedModel, prompts: list[list[int]], device: torch.device
    ) -> _Decoder:
        """The decoder after one forward over ``prompts``, left-padded with 0 and masked, each
        row's positions counted from its first token."""
        from saguaro.train.rollouts import cache_name

        rows, width = len(prompts), max(map(len, prompts))
        ids = torch.zeros(rows, width, dtype=torch.long)
        mask = torch.zeros(rows, width, dtype=torch.long)
        for r, p in enumerate(prompts):
            ids[r, width - len(p) :] = torch.tensor(p)
            mask[r, width - len(p) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        name = cache_name(model)
        out = model(
            input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1
        )
        return cls(model, out, mask, pos[:, -1:], name)

    def next_logp(self) -> torch.Tensor:
        """Each row's log-probabilities [rows, vocab] (fp32) of the token after its last."""
        return self.out.logits[:, -1].float().log_softmax(-1)

    def advance(self, tok: torch.Tensor) -> None:
        """Feed each row its next token ``tok`` [rows]."""
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], 1)
        self.last = self.last + 1
        self.out = self.model(
            input_ids=tok[:, None],
            attention_mask=self.mask,
            position_ids=self.last,
            use_cache=True,
            **{self.cache: getattr(self.out, self.cache)},
        )


@dataclass
class _Written:
    """What a batch of rollouts has written, one entry per step, on the CPU: each row's token,
    the target's ``TOP_K`` likeliest tokens and their log-probabilities where it chose it, and
    whether the row was still writing (a row's stop token is its last)."""

    tokens: list[torch.Tensor] = dataclasses.field(default_factory=list)
    top_ids: list[torch.Tensor] = dataclasses.field(default_factory=list)
    top_logp: list[torch.Tensor] = dataclasses.field(default_factory=list)
    alive: list[torch.Tensor] = dataclasses.field(default_factory=list)

    def add(self, tok: torch.Tensor, logp: torch.Tensor, alive: torch.Tensor) -> None:
        """Record one step: the tokens ``tok`` chosen from ``logp`` [rows, vocab]."""
        top = logp.topk(min(TOP_K, logp.shape[-1]), dim=-1)
        self.tokens.append(tok.cpu())
        self.top_ids.append(top.indices.int().cpu())
        self.top_logp.append(top.values.half().cpu())
        self.alive.append(alive.cpu())

    def shard(self, prompts: list[list[int]]) -> Shard:
        """The rows after ``prompts``, each cut after the steps it was writing at."""
        n = torch.stack(self.alive, 1).sum(1).tolist()
        toks, tids, tlp = (torch.stack(s, 1) for s in (self.tokens, self.top_ids, self.top_logp))
        return Shard(
            [p + toks[r, : n[r]].tolist() for r, p in enumerate(prompts)],
            [len(p) for p in prompts],
            [tids[r, : n[r]].clone() for r in range(len(prompts))],
            [tlp[r, : n[r]].clone() for r in range(len(prompts))],
        )


def generate_rollouts(
    model,
    prompts: list[list[int]],
    stop: set[int],
    run_dir: Path,
    cfg: RolloutConfig,
    minutes: float | None = None,
) -> int:
    """Write the shards ``0 .. cfg.shards - 1`` that are missing (:class:`Shard`; prompt ``k``
    in shard ``k // SHARD``, ``prompts`` cycled). Returns the shards on disk."""
    shards = cfg.shards
    (run_dir / ROLLOUT_DIR).mkdir(parents=True, exist_ok=True)
    prompts = [prompts[k % len(prompts)] for k in range(shards * SHARD)]
    deadline = None if minutes is None else time.monotonic() + 60 * minutes
    todo = [i for i in range(shards) if not shard_path(run_dir, i).is_file()]
    for i in tqdm(todo, desc="rollouts", unit="shard"):
        if deadline is not None and time.monotonic() > deadline:
            break
        batch = prompts[i * SHARD : (i + 1) * SHARD]
        temps = [cfg.temperatures[j % len(cfg.temperatures)] for j in range(len(batch))]
        shard = rollout_batch(model, batch, temps, cfg, stop, cfg.rollout_seed * SEED_STRIDE + i)
        save_whole(dataclasses.asdict(shard), shard_path(run_dir, i))
    return sum(shard_path(run_dir, i).is_file() for i in range(shards))


def answer_pairs(tokenizer, cfg: RolloutConfig) -> list[tuple[list[int], list[int]]]:
    """ShareGPT's trainable first exchanges as (chat prompt, reply ending the turn) ids, the
    reply cut at ``cfg.new_tokens``, in a seeded order."""
    from saguaro.bench.datasets import sharegpt_exchanges

    end = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    pairs = []
    for _, human, reply in sharegpt_exchanges(heldout=False):
        prompt = tokenizer.encode_chat([{"role": "user", "content": human}])
        if reply is not None and len(prompt) <= MAX_PROMPT_TOKENS:
            answer = tokenizer.encode(reply, add_special_tokens=False) + end
            pairs.append((prompt, answer[: cfg.new_tokens]))
    random.Random(cfg.rollout_seed).shuffle(pairs)
    return pairs


def code_pairs(tokenizer, cfg: RolloutConfig) -> list[tuple[list[int], list[int]]]:
    """The standard library's training functions as (prompt, body) ids: each file cut after a
    function's signature (and docstring) as :func:`code_prompts` cuts it, and the code that
    follows there, cut at ``cfg.new_tokens``; in a seeded order."""
    from saguaro.bench.datasets import FUNCTION_HEAD, code_before
    from saguaro.corpus import read_documents, split_files, stdlib_root

    pairs = []
    for text in read_documents(split_files(stdlib_root()).train):
        for m in FUNCTION_HEAD.finditer(text):
            prompt = tokenizer.encode(code_before(text, m.end()))
            end = m.end() + CODE_CHARS_PER_TOKEN * cfg.new_tokens
            body = tokenizer.encode(text[m.end() : end], add_special_tokens=False)
            body = body[: cfg.new_tokens]
            if body and len(prompt) <= MAX_PROMPT_TOKENS:
                pairs.append((prompt, body))
    random.Random(cfg.rollout_seed).shuffle(pairs)
    return pairs


def draft_pairs(
    draft_dir: Path, prompts: list[list[int]], cfg: RolloutConfig
) -> list[tuple[list[int], list[int]]]:
    """(prompt, continuation) ids where the draft in ``draft_dir`` writes the continuation
    itself, on saguaro's engine: prompt k at the rollouts' temperature for k, seeded by k, up to
    ``cfg.new_tokens``. Scored by the target, they teach the draft at the contexts its own
    proposals make (on-policy distillation); a continuation is the same tokens however the
    engine batches it."""
    from saguaro.api import LLM

    temps = cfg.temperatures
    params = [
        SamplingParams(
            temperature=temps[k % len(temps)],
            max_tokens=cfg.new_tokens,
            seed=cfg.rollout_seed * SEED_STRIDE + k,
        )
        for k in range(len(prompts))
    ]
    llm = LLM(model=str(draft_dir), mode="ar")
    try:
        outs = llm.generate(prompts, params, use_tqdm=True)
    finally:
        llm.close()
    return [(p, o.token_ids) for p, o in zip(prompts, outs, strict=True) if o.token_ids]


@torch.no_grad()
def score_batch(model, pairs: list[tuple[list[int], list[int]]], rows: int = 16) -> Shard:
    """The target's top tokens at each reply position of ``pairs`` (prompt + reply, as
    written), ``rows`` sequences per forward; a :class:`Shard` like a rollout's."""
    device = next(model.parameters()).device
    shard = Shard([], [], [], [])
    for b in range(0, len(pairs), rows):
        part = pairs[b : b + rows]
        seqs = [p + a for p, a in part]
        ids, _, at = right_padded(seqs, [len(p) for p, _ in part])  # causal: padding after
        hidden = model.model(input_ids=ids.to(device)).last_hidden_state[at.to(device)]
        logp = model.lm_head(hidden).float().log_softmax(-1)
        top = logp.topk(min(TOP_K, logp.shape[-1]), dim=-1)
        for (p, _), s, tid, tlp in zip(
            part,
            seqs,
            top.indices.int().cpu().split([len(a) for _, a in part]),
            top.values.half().cpu().split([len(a) for _, a in part]),
            strict=True,
        ):
            shard.sequences.append(s)
            shard.prompt_lens.append(len(p))
            shard.top_ids.append(tid.clone())
            shard.top_logp.append(tlp.clone())
    return shard


def score_answers(
    model,
    pairs,
    run_dir: Path,
    shards: int,
    minutes: float | None = None,
    kind: str = "answers",
) -> int:
    """Write the missing scored shards ``0 .. shards - 1`` of ``kind`` (pairs cycled);
    returns the number on disk."""
    deadline = None if minutes is None else time.monotonic() + 60 * minutes
    todo = [i for i in range(shards) if not answer_path(run_dir, i, kind).is_file()]
    for i in tqdm(todo, desc=kind, unit="shard"):
        if deadline is not None and time.monotonic() > deadline:
            break
        batch = [pairs[k % len(pairs)] for k in range(i * SHARD, (i + 1) * SHARD)]
        save_whole(dataclasses.asdict(score_batch(model, batch)), answer_path(run_dir, i, kind))
    return sum(answer_path(run_dir, i, kind).is_file() for i in range(shards))


def load_rollouts(run_dir: Path) -> Shard:
    """Every shard's rollouts (and scored answers) as one, in file order."""
    whole = Shard([], [], [], [])
    for path in sorted((run_dir / ROLLOUT_DIR).glob("*-*.pt")):
        shard = torch.load(path)
        for f in dataclasses.fields(Shard):
            getattr(whole, f.name).extend(shard[f.name])
    if not whole.sequences:
        raise FileNotFoundError(f"{run_dir / ROLLOUT_DIR}: no rollouts (run the rollout stage)")
    return whole
