"""``saguaro chat`` fed from stdin, and chat prompt rendering."""

from __future__ import annotations

import io
import json
import shutil

import pytest
from tokenizers import processors

from saguaro import LLM, SamplingParams
from saguaro.cli import main
from saguaro.models.tokenizer import Tokenizer
from saguaro.server.chat import turn_summary
from tests.conftest import EOS, byte_tokenizer


def run(monkeypatch, capsys, argv: list[str], typed: str) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(typed))
    code = main(["chat", *argv])  # through the CLI, which turns errors into exit code 2
    out, err = capsys.readouterr()
    return code, out, err


def reply(llm: LLM, messages: list[dict[str, str]], max_tokens: int) -> str:
    ids = llm.tokenizer.encode_chat(messages)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return llm.generate(ids, params)[0].text


def test_chat_streams_each_turn_with_history_and_reports_metrics(tiny_llama, monkeypatch, capsys):
    argv = ["--model", str(tiny_llama), "--max-model-len", "256", "--max-tokens", "8"]
    typed = "hello\n\nhow are you?\n/reset\nhello\n/exit\nnever read\n"
    code, out, err = run(monkeypatch, capsys, [*argv, "--ignore-eos"], typed)
    assert code == 0

    offline = LLM(model=str(tiny_llama), max_model_len=256)
    first = reply(offline, [{"role": "user", "content": "hello"}], 8)
    history = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "how are you?"},
    ]
    second = reply(offline, history, 8)
    # /reset forgets the conversation: the third turn answers "hello" afresh.
    assert out.count(f"assistant> {first}\n") == 2 and f"assistant> {second}\n" in out
    assert out.startswith("you> ") and "never read" not in out + err

    summaries = [line for line in err.splitlines() if "tok/s" in line]
    assert len(summaries) == 3
    for line in summaries:
        assert "8 tokens" in line and "accepted length 1.00" in line
        assert "cache hit rate n/a" in line
    assert "prefix-cached prompt 0/" not in summaries[2]  # the first turn's prompt, reused
    assert "(conversation cleared)" in err


def test_chat_sd_shows_accepted_length(tiny_llama, monkeypatch, capsys):
    argv = ["--model", str(tiny_llama), "--draft", str(tiny_llama), "--mode", "sd"]
    argv += ["--max-model-len", "256", "--max-tokens", "10", "--ignore-eos"]
    argv += ["--draft-lookup", "0", "--draft-stop-below", "0"]  # the draft's own argmax chains
    code, out, err = run(monkeypatch, capsys, argv, "hi\n")
    assert code == 0 and out.count("assistant> ") == 1
    assert "accepted length 5.00" in err  # draft = target: every proposal accepted (k = 4)


def test_chat_survives_a_turn_that_overflows_the_context(tiny_llama, monkeypatch, capsys):
    argv = ["--model", str(tiny_llama), "--max-model-len", "48", "--max-tokens", "4"]
    code, out, err = run(monkeypatch, capsys, [*argv, "--ignore-eos"], "x" * 60 + "\nhi\n")
    assert code == 0
    assert "error: prompt has" in err and "/reset starts over" in err
    assert len([line for line in err.splitlines() if "tok/s" in line]) == 1  # "hi" answered


def test_chat_bad_flags_exit_2(tiny_llama, monkeypatch, capsys):
    code, _, err = run(monkeypatch, capsys, ["--model", str(tiny_llama), "--mode", "sd"], "")
    assert code == 2 and "needs a draft model" in err


def test_turn_summary_shows_ssd_cache_hit_rate():
    metrics = {
        "output_tokens": 30,
        "mean_accepted_length": 2.5,
        "cache_hit_rate": 0.75,
        "prompt_tokens": 40,
        "cached_prompt_tokens": 32,
    }
    assert turn_summary(metrics, 2.0) == (
        "30 tokens, 15.0 tok/s | accepted length 2.50 | cache hit rate 75% | "
        "prefix-cached prompt 32/40 tokens"
    )


@pytest.mark.parametrize("template_has_bos", [True, False])
def test_chat_prompt_has_exactly_one_bos(tiny_llama, tmp_path, template_has_bos):
    """A tokenizer that adds BOS itself, with a template that may also write it."""
    shutil.copytree(tiny_llama, tmp_path, dirs_exist_ok=True)
    tok = byte_tokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{EOS} $A", special_tokens=[(EOS, tok.token_to_id(EOS))]
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    config = {"bos_token": EOS, "eos_token": EOS}
    if template_has_bos:
        config["chat_template"] = (
            "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
        )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = Tokenizer(tmp_path)
    ids = tokenizer.encode_chat([{"role": "user", "content": "hi"}])
    bos = tokenizer.bos_token_id
    assert ids[0] == bos and ids.count(bos) == 1
    assert tokenizer.decode(ids) == ("<user>hi" if template_has_bos else "user: hi\nassistant:")
