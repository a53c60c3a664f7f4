"""`saguaro bench` on tiny models: the report's structure, the greedy correctness guard, the
derived metrics, prompt selection and flag handling."""

from __future__ import annotations

import json

import pytest

from saguaro.bench import bench_main, datasets, runner
from saguaro.bench.report import PLOTS, SCHEMA
from saguaro.core.records import RoundRecord

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ROW_FIELDS = {
    "dataset",
    "temperature",
    "batch_size",
    "variant",
    "mode",
    "requests",
    "output_tokens",
    "tokens_per_s",
    "request_tokens_per_s",
    "ttft_s",
    "tpot_s",
    "latency_p50_s",
    "latency_p90_s",
    "mean_accepted_length",
    "cache_hit_rate",
    "bonus_accuracy",
    "speedup_vs_ar",
    "speedup_vs_sd",
    "predicted_speedup",
}


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


def test_bench_writes_report(tiny_llama, prompt_file, tmp_path):
    out = tmp_path / "out"
    # The target drafts for itself: every proposal is accepted, so even 8-token requests have
    # full rounds followed by another round, which bonus accuracy needs. A fixed fan-out: the
    # planner would rightly build no cache for a draft as costly as its target.
    argv = args(
        tiny_llama, tiny_llama, prompt_file, out, "--k", "2", "--fanout", "2",
        "--modes", "ar,sd,ssd,hf-assisted", "--batch-sizes", "1,2", "--temperatures", "0,1",
    )  # fmt: skip
    assert bench_main(argv) == 0

    res = json.loads((out / "results.json").read_text())
    assert res["schema"] == SCHEMA
    assert res["command"].startswith("saguaro bench --model")
    assert res["argv"][2:] == argv
    assert {"cpu_count", "target_cpus", "torch_threads", "load_average"} <= set(res["machine"])
    assert res["versions"]["torch"] and "transformers" in res["versions"]
    assert "git" in res and res["config"]["max_tokens"] == 8
    assert res["models"]["target"]["params"] > 0 and res["models"]["draft"]["path"]
    chosen = datasets.select(datasets.file_prompts(prompt_file), 2, seed=0, name="prompts")
    assert res["prompts"]["prompts"]["ids"] == [p.id for p in chosen]
    # Greedy guard: 3 modes x (2 requests at b=1 + 2 at b=2) compared with AR, all equal.
    assert res["correctness"] == {"ok": True, "checked": 12, "mismatches": []}

    rows = res["results"]
    assert len(rows) == 4 * 2 * 2  # variants x batch sizes x temperatures
    assert all(ROW_FIELDS <= set(r) for r in rows)
    assert all(r["output_tokens"] == 8 * r["requests"] for r in rows)  # same output length
    by = {(r["variant"], r["batch_size"], r["temperature"]): r for r in rows}
    assert by[("ar", 1, 0.0)]["speedup_vs_ar"] == 1.0
    assert by[("ar", 1, 0.0)]["mean_accepted_length"] is None
    ssd = by[("ssd", 1, 0.0)]
    assert ssd["speedup_vs_sd"] is not None and ssd["predicted_speedup"] > 0
    assert 0 <= ssd["cache_hit_rate"] <= 1 and 0 <= ssd["bonus_accuracy"] <= 1
    assert {"fanout", "budget", "policy"} <= set(ssd["ssd"])
    costs = ssd["round_costs"]
    assert costs["rounds"] > 0 and costs["round"] > 0 and costs["target_forward"] > 0
    parts = costs["target_forward"] + costs["target_other"] + costs["waited"]
    assert parts == pytest.approx(costs["round"]) and costs["target_other"] > 0
    assert costs["build"] == pytest.approx(costs["glue"] + costs["branches"])
    assert by[("sd", 1, 0.0)]["round_costs"] is None
    for variant in ("ar", "sd", "ssd"):  # every saguaro mode's step, part by part
        steps = by[(variant, 1, 1.0)]["step_costs"]
        parts = steps["forward"] + steps["draft"] + steps["verify"] + steps["other"]
        assert (
            steps["forward"] > 0 and steps["verify"] > 0 and parts == pytest.approx(steps["step"])
        )
        assert 0 < steps["outside"] < 1
    assert by[("hf-assisted", 1, 0.0)]["step_costs"] is None
    for mode in ("sd", "ssd", "hf-assisted"):
        assert by[(mode, 2, 1.0)]["mean_accepted_length"] >= 1
    # Interleaved: within one batch of prompts the modes follow each other A B C D.
    order = [r["variant"] for r in res["runs"][:8]]
    assert order == ["ar", "sd", "ssd", "hf-assisted"] * 2

    md = (out / "results.md").read_text()
    assert "Greedy correctness check: passed" in md
    assert "| batch | mode | tok/s |" in md and "| 2 | hf-assisted |" in md
    assert "| dataset | T | batch | ar tok/s | sd tok/s | ssd tok/s | hf-assisted tok/s |" in md
    assert "acc. len (sd / ssd / hf-assisted) |" in md
    assert "| prompts | 1 | 2 |" in md
    assert "**SSD round breakdown**" in md and "| prompts | 0 | 2 | ssd |" in md
    assert "**Step breakdown**" in md and "| prompts | 1 | 1 | sd |" in md
    assert res["command"] in md
    for name in PLOTS:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
        assert f"]({name})" in md


