"""Resumable co-training of the target (LM loss) and the draft (distillation from the target).

Phase 1 (`tokens`): each step the target takes its LM step and the draft a distillation step on
the same batch, against the target's detached logits from that same forward. Phase 2
(`draft_tokens`): the target is finished; only the draft keeps learning from it.

With `rollouts > 0`, each step the target also decodes that many greedy continuations of
training prefixes (`saguaro/train/rollouts.py`): in phase 1 it adds `unlikelihood` x the
sequence-level unlikelihood of their repeated n-grams to its loss, and in both phases the draft
also distils on them (on-policy; `rollout_ce` adds CE on the target's greedy tokens). With
`ditto > 0` the target's phase-1 loss adds that weight x the pseudo-repetition loss of
`saguaro/train/loops.py`. With `draft_mix > 0` the target's phase-1 text labels mix in the draft's
distribution (`mixed_label_loss`), pulling the target towards what the draft can predict. Token
budgets count training-text tokens only.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from tqdm import tqdm

from saguaro.corpus import EOT
from saguaro.train.data import WindowSampler, load_tokens
from saguaro.train.loops import ditto_loss, pseudo_repeats
from saguaro.train.models import DRAFT, TARGET, ModelSpec, build_model
from saguaro.train.rollouts import greedy_rollouts, repeat_mask, unlikelihood_loss

CKPT_NAME = "checkpoint.pt"


@dataclass
class FitConfig:
    target: ModelSpec = TARGET
    draft: ModelSpec = DRAFT
    ctx: int = 512
    batch: int = 8
    tokens: int = 6_000_000  # phase 1 budget; the target's schedule spans it
    draft_tokens: int = 500_000  # phase 2 budget; the draft's schedule spans both phases
    lr_target: float = 2e-3
    lr_draft: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    ce_weight: float = 0.0  # optional CE term added to the draft's KL
    rollouts: int = 0  # greedy continuations by the target per step (0: none)
    rollout_prefix: int = 32  # training-text prefix of each rollout and each DITTO row
    rollout_tokens: int = 96
    unlikelihood: float = 0.0  # weight of the target's unlikelihood term on them (phase 1)
    rollout_ce: float = 0.0  # CE term on the target's greedy tokens in the draft's rollout loss
    ditto: float = 0.0  # weight of the target's pseudo-repetition loss (phase 1; 0: none)
    ditto_lambda: float = 0.5  # each repeat trained towards this fraction of the one before
    draft_mix: float = 0.0  # weight of the draft's distribution in the target's labels (phase 1)
    seed: int = 0
    # A run may continue an earlier export (fresh optimizers and schedules); the tokens that
    # export had seen are carried so the model card counts the whole training.
    init_from: str | None = None
    prior_target_tokens: int = 0
    prior_draft_tokens: int = 0
    prior_fits: list[str] = dataclasses.field(default_factory=list)  # earlier stages' `fit` args

    @property
    def tokens_per_step(self) -> int:
        return self.ctx * self.batch

    @property
    def cotrain_steps(self) -> int:
        return self.tokens // self.tokens_per_step

    @property
    def total_steps(self) -> int:
        return self.cotrain_steps + self.draft_tokens // self.tokens_per_step

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FitConfig:
        d = dict(d)
        legacy = d.pop("prior_fit", None)  # one earlier stage, as configs before prior_fits said
        if legacy:
            d.setdefault("prior_fits", [legacy])
        d["target"] = ModelSpec(**d["target"])
        d["draft"] = ModelSpec(**d["draft"])
        return cls(**d)


# The settings a `fit` command line sets, with their help. The CLI builds its options and the
# config from this, and a card's reproduce command names the ones that differ from the default.
FIT_OPTIONS: dict[str, str] = {
    "batch": "rows per step",
    "ctx": "tokens per row",
    "seed": "initialisation and every data stream (text, rollout prefixes, DITTO rows)",
    "lr_target": "the target's peak learning rate",
    "lr_draft": "the draft's peak learning rate",
    "warmup_steps": "linear warmup before the cosine decay",
    "rollouts": "target's own continuations per step",
    "unlikelihood": "weight of the unlikelihood of repeats in the target's continuations",
    "rollout_ce": "weight of the draft's CE on the target's greedy tokens in its continuations",
    "ditto": "weight of the target's pseudo-repetition (DITTO) loss against loops",
    "ditto_lambda": "each repeat's probability is trained towards this fraction of the one before",
    "draft_mix": "weight of the draft's distribution mixed into the target's text labels",
}


def lr_lambda(warmup: int, total: int, min_ratio: float):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def _optimizer(model: torch.nn.Module, lr: float, wd: float) -> torch.optim.AdamW:
    # No decay on norms (1-d); the tied embedding is decayed like any matrix.
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def distill_loss(
    draft_logits: torch.Tensor, target_logits: torch.Tensor, labels: torch.Tensor, ce_weight: float
) -> torch.Tensor:
    """KL(target || draft) per token, optionally plus the draft's own LM loss."""
    vocab = draft_logits.size(-1)
    logp_d = F.log_softmax(draft_logits.reshape(-1, vocab).float(), dim=-1)
    logp_t = F.log_softmax(target_logits.reshape(-1, vocab).float(), dim=-1)
    loss = F.kl_div(logp_d, logp_t, log_target=True, reduction="batchmean")
    if ce_weight:
        loss = loss + ce_weight * F.nll_loss(logp_d, labels.reshape(-1))
    return loss


