"""Drafts that read the target's hidden state, against the shipped draft, on held-out text.

    python docs/bench/draft/feature_drafts.py heldout WORK
    python docs/bench/draft/feature_drafts.py features WORK RUN_DIR
    python docs/bench/draft/feature_drafts.py train-eagle WORK RUN_DIR OUT.pt \\
        [--epochs 1] [--depths 3]
    python docs/bench/draft/feature_drafts.py train-added WORK RUN_DIR OUT.pt \\
        [--epochs 0.6] [--lr 1e-4]
    python docs/bench/draft/feature_drafts.py eval WORK [--eagle OUT.pt] [--added OUT.pt]

``heldout`` writes the target's greedy continuations (128 tokens) of 64 ShareGPT and 64
HumanEval prompts of the bench (held out of every draft's training); ``features`` the target's
final residual stream (the input of its last norm, f_p at position p) at every position of
those and of a ``train-draft`` run's shards. Two drafts use it:

- **eagle**: one decoder layer (started as the target's last) reads at position p the token
  x_{p+1} and f_p, each RMS-normalised, through a linear map, and predicts x_{p+2} over the
  shipped draft's head tokens. Depth s > 1 reads its own depth s - 1 output in place of f;
  training unrolls ``--depths`` depths, each attending depth-1 keys up to p - s + 1 and the
  deeper ones on the diagonals in between, as serving would.
- **added**: the shipped draft, frozen, with W f_{p-1} (W zero at the start) added to the input
  of the row that proposes first; later depths and the context stay as they are.

``eval`` counts, at every committed position of the held-out greedy text, the draft tokens a
greedy K = 4 chain would have had accepted (teacher forcing equals SD's chain while it matches)
and the acceptance proxy sum min(p, q) over the head. Training reads the run's shards as
``train-draft`` wrote them (the target's top-64 distribution at each output position).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from saguaro.bundled import SMOLLM2_DRAFT_DIR
from saguaro.train.distill import batches

DRAFT = SMOLLM2_DRAFT_DIR
D, HEADS, KV_HEADS, HEAD_DIM, THETA, EPS = 576, 9, 3, 64, 1e5, 1e-5
FEAT_RMS = 34.0  # median RMS of SmolLM2-135M's final residual per token: the inputs' scale
K = 4  # the chain length evaluated
BATCH_TOKENS = 2048
FEATURE_ROWS = 16  # sequences per target forward when extracting features
LAYER_KEYS = {
    "ln1": "input_layernorm.weight",
    "ln2": "post_attention_layernorm.weight",
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight",
    "wg": "mlp.gate_proj.weight",
    "wu": "mlp.up_proj.weight",
    "wd": "mlp.down_proj.weight",
}


def target_dir() -> Path:
    from saguaro.models.catalog import resolve_model

    return resolve_model("smollm2-135m-instruct")


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    inv = 1.0 / (THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM))
    f = pos[:, None].float() * inv[None]
    f = torch.cat([f, f], -1)
    half = HEAD_DIM // 2
    return x * f.cos() + torch.cat([-x[..., half:], x[..., :half]], -1) * f.sin()


class Layer(nn.Module):
    """A Llama decoder layer, written out so that attention can take extra keys."""

    def __init__(self, weights: dict[str, torch.Tensor], prefix: str, train: bool) -> None:
        super().__init__()
        for name, key in LAYER_KEYS.items():
            w = weights[prefix + key].float().clone()
            setattr(self, name, nn.Parameter(w, requires_grad=train))

    def qkv(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, n, _ = x.shape
        h = rms(x, self.ln1)
        q = rope((h @ self.wq.T).view(b, n, HEADS, HEAD_DIM).transpose(1, 2), pos)
        k = rope((h @ self.wk.T).view(b, n, KV_HEADS, HEAD_DIM).transpose(1, 2), pos)
        v = (h @ self.wv.T).view(b, n, KV_HEADS, HEAD_DIM).transpose(1, 2)
        rep = HEADS // KV_HEADS
        return q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        x = x + attn.transpose(1, 2).reshape(b, n, D) @ self.wo.T
        h = rms(x, self.ln2)
        return x + (F.silu(h @ self.wg.T) * (h @ self.wu.T)) @ self.wd.T


def attend(
    q: torch.Tensor,
    ctx: tuple[torch.Tensor, torch.Tensor],
    allowed: torch.Tensor,
    diagonals: list[tuple[torch.Tensor, torch.Tensor, int]],
) -> torch.Tensor:
    """Softmax attention of ``q`` over the context keys where ``allowed`` and, for each
    (k, v, shift) of ``diagonals``, the one key at position p - shift (none where p < shift)."""
    scale = HEAD_DIM**-0.5
    k, v = ctx
    n = q.shape[2]
    scores = [(q @ k.transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf"))]
    for dk, _, shift in diagonals:
        e = (q * F.pad(dk, (0, 0, shift, 0))[:, :, :n]).sum(-1, keepdim=True) * scale
        e[:, :, :shift] = float("-inf")
        scores.append(e)
    p = torch.softmax(torch.cat(scores, -1).float(), -1).nan_to_num(0.0).to(v.dtype)
    out = p[..., :n] @ v
    for i, (_, dv, shift) in enumerate(diagonals):
        out = out + p[..., n + i : n + i + 1] * F.pad(dv, (0, 0, shift, 0))[:, :, :n]
    return out


def head_rows() -> tuple[torch.Tensor, torch.Tensor]:
    """The shipped draft's head token ids, and each vocabulary id's row in it (-1: none)."""
    ids = load_file(DRAFT / "model.safetensors")["lm_head.token_ids"].long()
    vocab = json.loads((DRAFT / "config.json").read_text())["vocab_size"]
    row = torch.full((vocab,), -1, dtype=torch.long)
    row[ids] = torch.arange(len(ids))
    return ids, row


class Eagle(nn.Module):
    def __init__(self, target: dict[str, torch.Tensor], head_ids: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("emb", target["model.embed_tokens.weight"].float())
        last = max(int(k.split(".")[2]) for k in target if k.startswith("model.layers."))
        self.layer = Layer(target, f"model.layers.{last}.", train=True)
        self.emb_norm = nn.Parameter(torch.full((D,), FEAT_RMS))
        self.feat_norm = nn.Parameter(torch.full((D,), FEAT_RMS))
        self.fc = nn.Parameter(torch.cat([torch.eye(D), torch.eye(D)], 1))
        self.norm = nn.Parameter(target["model.norm.weight"].float().clone())
        self.head = nn.Parameter(self.emb[head_ids].clone())

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return rms(x, self.norm) @ self.head.T

    def forward(self, ids: torch.Tensor, feats: torch.Tensor, valid: torch.Tensor, depths: int):
        """Each depth's outputs [B, L, D]; depth s at p predicts x_{p+2}."""
        n = ids.shape[1]
        pos = torch.arange(n)
        nxt = self.emb[F.pad(ids[:, 1:], (0, 1))]
        keys: list[tuple[torch.Tensor, torch.Tensor]] = []
        outs, feat = [], feats
        for s in range(1, depths + 1):
            x = torch.cat([rms(nxt, self.emb_norm), rms(feat, self.feat_norm)], -1) @ self.fc.T
            q, k, v = self.layer.qkv(x, pos)
            keys.append((k, v))
            allowed = (pos[None, :] <= pos[:, None] - (s - 1))[None, None] & valid[:, None, None]
            diag = [(*keys[t - 1], s - t) for t in range(2, s + 1)]
            g = self.layer.finish(x, attend(q, keys[0], allowed, diag))
            outs.append(g)
            feat = F.pad(g, (0, 0, 1, 0))[:, :n]
        return outs


