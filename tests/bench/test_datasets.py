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
    assert all(datasets._DEF.search(p.text) for p in heldout)


def test_bad_prompt_file(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        datasets.file_prompts(path)
