"""`saguaro train-draft`: rollouts, the draft cut from its target, distillation, and the
directory it writes (whole, or without the embedding it shares with its target)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from saguaro import LLM, SamplingParams
from saguaro.cli import main
from saguaro.errors import ModelLoadError
from saguaro.models.draft_dir import EMBED, assemble_draft
from saguaro.models.loader import iter_tensors, safetensors_files
from saguaro.train.distill import DistillConfig, Distiller, batches, distill_loss
from saguaro.train.draft_data import (
    RolloutConfig,
    answer_path,
    code_pairs,
    draft_pairs,
    generate_rollouts,
    rollout_batch,
    score_batch,
)
from saguaro.train.draft_model import cut_draft, head_ids, load_draft, write_draft
from tests.conftest import transformers_greedy, write_tiny_model
from tests.speculation.test_reduced_head import prefill_logits

PROMPTS = [[5, 6, 7, 8, 9], [40, 41], [100, 101, 102, 103, 104, 105, 106], [7]]


def train_draft(argv: list[str]) -> int:
    """``saguaro train-draft ARGV``'s exit code (the CLI turns errors into exit code 2)."""
    return main(["train-draft", *argv])


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("target"), "llama", num_hidden_layers=3)


@pytest.fixture(scope="module")
def target(target_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(target_dir).eval()


def test_batched_rollouts_equal_each_prompt_decoded_alone(target):
    """Left padding and per-row positions leave every row as it would be alone; greedy rows
    record the target's argmax as their first top token; a stop token ends its row, kept."""
    cfg = RolloutConfig(new_tokens=12)
    shard = rollout_batch(target, PROMPTS, [0.0] * len(PROMPTS), cfg, set(), seed=0)
    for p, seq, n, ids in zip(
        PROMPTS, shard.sequences, shard.prompt_lens, shard.top_ids, strict=True
    ):
        assert n == len(p) and seq[:n] == p
        assert seq[n:] == transformers_greedy(target, p, 12)
        assert ids[:, 0].tolist() == seq[n:]
    stop = {shard.sequences[0][len(PROMPTS[0]) + 3]}
    stopped = rollout_batch(target, PROMPTS[:1], [0.0], cfg, stop, seed=0)
    assert stopped.sequences[0] == shard.sequences[0][: len(PROMPTS[0]) + 4]
    assert stopped.top_logp[0].shape[0] == 4


def test_scoring_a_written_reply_gives_the_top_tokens_its_rollout_recorded(target):
    """Teacher forcing (one forward over prompt + reply) and the rollout's step-by-step decode
    see the same distributions at the reply's positions."""
    cfg = RolloutConfig(new_tokens=10)
    rolled = rollout_batch(target, PROMPTS, [0.0] * len(PROMPTS), cfg, set(), seed=0)
    pairs = [(s[:n], s[n:]) for s, n in zip(rolled.sequences, rolled.prompt_lens, strict=True)]
    scored = score_batch(target, pairs, rows=3)
    assert scored.sequences == rolled.sequences and scored.prompt_lens == rolled.prompt_lens
    for a, b, la, lb in zip(
        scored.top_ids, rolled.top_ids, scored.top_logp, rolled.top_logp, strict=True
    ):
        assert torch.equal(a[:, 0], b[:, 0])  # greedy: no near-ties on these peaked weights
        torch.testing.assert_close(la.float(), lb.float(), atol=2e-3, rtol=2e-3)


def test_sampled_rollouts_follow_their_seed(target):
    cfg = RolloutConfig(new_tokens=16)
    a, b, c = (rollout_batch(target, PROMPTS, [1.0] * 4, cfg, set(), seed=s) for s in (3, 3, 4))
    assert a.sequences == b.sequences and a.sequences != c.sequences
    greedy = rollout_batch(target, PROMPTS, [0.0] * 4, cfg, set(), seed=3)
    assert a.sequences != greedy.sequences  # temperature 1 is not argmax on random weights


def test_head_ids_take_the_tokens_of_most_expected_mass_then_the_lowest_ids():
    """Mass is p summed over positions: a token that is often second choice outranks one
    written once with certainty."""
    ids = [torch.tensor([[9, 4], [9, 4], [7, 4]]), torch.tensor([[5, 4]])]
    logp = [
        torch.tensor([[0.6, 0.4], [0.6, 0.4], [1.0, 0.0]]).log(),
        torch.tensor([[0.5, 0.5]]).log(),
    ]
    assert head_ids(ids, logp, 1, 16) == [4]  # 1.3 against 9's 1.2
    assert head_ids(ids, logp, 3, 16) == [4, 7, 9]
    assert head_ids(ids, logp, 5, 16) == [0, 4, 5, 7, 9]  # 0: the lowest id without mass
    with pytest.raises(ValueError, match="head_tokens"):
        head_ids(ids, logp, 17, 16)


def test_a_draft_of_every_layer_and_the_whole_head_is_the_target(target):
    """The cut copies the target's own computation: all layers and every token give its
    logits; fewer layers keep its embedding, frozen."""
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    mask = torch.ones_like(ids)
    vocab = target.config.vocab_size
    whole = cut_draft(target, (0, 1, 2), list(range(vocab)))
    with torch.no_grad():
        want = target(input_ids=ids).logits
        got = whole.lm_head(whole(ids, mask))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    part = cut_draft(target, (0, 2), [3, 5, 8])
    assert len(part.model.layers) == 2 and part.lm_head.weight.shape == (3, 64)
    assert not part.model.embed_tokens.weight.requires_grad
    assert torch.equal(part.model.embed_tokens.weight, target.model.embed_tokens.weight)
    with pytest.raises(ValueError, match="layer"):
        cut_draft(target, (0, 3), [1])


def test_the_written_draft_loads_in_saguaro_with_the_training_logits(target, target_dir, tmp_path):
    """saguaro's model on the written directory scores the head's tokens as the training-time
    draft does, and every other token at -inf; without the embedding, the target's restores
    it, and another target's embedding is refused."""
    ids = [3, 7, 11, 50, 90, 200]
    draft = cut_draft(target, (1,), ids)
    whole = write_draft(draft, target_dir, tmp_path / "whole", {"note": "test"})
    tokens = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        want = draft.lm_head(draft(tokens, torch.ones_like(tokens)))[0, -1]
    got = prefill_logits(whole, tokens[0].tolist())[-1]
    torch.testing.assert_close(got[ids], want, rtol=1e-5, atol=1e-5)
    assert torch.isinf(got[[i for i in range(260) if i not in ids]]).all()

    shipped = write_draft(draft, target_dir, tmp_path / "shipped", {}, embeddings=False)
    assert EMBED not in dict(iter_tensors(safetensors_files(shipped)))
    assert not (shipped / "tokenizer.json").exists()
    made = assemble_draft(shipped, target_dir, tmp_path / "made")
    torch.testing.assert_close(prefill_logits(made, tokens[0].tolist())[-1], got)
    other = write_tiny_model(tmp_path / "other", "llama", seed=7, num_hidden_layers=3)
    with pytest.raises(ModelLoadError, match="another embedding"):
        assemble_draft(shipped, other, tmp_path / "refused")


def test_batches_cover_every_sequence_once_per_epoch_within_the_budget():
    lengths = [5, 60, 33, 12, 100, 7, 41, 41, 2, 90] * 13
    plan = batches(lengths, 200, seed=1, epochs=2)
    counts = torch.bincount(torch.tensor([i for b in plan for i in b]), minlength=len(lengths))
    assert (counts == 2).all()
    assert all(len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 200 for b in plan)
    assert plan == batches(lengths, 200, seed=1, epochs=2)


def test_the_loss_is_cross_entropy_to_p_on_the_head():
    p = torch.tensor([[0.5, 0.3, 0.1]])  # 0.1 of p is outside the head
    logits = torch.tensor([[1.0, 0.0, -1.0]], requires_grad=True)
    loss, stats = distill_loss(p, logits)
    logq = logits.log_softmax(-1)
    torch.testing.assert_close(loss, -(p * logq).sum())
    assert stats["in_head"] == pytest.approx(0.9) and stats["top1"] == 1.0
    assert stats["accept"] == pytest.approx(torch.minimum(p, logq.exp()).sum().item())


def test_distillation_lowers_the_loss_and_resumes_where_it_stopped(target, target_dir, tmp_path):
    cfg = RolloutConfig(shards=1, new_tokens=24)
    prompts = [[i, i + 1, i + 2] for i in range(5, 200, 7)]
    generate_rollouts(target, prompts, set(), tmp_path, cfg)
    dcfg = DistillConfig(layers=(0,), head_tokens=128, epochs=6, batch_tokens=1024, lr=3e-3)
    run = Distiller(target_dir, tmp_path, dcfg, "cpu")
    first = run.train_step()
    stats = run.fit()
    assert run.done and stats["loss"] < first["loss"]
    assert stats["accept"] > first["accept"]

    half = tmp_path / "half"
    half.mkdir()
    (half / "rollouts").symlink_to(tmp_path / "rollouts")
    a = Distiller(target_dir, half, dcfg, "cpu")
    for _ in range(3):
        a.train_step()
    a.save()
    b = Distiller(target_dir, half, DistillConfig(), "cpu")  # its checkpoint's settings win
    assert b.cfg == dcfg and b.step == 3
    for x, y in zip(a.draft.parameters(), b.draft.parameters(), strict=True):
        assert torch.equal(x, y)
    b.train_step()
    a.train_step()
    for x, y in zip(a.draft.parameters(), b.draft.parameters(), strict=True):
        torch.testing.assert_close(x, y)


def test_train_draft_writes_a_draft_that_speculates_exactly(target_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ("ab", "hello", "x=1")))
    out = tmp_path / "draft"
    args = ["--target", str(target_dir), "--out", str(out), "--prompts", str(prompts)]
    args += ["--shards", "1", "--new-tokens", "16", "--layers", "0", "--head-tokens", "64"]
    assert train_draft([*args, "--epochs", "2", "--batch-tokens", "512"]) == 0
    training = json.loads((out / "training.json").read_text())
    assert training["steps"] > 0 and training["rollouts"]["shards"] == 1
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    with LLM(model=str(target_dir), max_model_len=128) as ar:
        want = [o.token_ids for o in ar.generate(["ab", "zz top"], greedy)]
    with LLM(model=str(target_dir), draft=str(out), mode="sd", max_model_len=128) as sd:
        assert [o.token_ids for o in sd.generate(["ab", "zz top"], greedy)] == want