class Added(nn.Module):
    def __init__(self, target: dict[str, torch.Tensor]) -> None:
        super().__init__()
        draft = load_file(DRAFT / "model.safetensors")
        self.register_buffer("emb", target["model.embed_tokens.weight"].float())
        n = 1 + max(int(k.split(".")[2]) for k in draft if k.startswith("model.layers."))
        self.layers = nn.ModuleList(
            Layer(draft, f"model.layers.{i}.", train=False) for i in range(n)
        )
        self.norm = nn.Parameter(draft["model.norm.weight"].float(), requires_grad=False)
        self.head = nn.Parameter(draft["lm_head.weight"].float(), requires_grad=False)
        self.feat_norm = nn.Parameter(torch.ones(D))
        self.proj = nn.Parameter(torch.zeros(D, D))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return rms(x, self.norm) @ self.head.T

    def forward(self, ids: torch.Tensor, feats: torch.Tensor, valid: torch.Tensor):
        """The shipped draft's final states (p predicts x_{p+1}), and each row's again with
        f_{p-1} added, attending the plain rows' keys before it and its own."""
        n = ids.shape[1]
        pos = torch.arange(n)
        plain = self.emb[ids]
        fed = plain + rms(F.pad(feats, (0, 0, 1, 0))[:, :n], self.feat_norm) @ self.proj.T
        causal = (pos[None, :] <= pos[:, None])[None, None] & valid[:, None, None]
        before = (pos[None, :] < pos[:, None])[None, None] & valid[:, None, None]
        for layer in self.layers:
            q1, k1, v1 = layer.qkv(plain, pos)
            q2, k2, v2 = layer.qkv(fed, pos)
            a1 = attend(q1, (k1, v1), causal, [])
            a2 = attend(q2, (k1, v1), before, [(k2, v2, 0)])
            plain, fed = layer.finish(plain, a1), layer.finish(fed, a2)
        return plain, fed


