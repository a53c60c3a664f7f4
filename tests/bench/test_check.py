"""The greedy check: a mode whose temperature-0 tokens differ from AR's fails the run."""

from __future__ import annotations

import json

from saguaro.bench import backends, bench_main
from saguaro.bench.check import first_difference
from tests.bench.conftest import args


def test_guard_flags_a_wrong_mode(
    tiny_llama, tiny_draft, prompt_file, tmp_path, monkeypatch, capsys
):
    real = backends.SaguaroBackend.generate

    def corrupted(self, prompts, params):
        gen = real(self, prompts, params)
        if self.variant.mode == "sd":
            gen.requests[0].token_ids[3] += 1
        return gen

    monkeypatch.setattr(backends.SaguaroBackend, "generate", corrupted)
    out = tmp_path / "out"
    argv = args(
        tiny_llama, tiny_draft, prompt_file, out,
        "--modes", "ar,sd", "--batch-sizes", "1", "--temperatures", "0",
    )  # fmt: skip
    assert bench_main(argv) == 1
    res = json.loads((out / "results.json").read_text())
    assert res["correctness"]["ok"] is False
    mismatches = res["correctness"]["mismatches"]
    assert len(mismatches) == 2  # the first request of each batch, at batch size 1
    for m in mismatches:
        assert m["variant"] == "sd" and m["first_difference"] == 3 and m["batch_size"] == 1
    assert "CORRECTNESS FAILURE" in (out / "results.md").read_text()
    assert "CORRECTNESS FAILURE" in capsys.readouterr().err


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # a prefix: differs where it ends
