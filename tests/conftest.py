"""Fixtures: tiny random Llama / Qwen2 / Qwen3 checkpoints in Hugging Face format, built in
milliseconds."""

from __future__ import annotations

import gc
import itertools
import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

EOS = "<|endoftext|>"

# Tests use tiny models: one intra-op thread is faster and immune to oversubscription.
torch.set_num_threads(1)


@pytest.fixture(scope="module", autouse=True)
def _older_objects_frozen() -> None:
    """Keeps the cyclic garbage collector off the objects that exist when a test module starts.

    Each full collection scans every tracked object, and torch, transformers and the session's
    fixtures make that heap large while the engine tests allocate many short-lived objects.
    Frozen objects are never scanned, and those alive at a module's
    start are modules, imported code and session fixtures, which live to the end anyway (the
    previous module's fixtures are torn down before this runs). Reference counting frees as
    before; garbage is collected before freezing, and everything a module creates, engines
    included, is collected as before.
    """
    gc.collect()
    gc.freeze()


def byte_tokenizer() -> Tokenizer:
    """Byte-level tokenizer without merges: 256 byte tokens + one special EOS token (id 256)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    return tok


def word_tokenizer(vocab_size: int) -> Tokenizer:
    """Whitespace-split word tokenizer over tokens "t0".."t{V-2}" plus EOS (id V-1): for models
    whose vocabulary is small enough to enumerate output distributions exactly."""
    vocab = {f"t{i}": i for i in range(vocab_size - 1)}
    vocab[EOS] = vocab_size - 1
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=EOS))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens([EOS])
    return tok


def write_tiny_model(
    path: Path,
    family: str = "llama",
    seed: int = 0,
    init_std: float = 0.5,
    **overrides,
) -> Path:
    """Save a random-initialised model + byte tokenizer as a Hugging Face directory.

    ``init_std`` is large so distributions are peaked: greedy ties (which would make tests
    depend on float rounding) are vanishingly rare, and speculation has something to accept.
    """
    import transformers

    base = dict(
        vocab_size=260,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=256,
        eos_token_id=256,
        initializer_range=init_std,
    )
    base.update(overrides)
    if base["vocab_size"] < 257:
        base["bos_token_id"] = base["eos_token_id"] = base["vocab_size"] - 1
    if family == "llama":
        cfg = transformers.LlamaConfig(**base)
        cls = transformers.LlamaForCausalLM
    elif family == "qwen3":
        base.setdefault("head_dim", base["hidden_size"] // base["num_attention_heads"])
        cfg = transformers.Qwen3Config(**base)
        cls = transformers.Qwen3ForCausalLM
    elif family == "qwen2":
        cfg = transformers.Qwen2Config(**base)
        cls = transformers.Qwen2ForCausalLM
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():  # transformers starts biases (Qwen2's q/k/v) at zero: make them count
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(std=init_std)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tok = byte_tokenizer() if base["vocab_size"] >= 257 else word_tokenizer(base["vocab_size"])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {"eos_token": EOS, "bos_token": EOS, "tokenizer_class": "PreTrainedTokenizerFast"}
        )
    )
    return path


def transformers_greedy(ref, ids: list[int], max_new_tokens: int, **generate) -> list[int]:
    """The tokens transformers' ``generate`` appends to ``ids`` greedily, never stopping at EOS.
    The attention mask is explicit: where BOS or EOS is also the pad id, transformers would
    otherwise mask it out as padding. ``generate``: more keyword arguments (e.g. pad_token_id)."""
    prompt = torch.tensor([ids])
    with torch.no_grad():
        out = ref.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            **generate,
        )
    return out[0, len(ids) :].tolist()


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("llama"), "llama")


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("qwen3"), "qwen3")


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory) -> Path:
    """A cheaper model with the same tokenizer as ``tiny_llama``, for speculation tests."""
    return write_tiny_model(
        tmp_path_factory.mktemp("draft"), "llama", seed=1, hidden_size=32, num_hidden_layers=1
    )


def perturbed_copy(src: Path, dst: Path, noise: float, seed: int = 0) -> Path:
    """A draft that mostly agrees with ``src``: its weights plus Gaussian noise (relative)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst, dirs_exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    weights = load_file(str(src / "model.safetensors"))
    noisy = {
        k: (v + noise * v.std() * torch.randn(v.shape, generator=gen)).contiguous()
        for k, v in weights.items()
    }
    save_file(noisy, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


# ---- speculation fixtures shared by the SD and SSD tests ----------------------------------------

PROMPTS = [
    "def add(a, b):",
    "x",
    "import os\nimport sys\n",
    "hello world, this is a longer prompt",
    "for i in range(10):",
    "#",
    "while True:",
    "return",
]
SMALL_VOCAB = 8  # small enough to enumerate the law of the first two tokens exactly
# Samples of a first-two-token check: either token's law resolved to 0.049 TV, the pair's to 0.094
# (tests/stats.py: tv_resolution).
FIRST_TWO_SAMPLES = 12_000


@pytest.fixture(scope="session")
def close_draft(tiny_llama, tmp_path_factory):
    """A draft that agrees with ``tiny_llama`` often, so rounds accept several tokens."""
    return perturbed_copy(tiny_llama, tmp_path_factory.mktemp("close"), noise=0.02)


@pytest.fixture(scope="session")
def small_vocab_pair(tmp_path_factory):
    """(target, close draft, far draft) over a vocabulary of ``SMALL_VOCAB`` tokens."""
    v = SMALL_VOCAB
    target = write_tiny_model(tmp_path_factory.mktemp("t8"), "llama", vocab_size=v, init_std=0.3)
    close = perturbed_copy(target, tmp_path_factory.mktemp("d8"), noise=0.5)
    far = write_tiny_model(
        tmp_path_factory.mktemp("f8"),
        "llama",
        vocab_size=v,
        seed=9,
        hidden_size=32,
        num_hidden_layers=1,
        init_std=0.3,
    )
    return target, close, far


def exact_first_two(target_dir: Path, prompt_ids: list[int], params) -> torch.Tensor:
    """P(t1, t2) [V, V] by enumeration with the reference implementation (transformers), under
    the request's sampling transforms."""
    import transformers

    from saguaro.sampling import SamplingTensors, logits_to_probs

    ref = transformers.AutoModelForCausalLM.from_pretrained(target_dir).eval()
    st = SamplingTensors.from_params([params])
    with torch.no_grad():
        logits = ref(torch.tensor([prompt_ids])).logits[0, -1:]
        vocab = logits.shape[-1]
        p1 = logits_to_probs(logits, st)[0]
        seqs = torch.tensor([prompt_ids + [t] for t in range(vocab)])
        p2 = logits_to_probs(ref(seqs).logits[:, -1], st.repeat_interleave(vocab))
    return p1[:, None] * p2


def sample_first_two(
    target: Path,
    draft: Path | None,
    make_params,
    samples: int,
    batch: int,
    check=None,
    prepare=None,
    **engine,
) -> tuple[torch.Tensor, int]:
    """Counts [V, V] of the first two tokens of ``samples`` requests of the prompt [1, 4, 2]
    (``make_params(seed)`` each, seeds 0, 1, ...), run ``batch`` at a time, and how many batches
    hit SSD's cache; ``check(out)`` sees every output, ``prepare(llm)`` the engine before its
    first request. ``engine``: more EngineConfig fields."""
    from saguaro import LLM

    vocab = SMALL_VOCAB
    counts, hits, seeds = torch.zeros(vocab, vocab), 0, itertools.count()
    with LLM(
        model=str(target),
        draft=None if draft is None else str(draft),
        max_model_len=32,
        max_num_seqs=batch,
        num_kv_blocks=batch,
        block_size=16,
        max_num_batched_tokens=20 * batch,
        draft_timeout_s=60,
        **engine,
    ) as llm:
        if prepare is not None:
            prepare(llm)
        for _ in range(samples // batch):
            params = [make_params(next(seeds)) for _ in range(batch)]
            if check is None:
                pairs = first_two_tokens(llm, [1, 4, 2], params)
            else:  # ``check`` sees whole outputs
                outs = llm.generate([[1, 4, 2]] * batch, params)
                for out in outs:
                    check(out)
                pairs = [tuple(out.token_ids[:2]) for out in outs]
            for t1, t2 in pairs:
                counts[t1, t2] += 1
            hits += llm.last_run.get("cache_hit_rate", 0) > 0
    return counts, hits


def first_two_tokens(llm, prompt: list[int], params: list) -> list[tuple[int, int]]:
    """The first two tokens of one request of ``prompt`` per ``params``, run together in
    ``llm``'s engine until each has committed two tokens and then aborted: the rounds after a
    token is committed cannot change it, so its law is ``generate``'s, at the cost of the
    rounds that commit tokens 1 and 2 only. ``llm.last_run`` summarizes the rounds that ran, as
    ``generate`` would."""
    from saguaro.core.metrics import summarize

    engine = llm.engine
    seqs = [engine.add_request(list(prompt), p) for p in params]
    try:
        while any(s.num_output_tokens < 2 and not s.is_finished for s in seqs):
            engine.step()
    finally:
        for s in seqs:
            engine.abort(s.seq_id)
    llm.last_run = summarize(r for s in seqs for r in s.records)
    return [tuple(s.output_token_ids[:2]) for s in seqs]


def scaled_head_copy(src: Path, dst: Path, factor: float) -> Path:
    """``src`` with its LM head scaled by ``factor``: the same ranking, much more confident."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst, dirs_exist_ok=True)
    weights = load_file(str(src / "model.safetensors"))
    weights["lm_head.weight"] = weights["lm_head.weight"] * factor
    save_file(weights, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


CONFIDENCE = 8.0  # logit gaps x8: at T <= 0.5 most rows round to one-hot in float32


@pytest.fixture(scope="session")
def confident_pair(small_vocab_pair, tmp_path_factory):
    """(confident target, random draft) over ``SMALL_VOCAB`` tokens: the draft proposes tokens
    of target probability 1e-9 .. 1e-40, which an exact verifier accepts (almost) never."""
    target, _, far = small_vocab_pair
    return scaled_head_copy(target, tmp_path_factory.mktemp("sharp8"), CONFIDENCE), far