def test_guard_flags_a_wrong_mode(
    tiny_llama, tiny_draft, prompt_file, tmp_path, monkeypatch, capsys
):
    real = runner.SaguaroBackend.generate

    def corrupted(self, prompts, params):
        gen = real(self, prompts, params)
        if self.variant.mode == "sd":
            gen.requests[0].token_ids[3] += 1
        return gen

    monkeypatch.setattr(runner.SaguaroBackend, "generate", corrupted)
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


def test_bonus_counts_pair_each_full_round_with_the_next():
    def rec(drafted: int, accepted: int, hit: bool | None) -> RoundRecord:
        return RoundRecord(drafted, accepted, token=0, committed=accepted + 1, hit=hit)

    records = [
        rec(4, 4, None),  # all accepted; the next round hit: its bonus token was predicted
        rec(4, 4, True),  # all accepted; the next round missed
        rec(4, 1, False),  # partial: not counted
        rec(4, 0, True),
        rec(0, 0, False),  # nothing drafted: not counted
        rec(4, 4, False),  # all accepted, but the last round
    ]
    assert runner.bonus_counts(records) == (2, 1)


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


def test_quick_preset_yields_to_explicit_flags():
    cfg = runner.parse_config(["--quick", "--max-tokens", "16"])
    assert cfg.max_tokens == 16 and cfg.batch_sizes == (1, 4) and cfg.modes == ("ar", "sd", "ssd")
    assert cfg.temperatures == (0.0,) and cfg.datasets == ("humaneval",)
    full = runner.parse_config(["--k", "2,4", "--fanout", "auto", "2,1,1"])
    labels = [v.label for v in runner.build_variants(full)]
    assert labels == [
        "ar", "sd k=2", "sd k=4", "ssd k=2 f=2,1,1", "ssd k=2 f=auto", "ssd k=4 f=auto",
        "hf-assisted k=2", "hf-assisted k=4",
    ]  # fmt: skip
    assert runner.parse_config(["--prompts", "x.jsonl"]).datasets == ()
    swept = runner.build_variants(runner.parse_config(["--modes", "ssd", "--saguaro-c", "1,0.5"]))
    assert [(v.label, v.saguaro_c) for v in swept] == [("ssd c=1", 1.0), ("ssd c=0.5", 0.5)]
    with pytest.raises(ValueError, match="saguaro-c"):
        runner.parse_config(["--saguaro-c", "0"])


def test_prediction_is_converted_to_this_machines_ar_step():
    """DESIGN §7 counts in verifications; an AR step here costs less than a verification."""

    def row(mode, **kw):
        fields = {f: None for f in runner.Row.__dataclass_fields__}
        fields.update(dataset="d", temperature=0.0, batch_size=1, variant=mode, mode=mode)
        fields.update(requests=1, output_tokens=1, elapsed_s=1.0, tokens_per_s=1.0, k=None)
        fields.update(draft_failures=[], speculation={}, **kw)
        return runner.Row(**fields)

    ssd = row("ssd", predicted_speedup=2.0, round_costs={"target_forward": 15.0})
    ar = row("ar", tpot_s=0.010)
    assert runner._on_this_machine(ssd, ar) == pytest.approx(2.0 * 10 / 15)
    assert runner._on_this_machine(ssd, None) is None


def test_ssd_backend_after_its_worker_failed(tiny_llama, close_draft):
    """Once the draft worker is gone the engine runs AR; the bench keeps measuring and says so."""
    cfg = runner.BenchConfig(model=str(tiny_llama), draft=str(close_draft), device="cpu")
    backend = runner.SaguaroBackend(runner.Variant("ssd", 2, "auto", "ssd"), cfg, 128, 2)
    params = [runner.SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)]
    try:
        assert backend.generate([[1, 2, 3]], params).ssd_totals["rounds"] > 0
        backend.llm.engine._drop_proposer(RuntimeError("worker gone"))
        gen = backend.generate([[1, 2, 3]], params)
    finally:
        backend.close()
    assert len(gen.requests[0].token_ids) == 8
    assert gen.ssd_totals is None and "worker gone" in gen.draft_failure


def test_sampling_methods_side_by_side(tiny_llama, tiny_draft, prompt_file, tmp_path):
    """--sampling rejection,coupled: a variant per method and mode, each compared with AR under
    its own method; the greedy check still finds its AR reference."""
    out = tmp_path / "out"
    argv = args(
        tiny_llama, tiny_draft, prompt_file, out, "--modes", "ar,sd", "--batch-sizes", "1",
        "--temperatures", "0,1", "--sampling", "rejection,coupled", "--top-p", "0.9",
    )  # fmt: skip
    assert bench_main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    labels = {r["variant"]: r["sampling"] for r in res["results"]}
    assert labels == {
        "ar rejection": "rejection",
        "ar coupled": "coupled",
        "sd rejection": "rejection",
        "sd coupled": "coupled",
    }
    assert res["correctness"]["ok"] is True and res["correctness"]["checked"] == 6
    for r in res["results"]:
        assert r["speedup_vs_ar"] is not None  # found the AR row of the same method
