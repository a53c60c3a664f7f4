"""Preparing a run's prompts: drawn per dataset, tokenized, cut from the left to fit."""

from __future__ import annotations

from saguaro.bench import datasets
from saguaro.bench.config import BenchConfig
from saguaro.bench.prompts import prepare_prompts, summary


class CharTokenizer:
    """One token per character, after a BOS of id 0."""

    bos_token_id = 0

    def encode(self, text: str) -> list[int]:
        return [self.bos_token_id, *(ord(c) for c in text)]


def test_long_prompts_keep_their_end_and_bos(prompt_file):
    cfg = BenchConfig(prompts=str(prompt_file), datasets=(), seed=0)
    (ps,) = prepare_prompts(cfg, CharTokenizer(), max_prompt_tokens=8, count=2)
    chosen = datasets.select(datasets.file_prompts(prompt_file), 2, seed=0, name="prompts")
    assert ps.name == "prompts" and ps.prompts == chosen
    for p, ids in zip(ps.prompts, ps.token_ids, strict=True):
        full = CharTokenizer().encode(p.text)
        assert len(ids) == min(len(full), 8) and ids[0] == 0
        assert ids[1:] == full[len(full) - len(ids) + 1 :]  # the prompt's last tokens
    assert ps.truncated == sum(len(p.text) + 1 > 8 for p in ps.prompts)
    info = summary([ps])["prompts"]
    assert info["ids"] == [p.id for p in chosen] and info["tokens_max"] == 8


class ChatTokenizer(CharTokenizer):
    """CharTokenizer with a chat template: a user's message becomes "<" + text + ">"."""

    has_chat_template = True

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        (message,) = messages
        assert message["role"] == "user"
        return self.encode(f"<{message['content']}>")


def test_chat_prompts_go_in_the_chat_template_and_code_prompts_as_they_are(monkeypatch):
    prompts = {
        "sharegpt": [datasets.Prompt("c", "hi", chat=True)],
        "humaneval": [datasets.Prompt("h", "def f():")],
    }
    monkeypatch.setattr("saguaro.bench.prompts.load_dataset", prompts.__getitem__)
    cfg = BenchConfig(datasets=("sharegpt", "humaneval"), seed=0)
    chat, code = prepare_prompts(cfg, ChatTokenizer(), max_prompt_tokens=64, count=1)
    assert chat.token_ids == [ChatTokenizer().encode("<hi>")]
    assert code.token_ids == [ChatTokenizer().encode("def f():")]
    plain = CharTokenizer()
    plain.has_chat_template = False  # a base model: the message as it is
    (chat,) = prepare_prompts(BenchConfig(datasets=("sharegpt",), seed=0), plain, 64, 1)
    assert chat.token_ids == [plain.encode("hi")]