@dataclasses.dataclass
class Data:
    seqs: list[list[int]]
    prompt_lens: list[int]
    top_ids: list[torch.Tensor]
    top_logp: list[torch.Tensor]
    feats: list[torch.Tensor]

    @classmethod
    def load(cls, pairs: list[tuple[Path, Path]]) -> Data:
        d = cls([], [], [], [], [])
        for shard, feats in pairs:
            s = torch.load(shard)
            d.seqs += s["sequences"]
            d.prompt_lens += s["prompt_lens"]
            d.top_ids += s["top_ids"]
            d.top_logp += s["top_logp"]
            d.feats += torch.load(feats)
        return d

    def batch(self, idx: list[int], row: torch.Tensor, shift: int) -> tuple[torch.Tensor, ...]:
        """ids, features, valid keys, loss positions and the target's p over the head there.
        ``shift`` 0: position p predicts x_{p+1}; 1: x_{p+2} (p is one further back)."""
        n, b = max(len(self.seqs[i]) for i in idx), len(idx)
        ids = torch.zeros(b, n, dtype=torch.long)
        fe = torch.zeros(b, n, D)
        valid = torch.zeros(b, n, dtype=torch.bool)
        at = torch.zeros(b, n, dtype=torch.bool)
        rows, ps = [], []
        for r, i in enumerate(idx):
            s, first = self.seqs[i], self.prompt_lens[i] - 1  # the first output position
            ids[r, : len(s)] = torch.tensor(s)
            fe[r, : len(s)] = self.feats[i].float()
            valid[r, : len(s) - shift] = True
            lo = max(first - shift, 0)
            at[r, lo : len(s) - 1 - shift] = True
            top = slice(lo + shift - first, len(s) - 1 - first)
            rows.append(row[self.top_ids[i][top].long()])
            ps.append(self.top_logp[i][top].float().exp())
        rows_t, p = torch.cat(rows), torch.cat(ps)
        width = int(row.max()) + 1
        p_head = torch.zeros(rows_t.shape[0], width + 1)
        p_head.scatter_add_(1, rows_t.where(rows_t >= 0, width), p)
        return ids, fe, valid, at, p_head[:, :-1]


def shards(work: Path, run_dir: Path) -> list[tuple[Path, Path]]:
    rolls = sorted((run_dir / "rollouts").glob("*.pt"))
    return [(r, work / "feats" / r.name) for r in rolls if (work / "feats" / r.name).is_file()]


def heldout_data(work: Path) -> Data:
    return Data.load([(work / "heldout.pt", work / "feats" / "heldout.pt")])


def cmd_heldout(a: argparse.Namespace) -> None:
    import transformers

    from saguaro.bench.config import BenchConfig
    from saguaro.bench.prompts import prepare_prompts
    from saguaro.models.config import ModelConfig
    from saguaro.models.tokenizer import Tokenizer
    from saguaro.train.draft_data import RolloutConfig, rollout_batch, save_whole

    tdir = target_dir()
    tok = Tokenizer(tdir)
    sets = prepare_prompts(BenchConfig(datasets=("sharegpt", "humaneval")), tok, 256, 64)
    prompts = [p for s in sets for p in s.token_ids]
    stop = {*ModelConfig.from_dir(tdir).eos_token_ids, tok.eos_token_id} - {None}
    model = transformers.AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.bfloat16).eval()
    cfg = RolloutConfig(new_tokens=128, temperatures=(0.0,))
    shard = rollout_batch(model, prompts, [0.0] * len(prompts), cfg, stop, 0)
    a.work.mkdir(parents=True, exist_ok=True)
    save_whole(dataclasses.asdict(shard), a.work / "heldout.pt")


