"""The command line: generate in every mode, stream, and clear errors with exit code 2."""

from __future__ import annotations

import json
import shutil

import pytest

from saguaro import LLM, SamplingParams
from saguaro.cli import main


def test_generate_prints_completion_and_summary(tiny_llama, capsys):
    assert (
        main(
            [
                "generate",
                "def f",
                "--model",
                str(tiny_llama),
                "--max-tokens",
                "6",
                "--ignore-eos",
                "--max-model-len",
                "128",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert out.startswith("def f") and len(out) > len("def f\n")
    assert "6 tokens" in err and "tok/s" in err


def test_generate_sd_streams_and_reports_acceptance(tiny_llama, tiny_draft, capsys):
    args = [
        "generate",
        "def f",
        "--model",
        str(tiny_llama),
        "--draft",
        str(tiny_draft),
        "--mode",
        "sd",
        "--k",
        "3",
        "--max-tokens",
        "8",
        "--ignore-eos",
        "--stream",
        "--temperature",
        "0.8",
        "--seed",
        "1",
        "--max-model-len",
        "128",
    ]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert out.startswith("def f")
    assert "[sd]" in err and "mean accepted length" in err


def test_generate_ssd_with_flags(tiny_llama, tiny_draft, capsys):
    args = [
        "generate",
        "x",
        "--model",
        str(tiny_llama),
        "--draft",
        str(tiny_draft),
        "--mode",
        "ssd",
        "--k",
        "2",
        "--fanout",
        "2,1,1",
        "--backup",
        "fast",
        "--saguaro-c",
        "0.5",
        "--max-tokens",
        "6",
        "--ignore-eos",
        "--no-pin-cpus",
        "--max-model-len",
        "128",
    ]
    assert main(args) == 0
    assert "cache hit rate" in capsys.readouterr().err


def test_errors_exit_2_with_message(tiny_llama, capsys):
    assert main(["generate", "x", "--model", "/nonexistent/model"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["generate", "x", "--model", str(tiny_llama), "--top-p", "1.5"]) == 2
    assert "top_p" in capsys.readouterr().err
    assert main(["generate", "x", "--model", str(tiny_llama), "--mode", "sd"]) == 2
    assert "draft" in capsys.readouterr().err
    assert main(["generate", "x", "--model", str(tiny_llama), "--fanout", "1,2"]) == 2
    assert "fan-out" in capsys.readouterr().err


def test_sampling_method_and_top_m_reach_the_engine(tiny_llama, tiny_draft, capsys):
    """--sampling coupled gives SD the same seeded text as AR; --draft-top-m is passed on."""
    base = ["generate", "def f", "--model", str(tiny_llama), "--max-tokens", "10"]
    base += ["--ignore-eos", "--temperature", "0.9", "--seed", "3", "--max-model-len", "128"]
    assert main([*base, "--sampling", "coupled"]) == 0
    ar = capsys.readouterr().out
    spec = ["--draft", str(tiny_draft), "--mode", "sd", "--k", "3", "--draft-top-m", "5"]
    assert main([*base, *spec, "--sampling", "coupled"]) == 0
    assert capsys.readouterr().out == ar
    with pytest.raises(SystemExit, match="2"):
        main([*base, "--sampling", "nope"])


def test_generate_answers_an_instruct_model_in_its_chat_template(tiny_llama, tmp_path, capsys):
    """With a chat template the prompt is a user's turn (printed without the template), and
    --raw continues the text itself: the two differ, and the chat one is what the API gives for
    the templated ids."""
    shutil.copytree(tiny_llama, tmp_path, dirs_exist_ok=True)
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<bot>"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    base = ["generate", "def f", "--model", str(tmp_path), "--max-tokens", "6", "--ignore-eos"]
    assert main([*base, "--max-model-len", "128"]) == 0
    chat = capsys.readouterr().out
    assert main([*base, "--max-model-len", "128", "--raw"]) == 0
    raw = capsys.readouterr().out
    assert raw.startswith("def f") and not chat.startswith("def f")
    with LLM(model=str(tmp_path), max_model_len=128) as llm:
        ids = llm.tokenizer.encode_chat([{"role": "user", "content": "def f"}])
        assert llm.tokenizer.decode(ids) == "<user>def f<bot>"
        params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        assert chat == llm.generate(ids, params)[0].text + "\n"
