"""A ``.gguf`` file loads as it is: tiny random Qwen2 files written here (K-quants and 32-weight
blocks, q/k/v biases, a byte-level BPE vocabulary, a ChatML template) give transformers'
``Qwen2ForCausalLM`` logits on the file's dequantized weights, run on the kernels from the
file's own blocks (never dequantized), serve AR and SD, and refuse what they cannot read by
name."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from saguaro import LLM, SamplingParams
from saguaro.engine.model_runner import ModelRunner
from saguaro.errors import IncompatibleModelsError, ModelLoadError
from saguaro.models.catalog import MODELS_ENV, resolve_model
from saguaro.models.config import ModelConfig
from saguaro.models.gguf_meta import PRE_TOKENIZERS
from saguaro.models.gguf_names import hf_tensor_name
from saguaro.models.gguf_reader import GGUFFile
from saguaro.models.linear import KernelLinear, PackedEmbedding, PartsLinear
from saguaro.models.llama import CausalLM
from saguaro.models.loader import load_blocks, load_model
from saguaro.models.quant import dequantize
from saguaro.models.tokenizer import Tokenizer as SaguaroTokenizer
from tests.ggml_blocks import random_blocks

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXT = "def add(a, b):\n    return a + b  # 42 apples, café\n\nhello world"
PROMPT = "def add(x, y):\n    return x"
# Layer tensors in llama.cpp's order (ffn_gate and ffn_up back to back) and each one's shape
# (rows, columns) as a function of (hidden, intermediate, q rows, kv rows).
LAYER = {
    "attn_norm.weight": lambda h, i, q, kv: (h,),
    "ffn_down.weight": lambda h, i, q, kv: (h, i),
    "ffn_gate.weight": lambda h, i, q, kv: (i, h),
    "ffn_up.weight": lambda h, i, q, kv: (i, h),
    "ffn_norm.weight": lambda h, i, q, kv: (h,),
    "attn_k.bias": lambda h, i, q, kv: (kv,),
    "attn_k.weight": lambda h, i, q, kv: (kv, h),
    "attn_output.weight": lambda h, i, q, kv: (h, q),
    "attn_q.bias": lambda h, i, q, kv: (q,),
    "attn_q.weight": lambda h, i, q, kv: (q, h),
    "attn_v.bias": lambda h, i, q, kv: (kv,),
    "attn_v.weight": lambda h, i, q, kv: (kv, h),
}
# As Qwen2.5-Coder-1.5B's Q4_K_M: a Q6_K value beside Q4_K query and key, a separate Q6_K head.
K_QUANTS = {
    "token_embd": "Q4_K",
    "output": "Q6_K",
    "attn_q": "Q4_K",
    "attn_k": "Q4_K",
    "attn_v": "Q6_K",
    "attn_output": "Q5_K",
    "ffn_gate": "Q4_K",
    "ffn_up": "Q4_K",
    "ffn_down": "Q6_K",
}
# As the 0.5B's: 32-weight blocks, a tied head (no output.weight) on a Q5_0 embedding.
SMALL_BLOCKS = {
    "token_embd": "Q5_0",
    "attn_q": "Q5_0",
    "attn_k": "Q5_1",
    "attn_v": "Q8_0",
    "attn_output": "Q4_0",
    "ffn_gate": "Q5_1",
    "ffn_up": "Q5_1",
    "ffn_down": "Q4_1",
}


def bpe_tokenizer(extra: str = "") -> Tokenizer:
    """A byte-level BPE of about 300 tokens split as Qwen2 splits (its regex, NFC), with the
    ChatML special tokens; ``extra`` text trains a different vocabulary."""
    regex, _ = PRE_TOKENIZERS["qwen2"]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([TEXT * 3, "return x + y\n" * 10, extra], trainer)
    tok.add_special_tokens(SPECIALS)
    return tok


def add_tokenizer(w: gguf.GGUFWriter, tok: Tokenizer) -> None:
    """The tokenizer.ggml.* fields of ``tok`` and the ChatML template."""
    spec = json.loads(tok.to_str())
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = sorted(vocab, key=vocab.get)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges([" ".join(m) for m in spec["model"]["merges"]])
    w.add_bos_token_id(vocab[SPECIALS[0]])
    w.add_eos_token_id(vocab[SPECIALS[2]])
    w.add_pad_token_id(vocab[SPECIALS[0]])
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)


def add_hyperparameters(w: gguf.GGUFWriter, hidden: int, inter: int, layers: int) -> None:
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)


def tensor(name: str, shape: tuple[int, ...], kind: str, rng: np.random.Generator) -> np.ndarray:
    """Random values for one tensor: float32 norms (about 1) and biases, or a weight in
    ``kind`` (blocks, or F16 values) about 1 / sqrt(inputs) in size, so activations stay
    about 1."""
    if len(shape) == 1:
        base = 1.0 if name.endswith("norm.weight") else 0.0
        return (base + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if kind == "F16":
        return (rng.standard_normal(shape) * shape[1] ** -0.5).astype(np.float16)
    return random_blocks(kind, shape[0], shape[1], rng, scale=shape[1] ** -0.5)


def write_qwen2(
    path: Path,
    types: dict[str, str],
    hidden: int = 256,
    layers: int = 2,
    seed: int = 0,
    arch: str = "qwen2",
    tok: Tokenizer | None = None,
) -> Path:
    """A random Qwen2 GGUF file: 4 heads, 2 KV heads, intermediate 2 * hidden, each weight in
    ``types[kind]`` (kind: its name less ``blk.N.`` and ``.weight``; F16 where not listed), a
    separate head where ``types`` gives ``output``; norms and biases F32."""
    tok = tok or bpe_tokenizer()
    rng = np.random.default_rng(seed)
    inter, vocab = 2 * hidden, tok.get_vocab_size(with_added_tokens=True)
    w = gguf.GGUFWriter(path, arch)
    add_hyperparameters(w, hidden, inter, layers)
    add_tokenizer(w, tok)
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,)}
    if "output" in types:
        shapes["output.weight"] = (vocab, hidden)
    for n in range(layers):
        for name, shape in LAYER.items():
            shapes[f"blk.{n}.{name}"] = shape(hidden, inter, hidden, hidden // 2)
    for name, shape in shapes.items():
        kind = types.get(name.split(".")[-2], "F16")
        raw = gguf.GGMLQuantizationType[kind] if len(shape) > 1 and kind != "F16" else None
        w.add_tensor(name, tensor(name, shape, kind, rng), raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def reference(path: Path) -> transformers.Qwen2ForCausalLM:
    """transformers' Qwen2 on the file's weights as gguf dequantizes them."""
    cfg = ModelConfig.from_dir(path)
    ref = transformers.Qwen2ForCausalLM(
        transformers.Qwen2Config(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.num_hidden_layers,
            num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=cfg.num_key_value_heads,
            rms_norm_eps=cfg.rms_norm_eps,
            rope_theta=cfg.rope_theta,
            max_position_embeddings=cfg.max_position_embeddings,
            tie_word_embeddings=cfg.tie_word_embeddings,
        )
    )
    state = {}
    for t in gguf.GGUFReader(path).tensors:
        values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        shape = tuple(int(n) for n in reversed(t.shape))
        state[hf_tensor_name(t.name)] = torch.from_numpy(np.array(values, np.float32)).view(shape)
    missing, unexpected = ref.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    return ref.eval()


def saguaro_logits(model: CausalLM, ids: list[int]) -> torch.Tensor:
    """Logits at every position of ``ids`` through saguaro's runner."""
    runner = ModelRunner(model, num_blocks=8, block_size=16, device="cpu")
    with torch.no_grad():
        return runner.forward([runner.sequence_query(list(range(8)), 0, ids, len(ids))])


