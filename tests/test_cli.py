"""The command line: generate in every mode, stream, and clear errors with exit code 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from saguaro import LLM, SamplingParams
from saguaro.cli import main
from tests.conftest import write_tiny_model

UNKNOWN_GGML_TYPE = 99  # no GGML tensor type has this number


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


def _gguf(path: Path, arch: str, ggml_type: int | None = None) -> Path:
    """A GGUF file of one float tensor: of architecture ``arch``, its type number patched to
    ``ggml_type`` where given."""
    name = "token_embd.weight"
    w = gguf.GGUFWriter(path, arch)
    w.add_tensor(name, np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if ggml_type is not None:  # the tensor's info: name, n_dims (u32), dims (u64 each), type
        data = bytearray(path.read_bytes())
        at = data.index(name.encode()) + len(name) + 4 + 2 * 8
        data[at : at + 4] = ggml_type.to_bytes(4, "little")
        path.write_bytes(bytes(data))
    return path


def _fails_with(argv: list[str], capsys, *words: str) -> str:
    """``saguaro ARGV`` exits 2 with one line on stderr naming the problem, not a traceback."""
    capsys.readouterr()  # what came before (a fixture's progress bars)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"saguaro {argv[0]}: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and all(w in err for w in words), err
    return err


def test_a_missing_or_unreadable_model_is_one_line(tiny_llama, tmp_path, capsys):
    _fails_with(["generate", "x", "--model", "no-such-model"], capsys, "no-such-model")
    _fails_with(["generate", "x", "--model", str(tmp_path / "absent")], capsys, "does not exist")
    mamba = _gguf(tmp_path / "mamba.gguf", "mamba")
    _fails_with(["generate", "x", "--model", str(mamba)], capsys, "architecture 'mamba'")
    _fails_with(["import-gguf", str(mamba), str(tmp_path / "out")], capsys, "'mamba'")
    odd = _gguf(tmp_path / "odd.gguf", "llama", ggml_type=UNKNOWN_GGML_TYPE)
    _fails_with(["chat", "--model", str(odd)], capsys, f"unknown GGML type {UNKNOWN_GGML_TYPE}")


def test_bench_hf_assisted_refuses_what_transformers_cannot_load(tiny_llama, tmp_path, capsys):
    bench = ["bench", "--modes", "hf-assisted", "--out", str(tmp_path / "out")]
    target = _gguf(tmp_path / "t.gguf", "llama")
    _fails_with([*bench, "--model", str(target), "--draft", str(tiny_llama)], capsys, "t.gguf")
    wide = write_tiny_model(tmp_path / "wide", "llama", vocab_size=300)
    _fails_with([*bench, "--model", str(tiny_llama), "--draft", str(wide)], capsys, "vocab_size")
    reduced = tmp_path / "reduced"
    shutil.copytree(tiny_llama, reduced)
    config = json.loads((reduced / "config.json").read_text())
    (reduced / "config.json").write_text(json.dumps({**config, "draft_vocab_size": 100}))
    _fails_with([*bench, "--model", str(tiny_llama), "--draft", str(reduced)], capsys, "reduced")


def test_an_error_exits_2_with_no_traceback_from_the_shell(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "saguaro", "generate", "x", "--model", str(tmp_path / "absent")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("saguaro generate: error: ") and "does not exist" in done.stderr