def mixed_label_loss(
    target_logits: torch.Tensor, labels: torch.Tensor, draft_logits: torch.Tensor, weight: float
) -> torch.Tensor:
    """The target's text loss with the draft's distribution mixed into its labels:

        L = CE(y, p_t) + w * H(p_d, p_t) = (1 + w) * H(m, p_t),
        m = (onehot(y) + w * p_d) / (1 + w),

    with ``p_d`` detached. Per context it is minimised by ``p_t = (p_data + w * p_d) / (1 + w)``,
    so the target's greedy token becomes ``argmax(p_data + w * p_d)``: the draft's favourite
    wins only where the data leave the target's own choices within reach of it, which is where
    greedy speculation loses its acceptance. The held-out cost is at most ``log(1 + w)`` nats,
    and less wherever the draft already agrees with the data.
    """
    vocab = target_logits.size(-1)
    logp_t = F.log_softmax(target_logits.reshape(-1, vocab).float(), dim=-1)
    p_d = F.softmax(draft_logits.detach().reshape(-1, vocab).float(), dim=-1)
    soft = -(p_d * logp_t).sum(-1).mean()
    return F.nll_loss(logp_t, labels.reshape(-1)) + weight * soft


def _text_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of `logits` [..., vocab] against `labels`, in fp32."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1))