@pytest.fixture(scope="module")
def k_quants(tmp_path_factory) -> Path:
    return write_qwen2(tmp_path_factory.mktemp("k") / "k.gguf", K_QUANTS)


@pytest.fixture(scope="module")
def small_blocks(tmp_path_factory) -> Path:
    return write_qwen2(tmp_path_factory.mktemp("s") / "s.gguf", SMALL_BLOCKS, hidden=64, seed=1)


@pytest.fixture(scope="module")
def with_floats(tmp_path_factory) -> Path:
    """F16 weights among the blocks: the output projection, and the gate beside a Q5_1 up."""
    types = {**SMALL_BLOCKS, "attn_output": "F16", "ffn_gate": "F16"}
    return write_qwen2(tmp_path_factory.mktemp("f") / "f.gguf", types, hidden=64, seed=2)


@pytest.mark.parametrize("which", ["k_quants", "small_blocks", "with_floats"])
def test_logits_equal_transformers_on_the_dequantized_weights(which, request):
    """On torch's operators the file loads dequantized and gives transformers' logits; on the
    kernels it runs the blocks (activations may be rounded to int8 there): close logits and
    the same greedy picks."""
    path = request.getfixturevalue(which)
    ids = SaguaroTokenizer(path).encode(TEXT)
    with torch.no_grad():
        want = reference(path)(torch.tensor([ids])).logits[0]
    dense = saguaro_logits(load_model(path), ids)
    assert (dense - want).abs().max() <= 1e-4 * want.abs().max()
    blocks = saguaro_logits(load_model(path, kernels=True, quantization="auto"), ids)
    tolerance = 5e-2 * want.abs().max()
    assert (blocks - want).abs().max() <= tolerance
    agree = (blocks.argmax(-1) == want.argmax(-1)).float().mean()
    assert agree >= 0.95  # the greedy picks (a near-tie may part by the activations' rounding)


