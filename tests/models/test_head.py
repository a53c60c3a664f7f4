"""A draft's head cut to its likeliest tokens (``draft_head_tokens``): the ranking (special
tokens first, then by frequency in the code corpus, cached per tokenizer), logits equal to the
whole head's on the kept tokens and -inf off them, on saguaro's kernels and on torch's, and SD
and SSD with a cut draft still give AR's greedy tokens."""

from __future__ import annotations

import pytest
import torch

from saguaro.kernels.interleave import interleave
from saguaro.models import head, linear
from saguaro.models.config import ModelConfig
from saguaro.models.loader import load_model
from saguaro.models.tokenizer import Tokenizer
from saguaro.paths import cache_dir
from tests.models.test_gguf_direct import SMALL_BLOCKS, TEXT, saguaro_logits, write_qwen2
from tests.speculation.test_reduced_head import greedy_outputs, prefill_logits

CUT = 96  # of the byte tokenizer's 257: many a draft can no longer propose
SMALL_CORPUS = 50_000  # characters: enough for a byte tokenizer's ranking, quick to count


@pytest.fixture(autouse=True)
def small_corpus(monkeypatch, tmp_path):
    """Rankings of a small corpus, in a cache of the test's own, where the kernels already built
    are found too: a process (an SSD worker) compiling them into an empty cache takes ~15 s."""
    kernels = cache_dir("kernels")
    kernels.mkdir(parents=True, exist_ok=True)
    (tmp_path / "kernels").symlink_to(kernels, target_is_directory=True)
    monkeypatch.setattr(head, "CORPUS_CHARS", SMALL_CORPUS)
    monkeypatch.setenv("SAGUARO_CACHE", str(tmp_path))


def test_the_ranking_puts_special_tokens_first_then_the_corpus_commonest(tiny_llama):
    tok = Tokenizer(tiny_llama)
    ids = head.ranked_tokens(tok, CUT)
    assert len(ids) == CUT == len(set(ids)) and ids == sorted(ids)
    assert tok.eos_token_id in ids
    # Python source: spaces, "e" and newlines are everywhere; a control byte is nowhere.
    assert all(tok.encode(c, add_special_tokens=False)[0] in ids for c in " e\n")
    assert tok.encode("\x07", add_special_tokens=False)[0] not in ids


def test_a_ranking_is_read_back_and_a_damaged_one_is_made_again(tiny_llama, monkeypatch):
    tok = Tokenizer(tiny_llama)
    first = head.ranked_tokens(tok, CUT)
    (cached,) = head.cache_dir("heads").glob("*.json")
    counted = []
    real = head._ranking
    monkeypatch.setattr(head, "_ranking", lambda t: counted.append(1) or real(t))
    assert head.ranked_tokens(tok, CUT) == first and not counted  # read, not counted again
    cached.write_text("[1, 2")  # cut short
    assert head.ranked_tokens(tok, CUT) == first and counted == [1]


def test_a_head_size_outside_the_vocabulary_is_refused(tiny_llama):
    with pytest.raises(ValueError, match="1..257"):
        head.ranked_tokens(Tokenizer(tiny_llama), 0)


@pytest.mark.parametrize("quantization, kernels", [("int8", True), ("none", False)])
def test_cut_logits_are_the_whole_heads_on_the_kept_tokens_and_minus_inf_off_them(
    tiny_llama, quantization, kernels
):
    ids = list(b"def add(a, b):\n    return a + b")
    load = dict(quantization=quantization, kernels=kernels, draft=True)
    whole = prefill_logits(tiny_llama, ids, **load)
    cut = prefill_logits(tiny_llama, ids, **load, head_tokens=CUT)
    kept = head.ranked_tokens(Tokenizer(tiny_llama), CUT)
    if kernels:  # a logit is its own row's bits on saguaro's kernels
        assert torch.equal(cut[:, kept], whole[:, kept])
    else:
        torch.testing.assert_close(cut[:, kept], whole[:, kept], rtol=1e-5, atol=1e-5)
    off = torch.ones(whole.shape[1], dtype=torch.bool)
    off[kept] = False
    assert torch.isneginf(cut[:, off]).all()


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_greedy_with_a_cut_draft_head_equals_ar(tiny_llama, close_draft, mode):
    head.ranked_tokens(Tokenizer(close_draft), CUT)  # cached for the SSD worker's process too
    ar = greedy_outputs(tiny_llama)
    draft = dict(draft=str(close_draft), mode=mode, draft_head_tokens=CUT)
    outs = greedy_outputs(tiny_llama, **draft, num_speculative_tokens=3)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ar]
    assert sum(o.metrics["accepted"] for o in outs) > 0


@pytest.mark.parametrize("output", [None, "Q8_0"])
def test_a_gguf_drafts_head_is_cut_from_the_files_blocks(tmp_path, monkeypatch, output):
    """A .gguf draft's head is cut from the file's blocks before the kernels take them (a whole
    head is not interleaved first only to be read back): on the kept tokens the logits are the
    whole head's bits, -inf off them, and a tied head's cut leaves the embedding the file's."""
    types = SMALL_BLOCKS | ({"output": output} if output else {})
    path = write_qwen2(tmp_path / "draft.gguf", types, hidden=64, seed=3)
    vocab = ModelConfig.from_dir(path).vocab_size
    n = vocab // 2 // 4 * 4  # whole strips of four: the cut head is interleaved
    load = dict(kernels=True, quantization="auto", draft=True)
    whole = load_model(path, **load)
    interleaved = []  # the rows of every weight the kernels took
    monkeypatch.setattr(linear, "interleave", lambda w: interleaved.append(w.n) or interleave(w))
    cut = load_model(path, **load, head_tokens=n)
    assert n in interleaved and vocab not in interleaved
    kept = head.ranked_tokens(Tokenizer(path), n)
    assert cut.head_token_ids.tolist() == kept
    assert cut.lm_head.fmt == f"{(output or SMALL_BLOCKS['token_embd']).lower()}_x4"
    assert cut.embed_tokens.fmt == SMALL_BLOCKS["token_embd"].lower()  # the file's, whole
    ids = Tokenizer(path).encode(TEXT)[:16]
    want, got = saguaro_logits(whole, ids), saguaro_logits(cut, ids)
    assert torch.equal(got[:, kept], want[:, kept])
    off = torch.ones(vocab, dtype=torch.bool)
    off[kept] = False
    assert torch.isneginf(got[:, off]).all()