def test_a_drafts_own_continuations_are_what_it_generates(target, target_dir):
    """On-policy pairs: the prompt, then what the model writes after it (here the target stands
    for a draft: any model directory writes them), greedy at T = 0, seeded at T > 0."""
    cfg = RolloutConfig(new_tokens=8, temperatures=(0.0, 0.7), rollout_seed=3)
    pairs = draft_pairs(target_dir, PROMPTS, cfg)
    assert [p for p, _ in pairs] == PROMPTS
    for k, (p, cont) in enumerate(pairs):
        assert 0 < len(cont) <= 8
        if k % 2 == 0:
            assert cont == transformers_greedy(target, p, 8)[: len(cont)]
    assert draft_pairs(target_dir, PROMPTS, cfg) == pairs
    assert draft_pairs(target_dir, PROMPTS, RolloutConfig(new_tokens=8, rollout_seed=4)) != pairs


def test_train_draft_trains_on_its_init_drafts_own_text(target, target_dir, tmp_path):
    """``--draft-shards``: the ``--init`` draft (written without the embedding, as the
    repository ships one) writes continuations, the target scores them, the draft trains on
    them; without ``--init`` there is no draft to write them."""
    written = write_draft(
        cut_draft(target, (0,), list(range(64))), target_dir, tmp_path / "init", {},
        embeddings=False,
    )  # fmt: skip
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ("ab", "x=1")))
    run, out = tmp_path / "run", tmp_path / "draft"
    args = ["--target", str(target_dir), "--out", str(out), "--run-dir", str(run)]
    args += ["--prompts", str(prompts), "--shards", "0", "--draft-shards", "1"]
    args += ["--new-tokens", "12", "--epochs", "1", "--batch-tokens", "512"]
    assert train_draft([*args, "--init", str(written)]) == 0
    shard = torch.load(answer_path(run, 0, "draft"))
    assert len(shard["sequences"]) == 128 and all(len(t) > 0 for t in shard["top_ids"])
    assert json.loads((out / "training.json").read_text())["steps"] > 0
    assert train_draft([*args, "--run-dir", str(tmp_path / "run2")]) == 2
    assert not (tmp_path / "run2").exists()