def test_the_blocks_run_as_the_file_holds_them(k_quants):
    """Every linear layer and the embedding are the file's blocks: Q4_K and Q6_K layers
    interleaved four rows a strip (the same bytes, saguaro.kernels.interleave), the others views
    of its map (no copy); a fused layer of two formats runs part by part; no dense weight was
    made."""
    model = load_model(k_quants, kernels=True, quantization="auto")
    attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
    assert isinstance(attn.qkv_proj, PartsLinear)
    assert [p.fmt for p in attn.qkv_proj.parts] == ["q4_k_x4", "q4_k_x4", "q6_k_x4"]
    assert attn.qkv_proj.bias is not None and attn.qkv_proj.bias.shape == (256 + 2 * 128,)
    formats = (mlp.gate_up_proj.fmt, mlp.down_proj.fmt, attn.o_proj.fmt)
    assert formats == ("q4_k_x4", "q6_k_x4", "q5_k")
    # the head's rows (the vocabulary) are not whole strips of four: it runs as the file has it
    assert isinstance(model.lm_head, KernelLinear) and model.lm_head.fmt == "q6_k"
    assert isinstance(model.embed_tokens, PackedEmbedding) and model.embed_tokens.fmt == "q4_k"
    ref = reference(k_quants).model.layers[0]
    qkv = [ref.self_attn.q_proj, ref.self_attn.k_proj, ref.self_attn.v_proj]
    assert torch.equal(
        torch.cat([dequantize(p.weight) for p in attn.qkv_proj.parts]),
        torch.cat([p.weight for p in qkv]),
    )
    assert torch.equal(attn.qkv_proj.bias, torch.cat([p.bias for p in qkv]))
    gate_up = torch.cat([ref.mlp.gate_proj.weight, ref.mlp.up_proj.weight])
    assert torch.equal(dequantize(mlp.gate_up_proj.weight), gate_up)
    buffer = GGUFFile.read(k_quants).buffer
    start, end = buffer.ctypes.data, buffer.ctypes.data + buffer.nbytes
    for codes in (attn.o_proj.codes, model.embed_tokens.codes):
        assert start <= codes.data_ptr() < end  # in the file's map
    placed, _ = load_blocks(k_quants, "float32")
    assert placed.layers[1].mlp.down_proj.weight.is_meta  # left for the blocks, never filled
    assert not placed.layers[1].post_attention_layernorm.weight.is_meta


