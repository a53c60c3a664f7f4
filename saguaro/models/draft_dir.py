"""A draft directory shipped without its input embedding, made whole from its target.

A draft distilled by ``saguaro train-draft`` reads tokens through its target's own embedding,
frozen during training (``saguaro.train.draft_model``), so the repository can carry the draft
without those rows (28M parameters for SmolLM2) and the import restores them from the target,
after checking that they are the rows the draft was trained with.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from saguaro.errors import ModelLoadError
from saguaro.models.loader import iter_tensors, safetensors_files

EMBED = "model.embed_tokens.weight"
HEAD_IDS = "lm_head.token_ids"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
TRAINING_FILE = "training.json"


def embedding_digest(embedding: torch.Tensor) -> str:
    """The embedding's identity, so a draft refuses another target's: read at bfloat16, so that
    the same target imported in float32 or bfloat16 is the same."""
    data = embedding.detach().bfloat16().view(torch.int16).contiguous().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def has_embedding(model_dir: Path) -> bool:
    """Whether the directory's weights hold an input embedding (a draft written without one,
    as the repository ships it, does not); reads the files' headers only."""
    from safetensors import safe_open

    for path in safetensors_files(model_dir):
        with safe_open(str(path), "pt") as f:
            if EMBED in f.keys():
                return True
    return False


def assemble_draft(shipped: Path, target_dir: Path, out: Path) -> Path:
    """A whole draft directory in ``out`` from one written without embeddings (``shipped``) and
    its target: the target's embedding and tokenizer, checked against the digest the draft
    was trained with."""
    training = json.loads((shipped / TRAINING_FILE).read_text())
    embed = next(
        (t for name, t in iter_tensors(safetensors_files(target_dir)) if name == EMBED), None
    )
    if embed is None:
        raise ModelLoadError(f"{target_dir}: no {EMBED} to give the draft")
    if embedding_digest(embed) != training["embedding_sha256"]:
        raise ModelLoadError(
            f"{shipped} was trained on another embedding than {target_dir}'s "
            f"(sha256 {training['embedding_sha256']} against {embedding_digest(embed)})"
        )
    state = dict(iter_tensors(safetensors_files(shipped)))
    state[EMBED] = embed  # as the target stores it: the loader casts every tensor alike
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"))
    for name in ("config.json", "generation_config.json", TRAINING_FILE, "README.md"):
        if (shipped / name).is_file():
            shutil.copy(shipped / name, out / name)
    for name in TOKENIZER_FILES:
        shutil.copy(target_dir / name, out / name)
    return out
