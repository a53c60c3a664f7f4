"""Random-weight checkpoints with the exact shapes of real models, and the benchmark on them.

    python scripts/real_shapes.py write [--out DIR]            # seconds; ~4 GB on disk
    python scripts/real_shapes.py hf-compare --model DIR [--tokens 48] [--threads 2]
    python scripts/real_shapes.py bench --model DIR --draft DIR [saguaro bench flags...]

``write`` makes Hugging Face directories for SmolLM2-135M, Llama-3.2-1B and Qwen3-0.6B (bfloat16,
every dimension, vocabulary, RoPE setting and tied head as published) and, for each, a draft with
the same vocabulary (SmolLM2's: four of its layers, the shipped draft's shape; the others': two
small layers). With ``--near SCALE``, also ``NAME-near`` and ``NAME-near-draft``: the draft is the
target's own first layers and the target's later layers add only SCALE times their output, so
acceptance is high and set by SCALE while verification stays the real, exact one.

The tokenizer is byte-level: ids 0..255 are bytes and the rest of the
vocabulary is reserved tokens, so any text encodes and every id has a row in the embedding.
Weights are N(0, 0.02) like a fresh initialisation: the logits are flat, which is the hard case
for top-p (nuclei of most of the vocabulary).

``hf-compare`` times AR decoding of one prompt, saguaro against transformers on the same
checkpoint and threads, greedy and with top-p 0.95 (medians of interleaved runs).
``bench`` is ``saguaro bench`` with the models given (any other bench flag passes through).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

INIT_STD = 0.02  # transformers' default initializer_range

SHAPES = {
    # saguaro's default target (its GGUF does not travel to a machine with no network: 93 MB).
    "smollm2-135m": dict(
        family="llama",
        vocab_size=49_152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=100_000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    ),
    "llama-3.2-1b": dict(
        family="llama",
        vocab_size=128_256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=131_072,
        rms_norm_eps=1e-5,
        rope_theta=500_000.0,
        rope_scaling=dict(
            rope_type="llama3",
            factor=32.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
        tie_word_embeddings=True,
        bos_token_id=128_000,
        eos_token_id=128_001,
    ),
    "qwen3-0.6b": dict(
        family="qwen3",
        vocab_size=151_936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40_960,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=151_643,
        eos_token_id=151_645,
    ),
}
# The draft of each: its family, vocabulary and RoPE, two small layers; SmolLM2's has the shipped
# draft's shape instead (four of its target's layers), with the full vocabulary as its head.
DRAFTS = {"smollm2-135m": dict(num_hidden_layers=4, tie_word_embeddings=False)}
DRAFT = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
)


def _tensors(cfg: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd, nh, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * INIT_STD).to(torch.bfloat16)

    out = {"model.embed_tokens.weight": rand(v, h), "model.norm.weight": torch.ones(h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": rand(nh * hd, h),
            p + "self_attn.k_proj.weight": rand(nkv * hd, h),
            p + "self_attn.v_proj.weight": rand(nkv * hd, h),
            p + "self_attn.o_proj.weight": rand(h, nh * hd),
            p + "mlp.gate_proj.weight": rand(inter, h),
            p + "mlp.up_proj.weight": rand(inter, h),
            p + "mlp.down_proj.weight": rand(h, inter),
            p + "input_layernorm.weight": torch.ones(h),
            p + "post_attention_layernorm.weight": torch.ones(h),
        }
        if cfg["family"] == "qwen3":
            out[p + "self_attn.q_norm.weight"] = torch.ones(hd)
            out[p + "self_attn.k_norm.weight"] = torch.ones(hd)
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = rand(v, h)
    return {k: t.to(torch.bfloat16).contiguous() for k, t in out.items()}


def _tokenizer(vocab_size: int, eos_id: int):
    """Byte-level BPE without merges: bytes are ids 0..255, the rest reserved placeholders."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab |= {f"<|reserved_{i}|>": i for i in range(len(alphabet), vocab_size)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    eos = f"<|reserved_{eos_id}|>"
    tok.add_special_tokens([eos])
    return tok, eos


def near_pair(cfg: dict, draft_layers: int, scale: float, seed: int) -> tuple[dict, dict]:
    """The tensors of a target whose layers past the first ``draft_layers`` add ``scale`` times
    their output to the residual stream (their attention and MLP outputs scaled), and of a draft
    made of the target's first ``draft_layers``, its embedding, final norm and head. The target
    still computes every layer; the smaller ``scale``, the closer the draft's distribution to
    the target's, so acceptance is chosen while verification stays the real one."""
    target = _tensors(cfg, torch.Generator().manual_seed(seed))
    for i in range(draft_layers, cfg["num_hidden_layers"]):
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            key = f"model.layers.{i}.{name}.weight"
            target[key] = (target[key].float() * scale).to(torch.bfloat16)
    draft = {
        k: v
        for k, v in target.items()
        if not k.startswith("model.layers.") or int(k.split(".")[2]) < draft_layers
    }
    return target, draft