def test_train_draft_refuses_a_directory_that_is_not_a_model(tmp_path, capsys):
    args = ["--target", str(tmp_path / "absent"), "--out", str(tmp_path / "out")]
    assert train_draft(args) == 2
    assert "not a model directory" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_written_draft_trains_on_from_where_it_was_written(target, target_dir, tmp_path):
    """``--init``: the draft read back is the one written (its layers, norm, head and head
    ids), over the target's embedding; a draft of another target's embedding is refused."""
    cfg = RolloutConfig(shards=1, new_tokens=16)
    generate_rollouts(target, [[i, i + 1] for i in range(5, 100, 9)], set(), tmp_path, cfg)
    draft = cut_draft(target, (2, 0), [3, 7, 11, 50, 90])
    with torch.no_grad():
        for p in draft.parameters():
            if p.requires_grad:
                p.add_(0.01 * torch.randn_like(p))  # not the target's layers any more
    written = write_draft(draft, target_dir, tmp_path / "written", {}, embeddings=False)
    back = load_draft(target, written)
    assert torch.equal(back.head_ids, draft.head_ids)
    for (name, x), y in zip(draft.state_dict().items(), back.state_dict().values(), strict=True):
        assert torch.equal(x, y), name
    run = Distiller(target_dir, tmp_path, DistillConfig(init=str(written), lr=1e-3), "cpu")
    assert torch.equal(run.draft.head_ids, draft.head_ids)
    first = run.train_step()
    ids, mask, at, p_head = run.batch(run.plan[0])
    with torch.no_grad():
        want = distill_loss(p_head, draft.lm_head(draft(ids, mask)[at]))[0].item()
    assert first["loss"] == pytest.approx(want, rel=1e-5)
    run.save()
    resumed = Distiller(target_dir, tmp_path, DistillConfig(), "cpu")  # the checkpoint's init
    assert resumed.cfg.init == str(written) and resumed.step == 1
    for x, y in zip(run.draft.parameters(), resumed.draft.parameters(), strict=True):
        assert torch.equal(x, y)
    other = transformers.AutoModelForCausalLM.from_pretrained(
        write_tiny_model(tmp_path / "other", "llama", seed=7, num_hidden_layers=3)
    )
    with pytest.raises(ValueError, match="another embedding"):
        load_draft(other, written)


def test_code_pairs_are_each_function_cut_after_its_head_and_the_code_that_follows(
    monkeypatch,
):
    """A scored code pair is a code prompt (the file up to a function's signature) and the
    file's own next tokens, at most ``new_tokens`` of them."""
    import saguaro.corpus as corpus

    text = 'import os\n\ndef f(x):\n    return x + 1\n\n\ndef g():\n    """Doc."""\n    pass\n'
    monkeypatch.setattr(corpus, "read_documents", lambda files: iter([text]))
    monkeypatch.setattr(corpus, "split_files", lambda root: type("S", (), {"train": []}))

    class Chars:
        def encode(self, s: str, add_special_tokens: bool = True) -> list[int]:
            return [0] * add_special_tokens + [ord(c) for c in s]

    pairs = code_pairs(Chars(), RolloutConfig(new_tokens=12))
    decoded = sorted(("".join(map(chr, p[1:])), "".join(map(chr, a))) for p, a in pairs)
    assert decoded == [
        ("import os\n\ndef f(x):\n", "    return x"),
        ('import os\n\ndef f(x):\n    return x + 1\n\n\ndef g():\n    """Doc."""\n', "    pass\n"),
    ]