def _descend(
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    model: torch.nn.Module,
    loss: torch.Tensor,
    grad_clip: float,
) -> None:
    """One step of `opt` down `loss`'s gradient, its norm clipped to `grad_clip`, then one
    step of the learning-rate schedule."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    sched.step()


@dataclass
class _Rollouts:
    """This step's greedy continuations by the target, `ids` [rollouts, prefix + new tokens]
    (the training prefix included), and `repeats`, true at their tokens in a repeated n-gram
    (`repeat_mask`)."""

    ids: torch.Tensor
    repeats: torch.Tensor


@dataclass
class _TargetPass:
    """The target's forwards of one step: its `logits` on the text batch, their CE
    (`text_loss`), the `loss` it descends in phase 1, and its detached logits on the rollouts
    (`roll_logits`; None without rollouts)."""

    logits: torch.Tensor
    text_loss: torch.Tensor
    loss: torch.Tensor
    roll_logits: torch.Tensor | None


def init_from_export(src: Path, tok: Tokenizer, models: dict[str, torch.nn.Module]) -> None:
    """Load the weights in `src/<role>` (one file or shards) into each model; the tokenizers
    must be identical."""
    from saguaro.models.loader import iter_tensors, safetensors_files

    for role, model in models.items():
        d = src / role
        theirs = Tokenizer.from_file(str(d / "tokenizer.json"))
        if theirs.get_vocab() != tok.get_vocab():
            raise ValueError(f"{d}: its tokenizer differs from this run's; cannot continue it")
        weights = dict(iter_tensors(safetensors_files(d)))
        missing, unexpected = model.load_state_dict(weights, strict=False)
        # The tied head is stored once, as the embedding.
        if unexpected or set(missing) - {"lm_head.weight"}:
            raise ValueError(f"{d}: weights do not fit this run's {role} shape")


class Trainer:
    """Owns both models, their optimizers and schedules, and the checkpoint in `run_dir`."""

    def __init__(
        self,
        run_dir: Path,
        cfg: FitConfig,
        device: str = "cpu",
        budget: dict[str, int] | None = None,
    ) -> None:
        """`cfg` starts a new run; a checkpoint's own config wins, except for `budget`
        (`tokens` / `draft_tokens`), which may be re-planned on resume: the cosine then
        continues from the same step over the new total."""
        self.run_dir, self.device = run_dir, torch.device(device)
        ckpt_path = run_dir / CKPT_NAME
        state = torch.load(ckpt_path, weights_only=False) if ckpt_path.exists() else None
        # Earlier plans of a re-planned run, so its card can say how the schedule really went.
        self.replans: list[dict[str, int]] = []
        if state is not None:
            cfg = FitConfig.from_dict(state["config"])
            self.replans = state.get("replans", [])
            planned = {k: getattr(cfg, k) for k in (budget or {})}
            if planned != (budget or {}):
                self.replans = [*self.replans, {"step": state["step"], **planned}]
        self.cfg = cfg = dataclasses.replace(cfg, **(budget or {}))
        tok = Tokenizer.from_file(str(run_dir / "tokenizer.json"))
        self.vocab_size, self.eot_id = tok.get_vocab_size(), tok.token_to_id(EOT)
        self.tokens = tokens = load_tokens(run_dir / "train.bin")
        self.sampler = WindowSampler(tokens, cfg.ctx, cfg.batch, cfg.seed)
        # Its own seed stream, so adding rollouts leaves the text batches as they were.
        self.prefixes = (
            WindowSampler(tokens, cfg.rollout_prefix, cfg.rollouts, cfg.seed + 1)
            if cfg.rollouts
            else None
        )

        torch.manual_seed(cfg.seed)
        self.target = build_model(cfg.target, self.vocab_size, self.eot_id).to(self.device)
        self.draft = build_model(cfg.draft, self.vocab_size, self.eot_id).to(self.device)
        self.opt_t = _optimizer(self.target, cfg.lr_target, cfg.weight_decay)
        self.opt_d = _optimizer(self.draft, cfg.lr_draft, cfg.weight_decay)
        self.sched_t = torch.optim.lr_scheduler.LambdaLR(
            self.opt_t, lr_lambda(cfg.warmup_steps, cfg.cotrain_steps, cfg.min_lr_ratio)
        )
        self.sched_d = torch.optim.lr_scheduler.LambdaLR(
            self.opt_d, lr_lambda(cfg.warmup_steps, cfg.total_steps, cfg.min_lr_ratio)
        )
        self.step = 0
        if state is not None:
            self._load(state)
        elif cfg.init_from is not None:
            init_from_export(Path(cfg.init_from), tok, {"target": self.target, "draft": self.draft})

    # -- checkpoints ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "config": self.cfg.to_dict(),
            "step": self.step,
            "target": self.target.state_dict(),
            "draft": self.draft.state_dict(),
            "opt_t": self.opt_t.state_dict(),
            "opt_d": self.opt_d.state_dict(),
            "sched_t": self.sched_t.state_dict(),
            "sched_d": self.sched_d.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "replans": self.replans,
        }

    def _load(self, state: dict[str, Any]) -> None:
        self.target.load_state_dict(state["target"])
        self.draft.load_state_dict(state["draft"])
        self.opt_t.load_state_dict(state["opt_t"])
        self.opt_d.load_state_dict(state["opt_d"])
        self.sched_t.load_state_dict(state["sched_t"])
        self.sched_d.load_state_dict(state["sched_d"])
        torch.set_rng_state(state["torch_rng"])
        self.step = state["step"]

    def save(self) -> Path:
        """Write then rename, so a kill mid-save leaves the previous checkpoint intact."""
        path = self.run_dir / CKPT_NAME
        tmp = path.with_suffix(".tmp")
        torch.save(self.state_dict(), tmp)
        os.replace(tmp, path)
        return path

    # -- training ------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.step >= self.cfg.total_steps

    def train_step(self) -> dict[str, float]:
        """One step on this step's batch: the target's update (phase 1 only), then the
        draft's. Returns `loss_t` (the target's text CE), `kl_d` (the draft's whole loss),
        `loss_d` (the draft's text CE, before its update) and the enabled terms' metrics."""
        cfg = self.cfg
        x, y = (t.to(self.device) for t in self.sampler.batch_at(self.step))
        cotrain = self.step < cfg.cotrain_steps
        metrics: dict[str, float] = {}
        roll = self._rollouts(metrics)
        # The draft reads the batch first: its logits (detached) may enter the target's labels,
        # and its own update below comes after the target's, from the same forward.
        self.draft.train()
        logits_d = self.draft(input_ids=x).logits
        target = self._target_pass(x, y, logits_d, roll, cotrain, metrics)
        if cotrain:
            _descend(self.opt_t, self.sched_t, self.target, target.loss, cfg.grad_clip)
        loss_d = self._draft_loss(logits_d, y, target, roll, metrics)
        _descend(self.opt_d, self.sched_d, self.draft, loss_d, cfg.grad_clip)
        with torch.no_grad():
            ce_d = _text_ce(logits_d, y)
        self.step += 1
        return {
            "loss_t": target.text_loss.item(),
            "kl_d": loss_d.item(),
            "loss_d": ce_d.item(),
            **metrics,
        }

    def _rollouts(self, metrics: dict[str, float]) -> _Rollouts | None:
        """The target's greedy continuations of this step's prefixes (None without
        `rollouts`); records `rep`, the share of their new tokens in a repeated n-gram."""
        if self.prefixes is None:
            return None
        cfg = self.cfg
        prefixes = self.prefixes.batch_at(self.step)[0].to(self.device)
        ids = greedy_rollouts(self.target, prefixes, cfg.rollout_tokens)
        repeats = repeat_mask(ids, cfg.rollout_prefix)
        metrics["rep"] = repeats[:, cfg.rollout_prefix :].float().mean().item()
        return _Rollouts(ids, repeats)

    def _target_pass(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        logits_d: torch.Tensor,
        roll: _Rollouts | None,
        cotrain: bool,
        metrics: dict[str, float],
    ) -> _TargetPass:
        """The target's forwards of this step, with gradients in phase 1 (`cotrain`), where
        its loss is the text CE (or `mixed_label_loss`) + `unlikelihood` x the rollouts'
        unlikelihood + `ditto` x the pseudo-repetition loss, each where enabled."""
        cfg = self.cfg
        self.target.train(cotrain)
        roll_logits = None
        with torch.set_grad_enabled(cotrain):
            logits = self.target(input_ids=x).logits
            text_loss = _text_ce(logits, y)
            loss = text_loss
            if cotrain and cfg.draft_mix:
                loss = mixed_label_loss(logits, y, logits_d, cfg.draft_mix)
                metrics["mix"] = loss.item()
            if roll is not None:
                with torch.set_grad_enabled(cotrain and bool(cfg.unlikelihood)):
                    roll_logits = self.target(input_ids=roll.ids).logits
                if cotrain and cfg.unlikelihood:
                    ul = unlikelihood_loss(roll_logits, roll.ids, roll.repeats, cfg.rollout_prefix)
                    loss = loss + cfg.unlikelihood * ul
                    metrics["ul"] = ul.item()
                roll_logits = roll_logits.detach()
            if cotrain and cfg.ditto:
                rep = self._ditto_loss()
                loss = loss + cfg.ditto * rep
                metrics["ditto"] = rep.item()
        return _TargetPass(logits, text_loss, loss, roll_logits)

    def _ditto_loss(self) -> torch.Tensor:
        """The target's pseudo-repetition loss (`ditto_loss`) on this step's DITTO rows."""
        cfg = self.cfg
        # Its own seed stream, like the rollouts' prefixes.
        seq, periods = pseudo_repeats(
            self.tokens, self.step, cfg.batch, cfg.rollout_prefix, cfg.seed + 2
        )
        seq = seq.to(self.device)
        logits = self.target(input_ids=seq).logits
        return ditto_loss(logits, seq, periods, cfg.rollout_prefix, cfg.ditto_lambda)

    def _draft_loss(
        self,
        logits_d: torch.Tensor,
        y: torch.Tensor,
        target: _TargetPass,
        roll: _Rollouts | None,
        metrics: dict[str, float],
    ) -> torch.Tensor:
        """The draft's loss: `distill_loss` to the target's logits of the same text batch,
        plus, with rollouts, to its logits on their continuations (recorded as `kl_text` and
        `kl_roll`)."""
        cfg = self.cfg
        loss = distill_loss(logits_d, target.logits.detach(), y, cfg.ce_weight)
        if roll is None or target.roll_logits is None:
            return loss
        # On-policy: the positions that predict the continuation, the target's own text.
        own = slice(cfg.rollout_prefix - 1, -1)
        roll_logits_d = self.draft(input_ids=roll.ids).logits
        labels = roll.ids[:, cfg.rollout_prefix :]
        # The continuation is the target's argmax at each position, so the CE term teaches
        # exactly what greedy acceptance checks: the draft's argmax equal to the target's.
        kl_roll = distill_loss(
            roll_logits_d[:, own], target.roll_logits[:, own], labels, cfg.rollout_ce
        )
        metrics["kl_text"] = loss.item()
        metrics["kl_roll"] = kl_roll.item()
        return loss + kl_roll

    def fit(
        self,
        minutes: float | None = None,
        ckpt_minutes: float = 10.0,
        log_every: float = 30.0,
        stop_at: int | None = None,
    ) -> dict[str, float]:
        """Train until the plan is done, `minutes` pass or step `stop_at` is reached; checkpoint
        on the way and at the end."""
        stop: list[bool] = []
        # SIGTERM (kill PID) saves before exiting, so a run can be re-planned losing nothing.
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
        start = last_ckpt = time.monotonic()
        deadline = start + minutes * 60 if minutes is not None else math.inf
        ema: dict[str, float] = {}
        bar = tqdm(
            total=self.cfg.total_steps, initial=self.step, unit="step", mininterval=log_every
        )
        tokens_done, t0 = 0, time.monotonic()
        last_step = self.cfg.total_steps if stop_at is None else stop_at
        while self.step < last_step and not self.done and not stop and time.monotonic() < deadline:
            metrics = self.train_step()
            tokens_done += self.cfg.tokens_per_step
            ema = {k: v if k not in ema else 0.95 * ema[k] + 0.05 * v for k, v in metrics.items()}
            bar.set_postfix(
                phase=1 if self.step <= self.cfg.cotrain_steps else 2,
                **{k: f"{v:.3f}" for k, v in ema.items()},
                tok_s=f"{tokens_done / (time.monotonic() - t0):.0f}",
                refresh=False,
            )
            bar.update()
            if time.monotonic() - last_ckpt >= ckpt_minutes * 60:
                self.save()
                last_ckpt = time.monotonic()
                bar.write(f"checkpoint at step {self.step}: {ema}")
        bar.close()
        self.save()
        signal.signal(signal.SIGTERM, previous)
        return ema