@torch.no_grad()
def cmd_features(a: argparse.Namespace) -> None:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(target_dir(), dtype=torch.bfloat16)
    model.eval()
    seen: dict[str, torch.Tensor] = {}
    model.model.norm.register_forward_hook(lambda m, i, o: seen.__setitem__("h", i[0]))
    (a.work / "feats").mkdir(parents=True, exist_ok=True)
    files = [a.work / "heldout.pt", *sorted((a.run_dir / "rollouts").glob("*.pt"))]
    for path in files:
        dest = a.work / "feats" / path.name
        if dest.is_file():
            continue
        seqs = torch.load(path)["sequences"]
        feats: list[torch.Tensor] = [torch.empty(0)] * len(seqs)
        order = sorted(range(len(seqs)), key=lambda r: len(seqs[r]))
        for b in range(0, len(order), FEATURE_ROWS):
            rows = order[b : b + FEATURE_ROWS]
            n = max(len(seqs[r]) for r in rows)
            ids = torch.zeros(len(rows), n, dtype=torch.long)
            mask = torch.zeros(len(rows), n, dtype=torch.long)
            for i, r in enumerate(rows):
                ids[i, : len(seqs[r])] = torch.tensor(seqs[r])
                mask[i, : len(seqs[r])] = 1
            model.model(input_ids=ids, attention_mask=mask)
            for i, r in enumerate(rows):
                feats[r] = seen["h"][i, : len(seqs[r])].to(torch.bfloat16).clone()
        torch.save(feats, dest)
        print(path.name, sum(map(len, seqs)), "tokens", flush=True)


def fit(model: nn.Module, plan: list[list[int]], lr: float, step_fn, out: Path) -> None:
    """AdamW over ``model``'s trainable parameters, warmup then cosine to a tenth."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    total = len(plan)

    def lr_at(s: int) -> float:
        return min(1.0, (s + 1) / 20) * (0.1 + 0.45 * (1 + math.cos(math.pi * s / total)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    start, recent = time.monotonic(), []
    for step, idx in enumerate(plan):
        loss, stats = step_fn(idx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        recent = [*recent[-49:], stats]
        if step % 25 == 0 or step == total - 1:
            mean = [round(sum(r[i] for r in recent) / len(recent), 3) for i in range(len(stats))]
            elapsed = time.monotonic() - start
            print(f"step {step}/{total} {elapsed:.0f}s loss {loss.item():.3f} accept {mean}")
            torch.save(model.state_dict(), out)
    torch.save(model.state_dict(), out)


def proxy(p_head: torch.Tensor, logits: torch.Tensor) -> float:
    return torch.minimum(p_head, F.softmax(logits.float(), -1)).sum(-1).mean().item()


def cmd_train_eagle(a: argparse.Namespace) -> None:
    ids, row = head_rows()
    data = Data.load(shards(a.work, a.run_dir))
    model = Eagle(load_file(target_dir() / "model.safetensors"), ids)
    weights = [0.8**s for s in range(a.depths)]

    def step(idx: list[int]):
        b_ids, fe, valid, at, p_head = data.batch(idx, row, shift=1)
        loss, stats = 0.0, []
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs = model(b_ids, fe, valid, a.depths)
        for s, g in enumerate(outs):
            here = at.clone()
            here[:, :s] = False  # depth s + 1 needs s positions before it
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model.logits(g[here])
            p = p_head[here[at]]
            loss = loss - weights[s] * (p * F.log_softmax(logits.float(), -1)).sum(-1).mean()
            stats.append(proxy(p, logits.detach()))
        return loss, stats

    plan = batches([len(s) for s in data.seqs], BATCH_TOKENS, 0, a.epochs)
    fit(model, plan, a.lr, step, a.out)


def cmd_train_added(a: argparse.Namespace) -> None:
    _, row = head_rows()
    data = Data.load(shards(a.work, a.run_dir))
    model = Added(load_file(target_dir() / "model.safetensors"))

    def step(idx: list[int]):
        b_ids, fe, valid, at, p_head = data.batch(idx, row, shift=0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            plain, fed = model(b_ids, fe, valid)
            lp, lf = model.logits(plain[at]), model.logits(fed[at])
        loss = -(p_head * F.log_softmax(lf.float(), -1)).sum(-1).mean()
        return loss, [proxy(p_head, lp.detach()), proxy(p_head, lf.detach())]

    plan = batches([len(s) for s in data.seqs], BATCH_TOKENS, 1, a.epochs)
    fit(model, plan, a.lr, step, a.out)


def accepted(chain: list[torch.Tensor], toks: torch.Tensor, start: int) -> list[int]:
    """Per committed position n >= start: how many of K chained predictions equal the text,
    ``chain[d][n + d]`` being depth d + 1's prediction for x_{n+d+1}."""
    out = []
    for n in range(start, len(toks) - K):
        k = 0
        while k < K and chain[k][n + k] == toks[n + k + 1]:
            k += 1
        out.append(k)
    return out


