"""Backends: the SSD backend keeps measuring once its draft worker has failed."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys

import pytest

from saguaro.bench import backends, bench_main
from saguaro.bench import main as bench_main_module
from saguaro.bench.backends import SaguaroBackend
from saguaro.bench.config import DEFAULT_MODES, PEER_MODES, BenchConfig, parse_config
from saguaro.bench.plan import Variant, build_variants
from saguaro.cli import main
from saguaro.models.gguf_import import GGUF_NAME
from saguaro.models.tokenizer import Tokenizer
from saguaro.sampling import SamplingParams
from tests.bench.conftest import args


def test_ssd_backend_after_its_worker_failed(tiny_llama, close_draft):
    """Once the draft worker is gone the engine runs AR; the bench keeps measuring and says so."""
    cfg = BenchConfig(model=str(tiny_llama), draft=str(close_draft), device="cpu")
    backend = SaguaroBackend(Variant("ssd", 2, "auto", "ssd"), cfg, 128, 2)
    params = [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)]
    try:
        assert backend.generate([[1, 2, 3]], params).ssd_totals["rounds"] > 0
        backend.llm.engine._drop_proposer(RuntimeError("worker gone"))
        gen = backend.generate([[1, 2, 3]], params)
    finally:
        backend.close()
    assert len(gen.requests[0].token_ids) == 8
    assert gen.ssd_totals is None and "worker gone" in gen.draft_failure


# ---- llama.cpp peers -----------------------------------------------------------------------------
# The GGUF files' correctness is tested in test_gguf_export.py (gguf is a dev dependency). Running
# llama.cpp needs the `peer` extra, which CI does not install: the one test that does is marked
# `requires_peer` and says so when skipped; scripts/llamacpp_peer.py runs the peers end to end.

requires_peer = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="requires the `peer` extra (llama-cpp-python), which CI does not install",
)


def test_peers_run_only_when_named():
    assert not set(PEER_MODES) & set(BenchConfig().modes) and DEFAULT_MODES == BenchConfig().modes
    cfg = parse_config(["--modes", "ar,llama.cpp", "--k", "2,4", "--sampling", "rejection,coupled"])
    assert [v.label for v in build_variants(cfg)] == [
        "ar rejection", "ar coupled", "llama.cpp",
    ]  # fmt: skip
    cfg = parse_config(["--modes", "llama.cpp-sd", "--k", "2,4", "--llama-cpp-bin", "/x"])
    assert [(v.mode, v.k) for v in build_variants(cfg)] == [
        ("llama.cpp-sd", 2), ("llama.cpp-sd", 4),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="--llama-cpp-bin"):
        BenchConfig(modes=("llama.cpp-sd",))
    with pytest.raises(ValueError, match="--llama-cpp-dtype"):
        BenchConfig(llama_cpp_dtype="q4_0")


def test_llama_cpp_without_the_package_is_a_clear_error(
    tiny_llama, tiny_draft, prompt_file, tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp raises ImportError
    with pytest.raises(ImportError, match=r"saguaro-decoding\[peer\]"):
        backends.import_llama_cpp()
    argv = args(tiny_llama, tiny_draft, prompt_file, tmp_path / "out", "--modes", "ar,llama.cpp")
    assert main(["bench", *argv]) == 2  # the CLI turns the ImportError into a line on stderr
    err = capsys.readouterr().err
    assert "mode llama.cpp needs llama-cpp-python" in err and "saguaro-decoding[peer]" in err


def test_peer_differences_are_reported_not_failed(
    tiny_llama, tiny_draft, prompt_file, tmp_path, monkeypatch
):
    """A peer that leaves AR's tokens after a near-tie does not fail the run: the check reports
    its matching prefixes."""

    class Diverging(SaguaroBackend):
        def generate(self, prompts, params):
            gen = super().generate(prompts, params)
            gen.requests[0].token_ids[3] += 1
            gen.requests[0].text = None  # ids only, as llama.cpp's AR peer
            return gen

    def fake_peer(v, cfg, target_dir, draft_dir, max_model_len):
        return Diverging(Variant("ar", label=v.label), cfg, max_model_len, 1)

    monkeypatch.setattr(bench_main_module, "peer_backend", fake_peer)
    out = tmp_path / "out"
    argv = args(
        tiny_llama, tiny_draft, prompt_file, out,
        "--modes", "ar,sd,llama.cpp", "--batch-sizes", "1", "--temperatures", "0",
    )  # fmt: skip
    assert bench_main(argv) == 0
    check = json.loads((out / "results.json").read_text())["correctness"]
    assert check["ok"] is True and check["checked"] == 2  # sd's requests
    peer = check["peers"]["llama.cpp"]
    assert peer["checked"] == 2 and peer["identical"] == 0
    assert peer["matching_prefix"] == [3, 3] and peer["mean_prefix_fraction"] == 3 / 8
    assert peer["unit"] == ["tokens"]  # llama.cpp's AR peer returns ids: compared by tokens


def test_a_peer_with_text_is_compared_by_text():
    """llama.cpp-sd's ids are its text tokenised again: the same text in other tokens is a match;
    a different text reports its matching characters."""
    from saguaro.bench.check import peer_agreement, peer_prefix

    ar = backends.RequestResult("p", [1, 2, 3], 1.0, 0.1, 0.1, "abcdef")
    same_text = backends.RequestResult("p", [1, 5], 1.0, 0.1, 0.1, "abcdefgh")  # K tokens past
    other = backends.RequestResult("p", [1, 2, 3], 1.0, 0.1, 0.1, "abcxyz")
    assert peer_prefix(ar, same_text) == (6, 6, "chars")
    assert peer_prefix(ar, other) == (3, 6, "chars")
    agreement = peer_agreement([peer_prefix(ar, same_text), peer_prefix(ar, other)])
    assert agreement["identical"] == 1 and agreement["mean_prefix_fraction"] == 0.75


def test_gguf_cache_is_written_once_per_checkpoint(tiny_llama, tmp_path):
    pytest.importorskip("gguf", reason="gguf is a dev dependency")
    first = backends.cached_gguf(tiny_llama, tmp_path, "f32")
    stamp = first.stat().st_mtime_ns
    again = backends.cached_gguf(tiny_llama, tmp_path, "f32")
    assert again == first and again.stat().st_mtime_ns == stamp
    assert backends.cached_gguf(tiny_llama, tmp_path, "f16") != first
    assert first.name.startswith(tiny_llama.name) and first.name.endswith("-f32.gguf")


def test_the_peers_run_a_directorys_own_gguf_file(tiny_llama, tmp_path):
    """llama.cpp runs the very file saguaro's kernels run where the directory keeps one (an
    imported GGUF model), not a float32 export of its dequantized weights."""
    model = tmp_path / "imported"
    shutil.copytree(tiny_llama, model)
    exported = backends.peer_gguf(model, tmp_path / "cache", "f32")
    assert exported.parent == tmp_path / "cache" and exported.name.endswith("-f32.gguf")
    shutil.copy(exported, model / GGUF_NAME)
    assert backends.peer_gguf(model, tmp_path / "cache", "f32") == model / GGUF_NAME


FAKE_SPEC_BINARY = """\
#!{python}
# Stands in for llama-speculative-simple: echoes the prompt, then a fixed continuation, to
# stdout; timings and counts to stderr, in the binary's format. Records its arguments.
import json, sys
argv = sys.argv[1:]
json.dump(argv, open({log!r}, "a")); open({log!r}, "a").write("\\n")
prompt = argv[argv.index("-p") + 1]
sys.stdout.write("\\n\\n" + prompt + " = 1 + 2 + 3\\n\\n\\n\\n")
sys.stderr.write(
    "main: encoded   12 tokens in    0.250 seconds, speed:   48.000 t/s\\n"
    "main: decoded   10 tokens in    0.500 seconds, speed:   20.000 t/s\\n\\n"
    "main: n_draft   = 4\\nmain: n_predict = 10\\nmain: n_drafted = 8\\nmain: n_accept  = 6\\n"
)
"""


def test_spec_peer_drives_the_binary(tiny_llama, tiny_draft, tmp_path):
    """The llama.cpp-sd backend's plumbing, against a stand-in for the binary: the command line
    (K, threads, greedy sampling, no early draft stop), the text parsed back into our tokens, the
    binary's timings."""
    pytest.importorskip("gguf", reason="gguf is a dev dependency")
    bin_dir, log = tmp_path / "bin", tmp_path / "argv.jsonl"
    bin_dir.mkdir()
    fake = bin_dir / backends.SPEC_BINARY
    fake.write_text(FAKE_SPEC_BINARY.format(python=sys.executable, log=str(log)))
    fake.chmod(0o755)
    cfg = BenchConfig(
        model=str(tiny_llama), draft=str(tiny_draft), modes=("llama.cpp-sd",),
        llama_cpp_bin=str(bin_dir), llama_cpp_cache=str(tmp_path / "cache"), llama_cpp_threads=3,
    )  # fmt: skip
    backend = backends.peer_backend(
        Variant("llama.cpp-sd", 4, label="llama.cpp-sd"), cfg, tiny_llama, tiny_draft, 128
    )
    tok = Tokenizer(tiny_llama)
    # a prompt led by BOS (a chat template's): the binary adds its own and does not echo it
    prompts = [tok.encode("x = "), tok.encode("y = "), [tok.bos_token_id, *tok.encode("z = ")]]
    params = [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)] * 3
    gen = backend.generate(prompts, params)

    cont = tok.encode(" = 1 + 2 + 3", add_special_tokens=False)
    assert [r.token_ids for r in gen.requests] == [cont[:8]] * 3
    assert [r.text for r in gen.requests] == [" = 1 + 2 + 3"] * 3
    assert [r.ttft_s for r in gen.requests] == [0.25, 1.0, 1.75]
    assert [r.latency_s for r in gen.requests] == [0.75, 1.5, 2.25] and gen.elapsed_s == 2.25
    assert gen.requests[0].tpot_s == pytest.approx(0.05)
    assert gen.peer_stats["n_accept"] == 18 and gen.peer_stats["decoded_tokens"] == 30
    bos_led = json.loads(log.read_text().splitlines()[2])
    assert bos_led[bos_led.index("-p") + 1] == "z = "
    argv = json.loads(log.read_text().splitlines()[0])
    opt = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("-")}
    assert opt["-p"] == "x = " and opt["-n"] == "8" and opt["--spec-draft-n-max"] == "4"
    assert opt["-t"] == opt["-td"] == "3" and opt["--temp"] == "0" and opt["--top-k"] == "1"
    assert opt["--spec-draft-p-min"] == "0" and opt["--spec-type"] == "draft-simple"
    assert "--ignore-eos" in argv
    assert opt["-m"].endswith("-f32.gguf") and opt["-md"].endswith("-f32.gguf")


