"""Byte-level BPE tokenizer for code, plus the Hugging Face files that describe it."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from saguaro.corpus import EOT

# Prompts get the document separator prepended, as every training document follows one: the
# post-processor and tokenizer_config.json both say so, so tokenizers and AutoTokenizer agree.
CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}"


def train_tokenizer(texts: Iterable[str], vocab_size: int = 8192) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    # No prefix space: source code must decode to exactly the bytes it came from.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    eot = tok.token_to_id(EOT)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{EOT} $A", pair=f"{EOT} $A {EOT} $B:1", special_tokens=[(EOT, eot)]
    )
    return tok


def encode_plain(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Ids without the BOS: the corpus stream inserts separators itself."""
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def write_hf_tokenizer(tok: Tokenizer, out_dir: Path, model_max_length: int) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOT,
        "eos_token": EOT,
        "unk_token": None,
        "pad_token": EOT,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
