"""Shared by the bench tests: a two-line prompt file and the argv of a tiny bench run."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [{"prompt": "def add(a, b):"}, {"id": "imports", "prompt": "import os\nimport sys\n"}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def args(model, draft, prompts, out, *extra: str) -> list[str]:
    return [
        "--model", str(model), "--draft", str(draft), "--prompts", str(prompts),
        "--num-prompts", "2", "--max-tokens", "8", "--out", str(out), *extra,
    ]  # fmt: skip
