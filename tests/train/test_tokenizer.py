from pathlib import Path

import pytest

from saguaro.corpus import EOT, read_documents
from saguaro.train.tokenizer import train_tokenizer, write_hf_tokenizer

CODE = "def f(x):\n\tif x:  \n\n\n        return 'caf\u00e9'  # \u2192\n\r\n  \n"


@pytest.fixture
def tokenizer(tiny_tree: Path):
    return train_tokenizer(read_documents(sorted(tiny_tree.rglob("*.py"))), vocab_size=300)


def test_round_trip_is_exact_and_bos_is_prepended(tokenizer) -> None:
    eot = tokenizer.token_to_id(EOT)
    assert eot == 0
    assert tokenizer.get_vocab_size() == 300
    ids = tokenizer.encode(CODE).ids
    assert ids[0] == eot and eot not in ids[1:]
    assert tokenizer.decode(ids) == CODE  # the special token is skipped by default
    plain = tokenizer.encode(CODE, add_special_tokens=False).ids
    assert plain == ids[1:]
    assert len(plain) < len(CODE.encode())  # merges were learnt


def test_transformers_tokenizer_agrees(tokenizer, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    write_hf_tokenizer(tokenizer, tmp_path, model_max_length=2048)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert hf.bos_token == hf.eos_token == EOT
    assert hf(CODE).input_ids == tokenizer.encode(CODE).ids
    assert hf.decode(hf(CODE).input_ids, skip_special_tokens=True) == CODE
    chat = hf.apply_chat_template([{"role": "user", "content": "def f():"}], tokenize=False)
    assert chat == EOT + "def f():"