def test_spec_output_without_timings_is_an_error():
    with pytest.raises(RuntimeError, match="no timings"):
        backends.parse_spec_output("\n\nx", "error: something", "x")


@requires_peer
def test_llama_cpp_reproduces_greedy_tokens(tiny_llama, tmp_path):
    """End to end (needs the `peer` extra): llama.cpp on the exported GGUF produces saguaro's
    greedy tokens on the tiny model, whose peaked distributions leave no near-ties."""
    cfg = BenchConfig(
        model=str(tiny_llama), device="cpu", llama_cpp_cache=str(tmp_path), llama_cpp_threads=1
    )
    variant = Variant("llama.cpp", label="llama.cpp")
    peer = backends.peer_backend(variant, cfg, tiny_llama, None, 128)
    ours = SaguaroBackend(Variant("ar", label="ar"), cfg, 128, 1)
    # Prompts whose 24 greedy steps have clear winners (from [200], step 19 is a near-tie: top-2
    # logits 11.279 and 11.276, where llama.cpp's rounding may pick either).
    prompts = [[1, 2, 3], list(b"def add(a, b):")]
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)] * 2
    try:
        want = [r.token_ids for r in ours.generate(prompts, params).requests]
        got = [r.token_ids for r in peer.generate(prompts, params).requests]
    finally:
        ours.close()
        peer.close()
    assert got == want