@torch.no_grad()
def cmd_eval(a: argparse.Namespace) -> None:
    ids, row = head_rows()
    data = heldout_data(a.work)
    target = load_file(target_dir() / "model.safetensors")
    added = Added(target)
    if a.added:
        added.load_state_dict(torch.load(a.added))
    eagle = None
    if a.eagle:
        eagle = Eagle(target, ids)
        eagle.load_state_dict(torch.load(a.eagle))
    counts: dict[str, list[int]] = {"shipped": [], "added": [], "eagle": []}
    proxies: dict[str, list[float]] = {"shipped": [], "added": [], "eagle": []}
    for i in range(len(data.seqs)):
        toks = torch.tensor(data.seqs[i])
        start = data.prompt_lens[i]
        b_ids, fe, valid, at, p_head = data.batch([i], row, shift=0)
        plain, fed = added(b_ids, fe, valid)
        lp, lf = added.logits(plain[0]), added.logits(fed[0])
        pp, pf = ids[lp.argmax(-1)], ids[lf.argmax(-1)]
        counts["shipped"] += accepted([pp] * K, toks, start)
        counts["added"] += accepted([pf] + [pp] * (K - 1), toks, start)
        proxies["shipped"].append(proxy(p_head, lp[at[0]]))
        proxies["added"].append(proxy(p_head, lf[at[0]]))
        if eagle is not None:
            outs = eagle(b_ids, fe, valid, K)
            # depth d at p = n - 2 + d predicts x_{n+d}: realigned so index n + d - 1 holds it
            chain = [F.pad(ids[eagle.logits(g[0]).argmax(-1)], (1, 0)) for g in outs]
            counts["eagle"] += accepted(chain, toks, start)
            _, _, _, at1, p1 = data.batch([i], row, shift=1)
            proxies["eagle"].append(proxy(p1, eagle.logits(outs[0][0][at1[0]])))
    report = {
        name: {
            "tokens_per_round_K4": round(1 + sum(c) / len(c), 3),
            "proxy_first": round(sum(proxies[name]) / len(proxies[name]), 3),
        }
        for name, c in counts.items()
        if c
    }
    print(json.dumps({"rounds": len(counts["shipped"]), **report}))


def main() -> None:
    torch.set_num_threads(2)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("heldout").add_argument("work", type=Path)
    f = sub.add_parser("features")
    f.add_argument("work", type=Path)
    f.add_argument("run_dir", type=Path)
    for name, epochs, lr in (("train-eagle", 1.0, 1e-3), ("train-added", 0.6, 1e-4)):
        t = sub.add_parser(name)
        t.add_argument("work", type=Path)
        t.add_argument("run_dir", type=Path)
        t.add_argument("out", type=Path)
        t.add_argument("--epochs", type=float, default=epochs)
        t.add_argument("--lr", type=float, default=lr)
        t.add_argument("--depths", type=int, default=3)
    e = sub.add_parser("eval")
    e.add_argument("work", type=Path)
    e.add_argument("--eagle", type=Path)
    e.add_argument("--added", type=Path)
    a = p.parse_args()
    cmds = {
        "heldout": cmd_heldout,
        "features": cmd_features,
        "train-eagle": cmd_train_eagle,
        "train-added": cmd_train_added,
        "eval": cmd_eval,
    }
    cmds[a.cmd](a)


if __name__ == "__main__":
    main()
