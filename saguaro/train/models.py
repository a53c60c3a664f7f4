"""Shapes of the pair `saguaro train-pair` trains and the Hugging Face Llama configs they map to."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import LlamaConfig, LlamaForCausalLM


@dataclass(frozen=True)
class ModelSpec:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int


TARGET = ModelSpec(hidden=384, layers=6, heads=6, kv_heads=2, intermediate=1024)
DRAFT = ModelSpec(hidden=192, layers=3, heads=3, kv_heads=1, intermediate=512)


def llama_config(spec: ModelSpec, vocab_size: int, eot_id: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        intermediate_size=spec.intermediate,
        hidden_act="silu",
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=eot_id,
        eos_token_id=eot_id,
        pad_token_id=eot_id,
        attention_bias=False,
        mlp_bias=False,
        attn_implementation="sdpa",
    )


def build_model(spec: ModelSpec, vocab_size: int, eot_id: int) -> LlamaForCausalLM:
    return LlamaForCausalLM(llama_config(spec, vocab_size, eot_id))


def n_params(model: LlamaForCausalLM) -> int:
    # Tied embeddings are one tensor: parameters() already counts them once.
    return sum(p.numel() for p in model.parameters())