def test_every_mode_computes_on_the_cores_ssd_uses_together(tiny_llama, close_draft):
    """Equal hardware: after an SSD engine ran on its target's core, AR runs on every core with a
    thread each, and the '1 core' baseline on one core with one thread."""
    from saguaro import placement

    cores = placement.process_cpus()
    assert len(cores) >= 2, "placement is tested on two cores or more"
    cfg = BenchConfig(model=str(tiny_llama), draft=str(close_draft), device="cpu")
    params = [SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)]
    made = [
        SaguaroBackend(Variant("ssd", 2, "auto", "ssd"), cfg, 128, 1),
        SaguaroBackend(Variant("ar", label="ar"), cfg, 128, 1),
        SaguaroBackend(Variant("ar", label="ar 1 core", one_core=True), cfg, 128, 1),
    ]
    try:
        seen = []
        for backend in made:
            backend.generate([[1, 2, 3]], params)
            seen.append(placement.current())
        backends.every_core(object())  # what the peers and transformers run on
        seen.append(placement.current())
    finally:
        for backend in reversed(made):
            backend.close()
    ssd, ar, one, peer = seen
    assert len(ssd.cpus) == ssd.threads == 1  # the worker has the other core
    assert ar == peer == placement.Placement(tuple(cores), len(cores))
    assert one == placement.Placement(tuple(cores[:1]), 1)
