"""Distilling a draft from its target on the target's own outputs: resumable, one loss.

Speculation accepts a proposal x ~ q with probability min(1, p(x)/q(x)), so a draft position
is accepted with probability sum_x min(p(x), q(x)) = 1 - TV(p, q) (the "acceptance proxy"
logged below). The draft is trained towards p by the cross-entropy against the target's whole
distribution restricted to the head's tokens S,

    L = -(1 / |P|) sum_{t in P} sum_{x in S} p_t(x) log q_t(x),

over P, the positions where the target wrote its output (prompt tokens are context, not
targets). For x in S this is KL(p || q) up to the target's entropy, which does not depend on
the draft; mass p puts outside S is mass no draft with this head can propose, so it carries no
gradient. p is the target's raw distribution (temperature 1): the draft's logits are divided by
the same temperature as the target's when served, so matching at 1 matches at every T up to
how the two sharpen.

p is read from the rollouts, which keep the target's ``TOP_K`` likeliest tokens at each output
position (``saguaro.train.draft_data``), so training runs the draft only; the draft trains in
float32. Batches are a pure function of ``(seed, step)`` (:func:`batches`), so a resumed run
takes the same batches from its step on.
"""

from __future__ import annotations

import dataclasses
import math
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from saguaro.options import opt
from saguaro.train.draft_data import load_rollouts, right_padded, save_whole
from saguaro.train.draft_model import Draft, cut_draft, head_ids, load_draft
from saguaro.train.trainer import lr_lambda

CKPT = "draft-checkpoint.pt"
# Sequences sorted by length together before batching: little padding, and still shuffled.
LENGTH_WINDOW = 64
# Steps between entries of the loss curve kept in the checkpoint and training.json, and the
# steps each entry averages.
HISTORY_EVERY = 50
# AdamW's settings for the draft; the learning rate falls by a cosine to MIN_LR_RATIO of its peak.
WEIGHT_DECAY = 0.01
ADAM_BETAS = (0.9, 0.95)
MIN_LR_RATIO = 0.1


def layer_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


@dataclass(frozen=True)
class DistillConfig:
    layers: tuple[int, ...] = opt(
        (0, 1, 2, 3),
        "target layers the draft starts from, in order (comma-separated)",
        parse=layer_list,
        metavar="I,J,...",
    )
    head_tokens: int = opt(8192, "the head's tokens (the target's of most expected output mass)")
    epochs: float = opt(1.0, "passes over the rollouts")
    batch_tokens: int = opt(2048, "tokens per step (sequences of similar length batched)")
    lr: float = opt(1e-3, "peak learning rate (AdamW, cosine to a tenth)")
    warmup_steps: int = opt(20, "linear warmup steps")
    seed: int = opt(0, "batch order")
    init: str = opt(
        "",
        "a draft directory (train-draft's output) to continue from: its layers, norm and head "
        "replace --layers and --head-tokens (empty: cut from the target)",
    )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def batches(lengths: list[int], budget: int, seed: int, epochs: float) -> list[list[int]]:
    """Sequence indices per step: each epoch shuffles, sorts within windows of
    ``LENGTH_WINDOW`` by length and fills batches up to ``budget`` padded tokens; batch order
    shuffled. A fractional last epoch is that share of its batches."""
    rng = random.Random(seed)
    out: list[list[int]] = []
    for _ in range(math.ceil(epochs)):
        order = list(range(len(lengths)))
        rng.shuffle(order)
        epoch: list[list[int]] = []
        for w in range(0, len(order), LENGTH_WINDOW):
            window = sorted(order[w : w + LENGTH_WINDOW], key=lengths.__getitem__)
            cur: list[int] = []
            for i in window:
                if cur and (len(cur) + 1) * max(lengths[j] for j in (*cur, i)) > budget:
                    epoch.append(cur)
                    cur = []
                cur.append(i)
            epoch.append(cur)
        rng.shuffle(epoch)
        out += epoch
    return out[: max(1, round(len(out) * epochs / math.ceil(epochs)))]


