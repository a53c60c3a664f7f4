"""Forward costs of candidate draft shapes beside their target's, to choose a draft by cost.

For a target directory (default: the imported SmolLM2-135M-Instruct), random-weight drafts of
the target's width with L layers and an output head over the whole vocabulary or its N most
frequent tokens (a reduced head, saguaro.models.llama) are timed after ``--context`` cached
tokens: one position (a draft step), K + 1 positions (the draft's glue) and 8 single-token
branches (an SSD branch depth), beside the target's one position and its K + 1 verification.
Random weights cost what trained ones cost. The ratio column is a draft step over the target's
verification, which the issue asks to keep at most 1/8.

    .venv/bin/python docs/bench/draft-shapes/draft_shapes.py --threads 1,2 \\
        --out docs/bench/draft-shapes
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from saguaro.models.catalog import SMOLLM2, resolve_model
from saguaro.models.config import ModelConfig
from saguaro.train.costs import BRANCHES, ForwardTimer

INIT_STD = 0.02  # the scale of the random weights (their values do not change the cost)


def random_draft(target: ModelConfig, layers: int, head: int | None, out: Path) -> Path:
    """A random-weight Llama of the target's width, ``layers`` deep, with a head over ``head``
    token ids (None: the whole vocabulary, tied to the embeddings as the target's is)."""
    h, f = target.hidden_size, target.intermediate_size
    q, kv = (
        target.num_attention_heads * target.head_dim,
        target.num_key_value_heads * target.head_dim,
    )
    gen = torch.Generator().manual_seed(0)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * INIT_STD

    tensors = {
        "model.embed_tokens.weight": w(target.vocab_size, h),
        "model.norm.weight": torch.ones(h),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": torch.ones(h),
            p + "post_attention_layernorm.weight": torch.ones(h),
            p + "self_attn.q_proj.weight": w(q, h),
            p + "self_attn.k_proj.weight": w(kv, h),
            p + "self_attn.v_proj.weight": w(kv, h),
            p + "self_attn.o_proj.weight": w(h, q),
            p + "mlp.gate_proj.weight": w(f, h),
            p + "mlp.up_proj.weight": w(f, h),
            p + "mlp.down_proj.weight": w(h, f),
        }
    config = dict(target.raw, num_hidden_layers=layers, tie_word_embeddings=head is None)
    if head is not None:
        tensors["lm_head.weight"] = w(head, h)
        tensors["lm_head.token_ids"] = torch.arange(head)
        config["draft_vocab_size"] = head
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config))
    return out


def measure(args: argparse.Namespace) -> dict:
    target_dir = resolve_model(args.target)
    cfg = ModelConfig.from_dir(target_dir)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for threads in args.threads:
            torch.set_num_threads(threads)
            t = ForwardTimer(target_dir, args.context)
            t1, tk = t.positions_ms(1), t.positions_ms(args.k + 1)
            rows.append(
                dict(
                    threads=threads,
                    model="target",
                    layers=cfg.num_hidden_layers,
                    head=cfg.vocab_size,
                    t1=t1,
                    t_k1=tk,
                    branch8=t.branches_ms(BRANCHES),
                )
            )
            del t
            for layers in args.layers:
                for head in args.heads:
                    d_dir = random_draft(cfg, layers, head or None, Path(tmp) / f"d{layers}-{head}")
                    d = ForwardTimer(d_dir, args.context)
                    d1 = d.positions_ms(1)
                    rows.append(
                        dict(
                            threads=threads,
                            model="draft",
                            layers=layers,
                            head=head or cfg.vocab_size,
                            t1=d1,
                            t_k1=d.positions_ms(args.k + 1),
                            branch8=d.branches_ms(BRANCHES),
                            step_over_verify=d1 / tk,
                        )
                    )
                    del d
    return {
        "target": str(target_dir), "k": args.k, "context": args.context,
        "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "rows": rows,
    }  # fmt: skip


def table(result: dict) -> str:
    lines = [
        f"K = {result['k']}, {result['context']} cached tokens, float32, eager, ms (median); "
        f"{result['date']}, PyTorch {result['torch']}",
        "",
        "| threads | model | layers | head tokens | 1 position | K + 1 | 8 branches | "
        "draft step / target K + 1 |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        ratio = f"1/{1 / r['step_over_verify']:.1f}" if "step_over_verify" in r else ""
        lines.append(
            f"| {r['threads']} | {r['model']} | {r['layers']} | {r['head']} | {r['t1']:.2f} | "
            f"{r['t_k1']:.2f} | {r['branch8']:.2f} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default=SMOLLM2, help="target directory or models-directory name")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--context", type=int, default=200)
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p.add_argument("--threads", type=ints, default=[1, 2])
    p.add_argument("--layers", type=ints, default=[1, 2, 4, 6])
    p.add_argument("--heads", type=ints, default=[0, 16384, 8192], help="0: the whole vocabulary")
    p.add_argument("--out", type=Path, default=None, help="write table.md and result.json here")
    args = p.parse_args()
    result = measure(args)
    text = table(result)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "table.md").write_text(text)
        (args.out / "result.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
