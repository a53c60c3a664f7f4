"""A draft with a reduced output vocabulary (its LM head scores a subset of the target's tokens,
q = 0 elsewhere): its logits are its full self's on the subset and -inf off it, and SD and SSD
stay exact with it: greedy output equals AR's, and at T > 0 the first two tokens follow the
target's law (TV below the noise floor), under rejection and coupled verification, including
tokens the draft can never propose."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from saguaro import LLM, SamplingParams
from saguaro.engine.model_runner import ModelRunner
from saguaro.errors import ModelLoadError
from saguaro.models.loader import load_model
from tests.conftest import PROMPTS, SMALL_VOCAB
from tests.speculation.test_sd import check_sd_first_two
from tests.speculation.test_ssd import check_first_two


def reduced_copy(src: Path, dst: Path, token_ids: list[int]) -> Path:
    """``src`` with its LM head cut to the rows of ``token_ids``."""
    shutil.copytree(src, dst, dirs_exist_ok=True)
    weights = load_file(str(src / "model.safetensors"))
    ids = torch.tensor(token_ids)
    rows = ids.clamp(max=weights["lm_head.weight"].shape[0] - 1)  # bad ids still get a row
    weights["lm_head.weight"] = weights["lm_head.weight"][rows].contiguous()
    weights["lm_head.token_ids"] = ids
    save_file(weights, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["draft_vocab_size"] = len(token_ids)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def prefill_logits(model_dir: Path, ids: list[int], **load) -> torch.Tensor:
    """The logits of every position of ``ids`` from ``load_model(model_dir, **load)``."""
    runner = ModelRunner(load_model(model_dir, **load), num_blocks=8, block_size=16, device="cpu")
    with torch.no_grad():
        return runner.forward([runner.sequence_query(list(range(8)), 0, ids, len(ids))])


def greedy_outputs(target: Path, **engine) -> list:
    """The outputs of ``PROMPTS``, greedy, from ``target`` with the engine's ``engine`` settings
    (none: AR)."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    with LLM(model=str(target), max_model_len=256, **engine) as llm:
        return llm.generate(PROMPTS, params)


@pytest.fixture(scope="module")
def reduced_draft(close_draft, tmp_path_factory):
    """``close_draft`` over every other byte token (and EOS): half the vocabulary it never
    proposes."""
    keep = [*range(0, 256, 2), 256]
    return reduced_copy(close_draft, tmp_path_factory.mktemp("reduced"), keep), keep


def test_reduced_logits_are_the_full_heads_on_the_subset_and_minus_inf_off_it(
    close_draft, reduced_draft
):
    path, keep = reduced_draft
    ids = list(b"def add(a, b):\n    return a + b")
    full, reduced = prefill_logits(close_draft, ids), prefill_logits(path, ids)
    assert reduced.shape == full.shape
    torch.testing.assert_close(reduced[:, keep], full[:, keep], rtol=1e-5, atol=1e-5)
    off = torch.ones(full.shape[1], dtype=torch.bool)
    off[keep] = False
    assert torch.isneginf(reduced[:, off]).all()


def test_bad_token_ids_are_refused(close_draft, tmp_path):
    with pytest.raises(ModelLoadError, match="repeats a token"):
        load_model(reduced_copy(close_draft, tmp_path / "dup", [1, 2, 2]))
    with pytest.raises(ModelLoadError, match="outside"):
        load_model(reduced_copy(close_draft, tmp_path / "out", [1, 999]))


@pytest.mark.parametrize("mode", ["sd", "ssd"])
@pytest.mark.parametrize("sampling", ["rejection", "coupled"])
def test_greedy_with_a_reduced_draft_equals_ar(tiny_llama, reduced_draft, mode, sampling):
    ar = greedy_outputs(tiny_llama)
    draft = dict(draft=str(reduced_draft[0]), mode=mode, sampling=sampling)
    outs = greedy_outputs(tiny_llama, **draft, num_speculative_tokens=3)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ar]
    # The target's own tokens include some the draft cannot propose, and yet it accepts.
    committed = {t for o in outs for t in o.token_ids}
    assert committed - set(reduced_draft[1])
    assert sum(o.metrics["accepted"] for o in outs) > 0


@pytest.fixture(scope="module")
def small_reduced(small_vocab_pair, tmp_path_factory):
    """The small-vocabulary pair's close draft without tokens 1 and 4 (of 8)."""
    target, close, _ = small_vocab_pair
    keep = [t for t in range(SMALL_VOCAB) if t not in (1, 4)]
    return target, reduced_copy(close, tmp_path_factory.mktemp("r8"), keep)


@pytest.mark.slow
@pytest.mark.parametrize("sampling", ["rejection", "coupled"])
def test_sd_first_two_tokens_follow_the_target_with_a_reduced_draft(small_reduced, sampling):
    check_sd_first_two(*small_reduced, 1.0, 1.0, sampling=sampling)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, overrides",
    [
        ("rejection hits", dict(sampling="rejection", fanout=[3, 2, 2, 3])),
        ("rejection misses, neural", dict(sampling="rejection", fanout="0", backup="neural")),
        ("coupled hits", dict(sampling="coupled", fanout=[3, 2, 2, 3])),
    ],
)
def test_ssd_first_two_tokens_follow_the_target_with_a_reduced_draft(
    small_reduced, name, overrides
):
    check_first_two(*small_reduced, f"reduced draft, {name}", 1.0, 1.0, overrides)