def distill_loss(
    p_head: torch.Tensor, draft_logits: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """L above for rows ``p_head`` (the target's probabilities of the head's tokens) against
    the draft's head logits; with the acceptance proxy and top-1 agreement on the head."""
    logq = F.log_softmax(draft_logits.float(), dim=-1)
    loss = -(p_head * logq).sum(-1).mean()
    with torch.no_grad():
        q = logq.exp()
        stats = {
            "accept": torch.minimum(p_head, q).sum(-1).mean().item(),
            "top1": (p_head.argmax(-1) == q.argmax(-1)).float().mean().item(),
            "in_head": p_head.sum(-1).mean().item(),
        }
    return loss, stats


def draft_optimizer(draft: Draft, lr: float) -> torch.optim.AdamW:
    """AdamW over the draft's trainable parameters, matrices decayed and the rest (norms) not."""
    params = [p for p in draft.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": rest, "weight_decay": 0.0}],
        lr=lr,
        betas=ADAM_BETAS,
    )


class Distiller:
    """The target (frozen), the draft, its optimizer and schedule, and the checkpoint."""

    def __init__(
        self,
        target_dir: Path,
        run_dir: Path,
        cfg: DistillConfig,
        device: str,
        rollouts: Path | None = None,
    ) -> None:
        """The checkpoint in ``run_dir`` (which wins over ``cfg``) or a new draft (cut from the
        target, or ``cfg.init`` read back); the rollouts of ``rollouts`` (default ``run_dir``)."""
        self.run_dir, self.device = run_dir, torch.device(device)
        ckpt = run_dir / CKPT
        state = torch.load(ckpt, weights_only=False) if ckpt.is_file() else None
        if state is not None:  # a resumed run keeps its own settings
            cfg = DistillConfig(**{**state["config"], "layers": tuple(state["config"]["layers"])})
        self.cfg = cfg
        self.data = load_rollouts(rollouts or run_dir)
        self.draft, vocab = self._new_draft(target_dir, state)
        ids = self.draft.head_ids.tolist()
        # token id -> its row in the draft's head, -1 outside it
        self.head_row = torch.full((vocab,), -1, dtype=torch.long)
        self.head_row[torch.tensor(ids)] = torch.arange(len(ids))
        self.plan = batches(
            [len(s) for s in self.data.sequences], cfg.batch_tokens, cfg.seed, cfg.epochs
        )
        self.opt = draft_optimizer(self.draft, cfg.lr)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lr_lambda(cfg.warmup_steps, len(self.plan), MIN_LR_RATIO)
        )
        self.step, self.tokens, self.history = 0, 0, []
        if state is not None:
            self.draft.load_state_dict(state["draft"])
            self.opt.load_state_dict(state["opt"])
            self.sched.load_state_dict(state["sched"])
            self.step, self.tokens, self.history = state["step"], state["tokens"], state["history"]

    def _new_draft(self, target_dir: Path, state: dict[str, Any] | None) -> tuple[Draft, int]:
        """The draft before any checkpoint is loaded over it, on the device, and the target's
        vocabulary size: ``cfg.init`` read back, else cut from the target with the head of a
        resumed run's checkpoint (``state``) or of the rollouts' likeliest tokens."""
        import transformers

        cfg = self.cfg
        target = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
        vocab = target.config.vocab_size
        if cfg.init:  # a resumed run rebuilds the same shape, then loads its checkpoint over it
            return load_draft(target, Path(cfg.init)).to(self.device), vocab
        ids = (
            state["head_ids"]
            if state is not None
            else head_ids(self.data.top_ids, self.data.top_logp, cfg.head_tokens, vocab)
        )
        return cut_draft(target, cfg.layers, ids).to(self.device), vocab

    @property
    def done(self) -> bool:
        return self.step >= len(self.plan)

    def save(self) -> None:
        """The checkpoint, replacing the previous one only once it is whole."""
        state = {
            "config": self.cfg.to_dict(),
            "head_ids": self.draft.head_ids.tolist(),
            "draft": self.draft.state_dict(),
            "opt": self.opt.state_dict(),
            "sched": self.sched.state_dict(),
            "step": self.step,
            "tokens": self.tokens,
            "history": self.history,
        }
        save_whole(state, self.run_dir / CKPT)

    def batch(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        """Right-padded ids, their attention mask, the loss positions (``t`` where token
        ``t + 1`` is the target's output), and there the target's p over the head's tokens."""
        data = self.data
        ids, mask, loss_at = right_padded(
            [data.sequences[i] for i in indices], [data.prompt_lens[i] for i in indices]
        )
        # Row-major like hidden[loss_at]: each sequence's output positions in order.
        rows = self.head_row[torch.cat([data.top_ids[i] for i in indices]).long()]
        p = torch.cat([data.top_logp[i] for i in indices]).float().exp()
        p_head = torch.zeros(rows.shape[0], self.draft.head_ids.numel() + 1)
        p_head.scatter_add_(1, rows.where(rows >= 0, p_head.shape[1] - 1), p)
        dev = self.device
        return ids.to(dev), mask.to(dev), loss_at.to(dev), p_head[:, :-1].to(dev)

    def train_step(self) -> dict[str, float]:
        ids, mask, loss_at, p_head = self.batch(self.plan[self.step])
        self.draft.train()
        draft_logits = self.draft.lm_head(self.draft(ids, mask)[loss_at])
        loss, stats = distill_loss(p_head, draft_logits)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.draft.parameters(), 1.0)
        self.opt.step()
        self.sched.step()
        self.step += 1
        self.tokens += int(loss_at.sum())
        return {"loss": loss.item(), **stats}

    def fit(self, minutes: float | None = None, ckpt_minutes: float = 5.0) -> dict[str, float]:
        """Train to the end of the plan (or for ``minutes``), checkpointing every
        ``ckpt_minutes`` and on SIGTERM; the last steps' mean statistics."""
        stop: list[bool] = []
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
        start = last_save = time.monotonic()
        recent: list[dict[str, float]] = []
        bar = tqdm(total=len(self.plan), initial=self.step, desc="distil", unit="step")
        try:
            while not self.done and not stop:
                if minutes is not None and time.monotonic() - start > 60 * minutes:
                    break
                recent = [*recent[1 - HISTORY_EVERY :], self.train_step()]
                bar.update(1)
                bar.set_postfix({k: f"{v:.3f}" for k, v in recent[-1].items()})
                if self.step % HISTORY_EVERY == 0:
                    self.history.append({"step": self.step, **mean_stats(recent)})
                if time.monotonic() - last_save > 60 * ckpt_minutes:
                    self.save()
                    last_save = time.monotonic()
        finally:
            bar.close()
            self.save()
            signal.signal(signal.SIGTERM, previous)
        return mean_stats(recent)


def mean_stats(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]} if rows else {}