def write_checkpoint(
    path: Path, cfg: dict, seed: int, tensors: dict[str, torch.Tensor] | None = None
) -> Path:
    import transformers

    path.mkdir(parents=True, exist_ok=True)
    family, fields = cfg["family"], {k: v for k, v in cfg.items() if k != "family"}
    config_cls = transformers.LlamaConfig if family == "llama" else transformers.Qwen3Config
    arch = "LlamaForCausalLM" if family == "llama" else "Qwen3ForCausalLM"
    config = config_cls(**fields, torch_dtype="bfloat16", architectures=[arch])
    config.save_pretrained(path)
    save_file(
        tensors if tensors is not None else _tensors(cfg, torch.Generator().manual_seed(seed)),
        str(path / "model.safetensors"),
        metadata={"format": "pt"},
    )
    tok, eos = _tokenizer(cfg["vocab_size"], cfg["eos_token_id"])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": eos, "tokenizer_class": "PreTrainedTokenizerFast"})
    )
    (path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": cfg["eos_token_id"], "bos_token_id": cfg["bos_token_id"]})
    )
    return path


def cmd_write(args: argparse.Namespace) -> None:
    out = Path(args.out)
    for name in args.shapes:
        cfg = SHAPES[name]
        t0 = time.perf_counter()
        write_checkpoint(out / name, cfg, seed=0)
        write_checkpoint(out / f"{name}-draft", cfg | DRAFTS.get(name, DRAFT), seed=1)
        print(f"{name} and its draft in {out} ({time.perf_counter() - t0:.0f} s)")
        if args.near is not None:
            layers = DRAFTS.get(name, {}).get("num_hidden_layers", DRAFT["num_hidden_layers"])
            target, draft = near_pair(cfg, layers, args.near, seed=0)
            write_checkpoint(out / f"{name}-near", cfg, 0, target)
            write_checkpoint(
                out / f"{name}-near-draft", cfg | {"num_hidden_layers": layers}, 0, draft
            )
            print(f"{name}-near and its draft (its first {layers} layers) in {out}")


def cmd_hf_compare(args: argparse.Namespace) -> None:
    import transformers

    from saguaro import LLM, SamplingParams

    torch.set_num_threads(args.threads)
    prompt = "def fibonacci(n):\n    "
    llm = LLM(model=args.model, dtype="bfloat16", num_threads=args.threads, max_model_len=512)
    hf = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    hf.eval()
    ids = llm.engine.encode_prompt(prompt)
    settings = {"greedy": dict(temperature=0.0), "top-p 0.95": dict(temperature=1.0, top_p=0.95)}
    times: dict[tuple[str, str], list[float]] = {}
    for run in range(args.repeats):
        for name, s in settings.items():
            params = SamplingParams(max_tokens=args.tokens, ignore_eos=True, seed=run, **s)
            t0 = time.perf_counter()
            llm.generate([ids], params)
            times.setdefault(("saguaro", name), []).append(time.perf_counter() - t0)
            gcfg = transformers.GenerationConfig(
                max_new_tokens=args.tokens,
                min_new_tokens=args.tokens,
                do_sample=s["temperature"] > 0,
                temperature=s["temperature"] or None,
                top_p=s.get("top_p", 1.0),
                top_k=0,
                pad_token_id=0,
            )
            x = torch.tensor([ids])
            t0 = time.perf_counter()
            with torch.inference_mode():
                hf.generate(x, attention_mask=torch.ones_like(x), generation_config=gcfg)
            times.setdefault(("transformers", name), []).append(time.perf_counter() - t0)
    name = Path(args.model).name
    print(f"| {name}, {args.threads} threads | saguaro AR | transformers | ratio |")
    print("|---|---:|---:|---:|")
    for setting in settings:
        ours = args.tokens / statistics.median(times[("saguaro", setting)])
        theirs = args.tokens / statistics.median(times[("transformers", setting)])
        print(f"| {setting} | {ours:.1f} tok/s | {theirs:.1f} tok/s | {ours / theirs:.2f}x |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write the checkpoints")
    w.add_argument("--out", default="real-shapes")
    w.add_argument(
        "--shapes", type=lambda s: s.split(","), default=list(SHAPES), help="e.g. smollm2-135m"
    )
    w.add_argument(
        "--near",
        type=float,
        metavar="SCALE",
        help="also a pair whose draft is the target's first layers, the target's later layers "
        "scaled by SCALE (near_pair): real verification at an acceptance SCALE sets",
    )
    h = sub.add_parser("hf-compare", help="saguaro AR vs transformers, same checkpoint")
    h.add_argument("--model", required=True)
    h.add_argument("--tokens", type=int, default=48)
    h.add_argument("--threads", type=int, default=2)
    h.add_argument("--repeats", type=int, default=3)
    sub.add_parser("bench", help="saguaro bench on a written pair", add_help=False)
    args, rest = p.parse_known_args()
    if args.cmd == "write":
        cmd_write(args)
    elif args.cmd == "hf-compare":
        cmd_hf_compare(args)
    else:
        sys.exit(subprocess.call([sys.executable, "-m", "saguaro", "bench", *rest]))


if __name__ == "__main__":
    main()
