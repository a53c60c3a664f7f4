"""Tensor-parallel slices: what each rank loads, and the sizes a model cannot be split into.
(The forwards of TP = 2 against TP = 1 run in real processes: tests/engine/test_tensor_parallel.)"""

from __future__ import annotations

import pytest
import torch

from saguaro.models.config import ModelConfig
from saguaro.models.loader import load_model
from saguaro.models.parallel import TensorParallel
from tests.conftest import write_tiny_model


@pytest.fixture(scope="module")
def odd_vocab_qwen3(tmp_path_factory):
    """Qwen3 (q/k norm, tied head) with a vocabulary (263) that two ranks cannot split evenly."""
    return write_tiny_model(
        tmp_path_factory.mktemp("q263"), "qwen3", vocab_size=263, tie_word_embeddings=True
    )


def test_two_ranks_hold_disjoint_slices_that_make_the_whole(odd_vocab_qwen3):
    full = load_model(odd_vocab_qwen3)
    ranks = [load_model(odd_vocab_qwen3, tp=TensorParallel(r, 2)) for r in range(2)]
    cfg = full.config
    d, h, hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    for name, whole in full.state_dict().items():
        parts = [dict(m.state_dict())[name] for m in ranks]
        if "qkv_proj" in name:  # q | k | v, each split by heads
            sizes = [h * d // 2, hkv * d // 2, hkv * d // 2]
            pieces = [p.split(sizes) for p in parts]
            joined = torch.cat([torch.cat([pc[i] for pc in pieces]) for i in range(3)])
        elif "gate_up_proj" in name:  # gate | up, each split by columns
            pieces = [p.chunk(2) for p in parts]
            joined = torch.cat([torch.cat([pc[i] for pc in pieces]) for i in range(2)])
        elif "o_proj" in name or "down_proj" in name:
            joined = torch.cat(parts, dim=1)
        elif name in ("embed_tokens.weight", "lm_head.weight"):
            assert parts[0].shape[0] == parts[1].shape[0] == 132  # ceil(263 / 2)
            assert parts[1][-1].abs().sum() == 0  # the padding row
            joined = torch.cat(parts)[: cfg.vocab_size]
        else:  # norms: replicated
            assert all(torch.equal(p, whole) for p in parts), name
            continue
        assert torch.equal(joined, whole), name
    assert ranks[0].num_kv_heads == hkv // 2
    assert ranks[1].lm_head.weight is ranks[1].embed_tokens.weight  # tied, per rank


@pytest.mark.parametrize(
    "overrides, what",
    [
        (dict(num_key_value_heads=1), "KV heads"),
        (dict(num_attention_heads=3, num_key_value_heads=3, hidden_size=48), "KV heads"),
        (dict(intermediate_size=129), "intermediate_size"),
    ],
)
def test_sizes_that_do_not_split_are_refused(tmp_path, overrides, what):
    model_dir = write_tiny_model(tmp_path / "m", "llama", **overrides)
    with pytest.raises(ValueError, match=f"tensor_parallel_size=2 does not divide .*{what}"):
        TensorParallel(0, 2).check(ModelConfig.from_dir(model_dir))
    with pytest.raises(ValueError, match=what):
        load_model(model_dir, tp=TensorParallel(1, 2))


def test_a_rank_reads_only_its_slices_of_the_split_weights(odd_vocab_qwen3, monkeypatch):
    """No rank holds a whole split weight at any time: those are read through safetensors
    slices, never as whole tensors (norms, which every rank holds, are)."""
    import saguaro.models.loader as loader

    whole: list[str] = []
    real_open = loader.safe_open

    class Recording:
        def __init__(self, *args, **kwargs) -> None:
            self.inner = real_open(*args, **kwargs)

        def __enter__(self):
            st = self.inner.__enter__()
            get_tensor = st.get_tensor

            class Handle:
                def keys(self):
                    return st.keys()

                def get_slice(self, name):
                    return st.get_slice(name)

                def get_tensor(self, name):
                    whole.append(name)
                    return get_tensor(name)

            return Handle()

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

    monkeypatch.setattr(loader, "safe_open", Recording)
    load_model(odd_vocab_qwen3, tp=TensorParallel(1, 2))
    assert whole and all("norm" in name for name in whole), whole
