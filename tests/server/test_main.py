"""``saguaro serve``: its options come from ServerConfig and EngineConfig; bad settings exit 2;
it reports its KV cache at start-up."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from saguaro.cli import main
from saguaro.config import EngineConfig
from saguaro.options import flag, from_args
from saguaro.server.main import API_KEY_ENV, ServerConfig, serve_parser


def test_serve_help_lists_every_server_option(capsys):
    with pytest.raises(SystemExit) as done:
        main(["serve", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(ServerConfig):
        assert flag(f.name) in out
    assert "--max-model-len" in out  # and the engine's


def test_server_options_build_a_server_config(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert from_args(ServerConfig, serve_parser().parse_args([])) == ServerConfig(
        host="127.0.0.1", port=8000, api_key=None, served_model_name=None, shutdown_grace_s=10.0
    )
    argv = "--host 0.0.0.0 --port 9000 --api-key k --served-model-name m --max-waiting 8 "
    argv += "--shutdown-grace-s 2.5"
    assert from_args(ServerConfig, serve_parser().parse_args(argv.split())) == ServerConfig(
        "0.0.0.0", 9000, "k", "m", 8, 2.5
    )


def test_api_key_defaults_to_the_environment(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert from_args(ServerConfig, serve_parser().parse_args([])).api_key == "from-env"
    given = serve_parser().parse_args(["--api-key", "given"])
    assert from_args(ServerConfig, given).api_key == "given"


def test_bad_engine_settings_exit_2(capsys):
    assert main(["serve", "--model", "/nonexistent/model"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("saguaro serve: error:") and "does not exist" in err
    assert main(["serve", "--max-waiting", "-1"]) == 2
    assert "max_waiting must be >= 0" in capsys.readouterr().err


def test_serve_reports_its_kv_cache_at_start_up(tiny_llama):
    """The first line a real ``saguaro serve`` writes, before it listens: the KV pool's blocks,
    tokens, memory and how many full-length sequences it holds."""
    cmd = [sys.executable, "-m", "saguaro", "serve", "--model", str(tiny_llama), "--port", "0"]
    cmd += ["--max-model-len", "128", "--num-kv-blocks", "40", "--block-size", "16"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
    finally:
        proc.kill()
        proc.wait()
    assert line.startswith("saguaro serve: KV cache 40 blocks of 16 tokens (640 tokens, "), line
    assert line.rstrip().endswith("GiB): 5.0 sequences of max_model_len 128"), line


def test_a_server_prefaults_its_kv_pools_and_falls_back_to_ar_by_default_and_an_engine_does_not():
    assert serve_parser().parse_args([]).kv_prefault is True
    assert serve_parser().parse_args(["--no-kv-prefault"]).kv_prefault is False
    assert EngineConfig.kv_prefault is False
    assert serve_parser().parse_args([]).ar_fallback is True
    assert serve_parser().parse_args(["--no-ar-fallback"]).ar_fallback is False
    assert EngineConfig.ar_fallback is False