def mapped_rss_kib(path: Path) -> int:
    """This process's resident KiB of its mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if "-" in line.split(" ", 1)[0]:  # a mapping's first line: its range, ..., its path
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_a_loaded_files_pages_do_not_stay_resident_beside_its_copies(k_quants):
    """Building a model reads the whole file (interleaving copies its Q4_K layers); the loader
    then drops its mappings of the file's pages, which a later read brings back unchanged."""
    model = load_model(k_quants, kernels=True, quantization="auto")
    assert mapped_rss_kib(k_quants) < k_quants.stat().st_size // 1024 // 4
    ids = torch.tensor([1, 2, 3])
    assert torch.isfinite(model.lm_head(model.embed_tokens(ids))).all()  # pages read again


def test_float_weights_among_blocks_run_dense(with_floats):
    """A float weight runs dense, and so does a fused layer with a float part."""
    model = load_model(with_floats, kernels=True, quantization="auto")
    mlp, attn = model.layers[1].mlp, model.layers[1].self_attn
    assert (attn.o_proj.fmt, mlp.gate_up_proj.fmt, mlp.down_proj.fmt) == ("f32", "f32", "q4")


def test_a_tied_head_takes_the_embeddings_blocks(small_blocks):
    model = load_model(small_blocks, kernels=True, quantization="auto")
    assert ModelConfig.from_dir(small_blocks).tie_word_embeddings
    assert model.lm_head.fmt == model.embed_tokens.fmt == "q5_0"
    assert model.lm_head.codes is model.embed_tokens.codes
    bf16 = load_model(small_blocks, "bfloat16", kernels=True, quantization="auto")
    assert bf16.embed_tokens(torch.tensor([3])).dtype == torch.bfloat16


def test_config_and_tokenizer_come_from_the_file(k_quants):
    cfg = ModelConfig.from_dir(k_quants)
    assert (cfg.architecture, cfg.family, cfg.attention_bias, cfg.qk_norm) == (
        "Qwen2ForCausalLM",
        "qwen2",
        True,
        False,
    )
    assert (cfg.hidden_size, cfg.num_key_value_heads, cfg.rope_theta) == (256, 2, 1e6)
    tok, ref = SaguaroTokenizer(k_quants), bpe_tokenizer()
    assert not cfg.tie_word_embeddings and cfg.vocab_size == ref.get_vocab_size() == tok.vocab_size
    for text in (TEXT, "  two  spaces\n\n\ttabs 3.14 don't", "e\u0301", ""):
        assert tok.encode(text) == ref.encode(text).ids, text
    assert tok.eos_token == "<|im_end|>" and tok.has_chat_template
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.encode("<|im_start|>")[0] == tok.token_to_id("<|im_start|>")


