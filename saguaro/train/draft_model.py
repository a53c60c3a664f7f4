"""A draft cut from its target: the target's own embeddings and some of its layers, a reduced
output vocabulary, and how it is written as a model directory.

Shape. The draft keeps the target's width, so its layers can start as copies of the target's
(``layers``: which ones) and its input embedding *is* the target's, frozen: the draft reads
tokens as the target does and training spends nothing on 28M embedding parameters. Its LM head
scores only ``head_tokens`` token ids, those of most expected output mass (``head_ids``), each row
starting as the target's own output row for that token; q = 0 elsewhere keeps verification
exact (``saguaro.models.llama.CausalLM.forward``).

Shipping. Because the embedding is the target's, a draft can be written without it
(:func:`write_draft` with ``embeddings=False``, what the repository carries) and made whole
again from the target (``saguaro.models.draft_dir.assemble_draft``), checked against the digest
of the embedding it was trained with.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from saguaro.models.draft_dir import (
    EMBED,
    HEAD_IDS,
    TOKENIZER_FILES,
    TRAINING_FILE,
    embedding_digest,
)


class Draft(nn.Module):
    """Training-time draft: a transformers decoder stack over the target's frozen embedding,
    and a linear head over ``head_ids``. ``forward`` returns the final hidden states; the
    head is applied only where the loss needs it."""

    def __init__(self, decoder: nn.Module, head_ids: torch.Tensor, head: torch.Tensor) -> None:
        super().__init__()
        self.model = decoder
        self.register_buffer("head_ids", head_ids.long())
        self.lm_head = nn.Linear(head.shape[1], head.shape[0], bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(head)
        self.model.embed_tokens.weight.requires_grad_(False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def head_ids(
    top_ids: list[torch.Tensor], top_logp: list[torch.Tensor], size: int, vocab: int
) -> list[int]:
    """The ``size`` tokens the target is expected to write most often: each token's
    probability summed over every output position of the rollouts (as far as their top
    tokens tell; far more tokens get a share than are ever written), ties to the lower id."""
    if not 1 <= size <= vocab:
        raise ValueError(f"head_tokens must be in 1..{vocab}, got {size}")
    mass = torch.zeros(vocab, dtype=torch.float64)
    for ids, logp in zip(top_ids, top_logp, strict=True):
        mass.index_add_(0, ids.long().flatten(), logp.double().exp().flatten())
    order = torch.argsort(-mass, stable=True)  # stable: ties keep the lower id first
    return sorted(order[:size].tolist())


def cut_draft(target: nn.Module, layers: tuple[int, ...], ids: list[int]) -> Draft:
    """A draft from a transformers ``*ForCausalLM`` target: its embedding, the given layers (in
    that order), its final norm, and its output rows for ``ids``; float32 and trainable."""
    n = target.config.num_hidden_layers
    if not layers or any(not 0 <= i < n for i in layers):
        raise ValueError(f"draft layers must be target layer indices in 0..{n - 1}, got {layers}")
    decoder = copy.deepcopy(target.model).float()
    decoder.layers = nn.ModuleList(decoder.layers[i] for i in layers)
    for j, layer in enumerate(decoder.layers):
        layer.self_attn.layer_idx = j  # the KV cache slot, were one used
    decoder.config = copy.deepcopy(target.config)
    decoder.config.num_hidden_layers = len(layers)
    if hasattr(decoder.config, "layer_types") and decoder.config.layer_types:
        decoder.config.layer_types = [decoder.config.layer_types[i] for i in layers]
    index = torch.tensor(ids)
    head = target.get_output_embeddings().weight.detach()[index].float()
    return Draft(decoder, index, head)


def load_draft(target: nn.Module, draft_dir: Path) -> Draft:
    """The draft written to ``draft_dir`` (by :func:`write_draft`), trainable again over the
    target's embedding: the input embedding it was trained with, checked by its digest."""
    from safetensors.torch import load_file

    state = load_file(str(Path(draft_dir) / "model.safetensors"))
    training = json.loads((Path(draft_dir) / TRAINING_FILE).read_text())
    embed = target.get_input_embeddings().weight
    if training.get("embedding_sha256") != embedding_digest(embed):
        raise ValueError(f"{draft_dir}: trained over another embedding than the target's")
    layers = json.loads((Path(draft_dir) / "config.json").read_text())["num_hidden_layers"]
    draft = cut_draft(target, tuple(range(layers)), state.pop(HEAD_IDS).tolist())
    state = {k: v.float() for k, v in state.items()}
    missing, unexpected = draft.load_state_dict(state, strict=False)
    if unexpected or {k for k in missing if "rotary_emb" not in k} - {EMBED, "head_ids"}:
        raise ValueError(f"{draft_dir}: not a draft of this shape ({missing + unexpected})")
    return draft


def draft_config(target_dir: Path, num_layers: int, head_tokens: int) -> dict[str, Any]:
    cfg = json.loads((Path(target_dir) / "config.json").read_text())
    cfg.update(
        num_hidden_layers=num_layers,
        tie_word_embeddings=False,
        draft_vocab_size=head_tokens,
        torch_dtype="float32",
    )
    cfg.pop("layer_types", None)
    return cfg


def write_draft(
    draft: Draft,
    target_dir: Path,
    out: Path,
    training: dict[str, Any],
    embeddings: bool = True,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """``out`` as a model directory saguaro loads (Hugging Face names, ``lm_head.token_ids``
    beside the head). Without ``embeddings`` the input embedding is left out (and so are the
    tokenizer files): :func:`assemble_draft` restores both from the target."""
    out.mkdir(parents=True, exist_ok=True)
    state = {
        f"model.{k}": v.detach().to(dtype).contiguous()
        for k, v in draft.model.state_dict().items()
        if "rotary_emb" not in k
    }
    state["lm_head.weight"] = draft.lm_head.weight.detach().to(dtype).contiguous()
    state[HEAD_IDS] = draft.head_ids.to(torch.int64).contiguous()
    training = {**training, "embedding_sha256": embedding_digest(draft.model.embed_tokens.weight)}
    if not embeddings:
        del state[EMBED]
    save_file(state, str(out / "model.safetensors"))
    cfg = draft_config(target_dir, len(draft.model.layers), int(draft.head_ids.numel()))
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    shutil.copy(Path(target_dir) / "generation_config.json", out / "generation_config.json")
    for name in TOKENIZER_FILES if embeddings else ():
        shutil.copy(Path(target_dir) / name, out / name)
    (out / TRAINING_FILE).write_text(json.dumps(training, indent=2) + "\n")
    return out
