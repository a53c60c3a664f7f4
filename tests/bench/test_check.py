"""The greedy check: a mode whose temperature-0 tokens differ from AR's fails the run."""

from __future__ import annotations

import json

from saguaro.bench import backends, bench_main
from saguaro.bench.backends import Generation, RequestResult
from saguaro.bench.check import check_greedy, first_difference
from saguaro.bench.config import parse_config
from saguaro.bench.measure import Run
from saguaro.bench.plan import build_variants
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


def _run(variant: str, tokens: list[int]) -> Run:
    request = RequestResult("p", tokens, latency_s=1.0, ttft_s=None, tpot_s=None)
    return Run("d", 0.0, 1, variant, repeat=0, batch_index=0, gen=Generation(1.0, [request]))


def test_each_dtype_is_checked_against_its_own_ar():
    """A bfloat16 target is another model than its float32 weights: bfloat16 modes must match
    AR in bfloat16, and may differ from AR in float32."""
    cfg = parse_config(["--modes", "ar,sd", "--dtypes", "float32,bfloat16"])
    variants = build_variants(cfg)
    f32, bf16 = [1, 2, 3, 4], [1, 2, 9, 9]
    runs = [
        _run("ar float32", f32),
        _run("ar bfloat16", bf16),
        _run("sd float32", f32),
        _run("sd bfloat16", bf16),
    ]
    result = check_greedy(runs, variants)
    assert result["ok"] is True and result["checked"] == 2
    runs[3] = _run("sd bfloat16", f32)  # float32's tokens from the bfloat16 engine: wrong
    result = check_greedy(runs, variants)
    assert result["ok"] is False
    (mismatch,) = result["mismatches"]
    assert mismatch["variant"] == "sd bfloat16" and mismatch["first_difference"] == 2