def test_a_gguf_files_tokenizer_is_built_once_and_read_from_the_cache(
    k_quants, tmp_path, monkeypatch
):
    monkeypatch.setenv("SAGUARO_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    path.write_bytes(k_quants.read_bytes())
    built = SaguaroTokenizer(path)
    entries = sorted(p.name for p in (tmp_path / "cache" / "tokenizers").iterdir())
    assert len(entries) == 2  # the tokenizer and its config
    cached = SaguaroTokenizer(path)
    assert cached.encode(TEXT) == built.encode(TEXT) and cached.config == built.config
    assert cached.chat_template == built.chat_template and cached.eos_token == built.eos_token
    for entry in (tmp_path / "cache" / "tokenizers").iterdir():
        entry.write_text("{damaged")  # a damaged entry is rebuilt, not an error
    assert SaguaroTokenizer(path).encode(TEXT) == built.encode(TEXT)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a changed file: new entry
    SaguaroTokenizer(path)
    assert len(list((tmp_path / "cache" / "tokenizers").iterdir())) == 4


def test_llm_generates_from_a_gguf_and_sd_gives_ar_tokens(k_quants, tmp_path):
    draft = write_qwen2(tmp_path / "draft.gguf", SMALL_BLOCKS, hidden=64, layers=1, seed=3)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    with LLM(model=str(k_quants), mode="ar", max_model_len=64) as llm:
        ar = llm.generate(PROMPT, params)[0]
    assert len(ar.token_ids) == 12
    with LLM(model=str(k_quants), draft=str(draft), mode="sd", max_model_len=64) as llm:
        sd = llm.generate(PROMPT, params)[0]
    assert sd.token_ids == ar.token_ids


def test_a_name_finds_a_gguf_in_the_models_directory(small_blocks, monkeypatch):
    monkeypatch.setenv(MODELS_ENV, str(small_blocks.parent))
    assert resolve_model(small_blocks.stem) == small_blocks


def test_the_reader_reads_what_ggufs_own_reader_reads(k_quants):
    mine, theirs = GGUFFile.read(k_quants), gguf.GGUFReader(k_quants)
    fields = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert mine.fields == fields
    assert [t.name for t in mine.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(mine.tensors, theirs.tensors, strict=True):
        assert (a.tensor_type, a.shape) == (b.tensor_type, tuple(int(n) for n in b.shape))
        assert a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data), a.name


def test_what_cannot_be_read_is_named(k_quants, tmp_path):
    data = k_quants.read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + data[4:])
    with pytest.raises(ModelLoadError, match=r"bad\.gguf: not a GGUF file"):
        load_model(bad)
    bad.write_bytes(data[:4] + (7).to_bytes(4, "little") + data[8:])
    with pytest.raises(ModelLoadError, match="GGUF version 7 is not supported"):
        ModelConfig.from_dir(bad)
    bad.write_bytes(data[:-1000])
    with pytest.raises(ModelLoadError, match=r"bad\.gguf: truncated .*tensor blk\.1\.attn_v"):
        load_model(bad, kernels=True, quantization="auto")
    bad.write_bytes(data[:5000])
    with pytest.raises(ModelLoadError, match=r"bad\.gguf: truncated GGUF file"):
        SaguaroTokenizer(bad)
    with pytest.raises(ModelLoadError, match="no such GGUF file"):
        load_model(tmp_path / "absent.gguf")
    with pytest.raises(ModelLoadError, match="quantized already"):
        load_model(k_quants, kernels=True, quantization="int8")


def test_an_unsupported_type_or_architecture_is_named(tmp_path):
    gemma = write_qwen2(tmp_path / "gemma.gguf", SMALL_BLOCKS, hidden=64, arch="gemma")
    with pytest.raises(ModelLoadError, match="unsupported GGUF architecture 'gemma'"):
        load_model(gemma, kernels=True, quantization="auto")
    iq = tmp_path / "iq.gguf"
    w = gguf.GGUFWriter(iq, "qwen2")
    add_hyperparameters(w, 256, 512, 1)
    w.add_tensor("blk.0.ffn_down.weight", np.zeros((256, 84 * 2), np.uint8), raw_dtype=10)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match=r"tensor blk\.0\.ffn_down\.weight has type Q2_K"):
        load_model(iq)


def test_a_draft_of_another_vocabulary_is_refused(k_quants, tmp_path):
    other = bpe_tokenizer(extra="zebra quartz jumps " * 30)
    draft = write_qwen2(tmp_path / "d.gguf", SMALL_BLOCKS, hidden=64, layers=1, tok=other)
    with pytest.raises(IncompatibleModelsError, match="draft tokenizer"):
        LLM(model=str(k_quants), draft=str(draft), mode="sd", max_model_len=64)
