import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from saguaro.train.data import PrepareConfig, WindowSampler, load_tokens, prepare  # noqa: E402
from saguaro.train.models import ModelSpec  # noqa: E402
from saguaro.train.trainer import FitConfig, Trainer, lr_lambda, mixed_label_loss  # noqa: E402

TINY = ModelSpec(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64)
CFG = FitConfig(
    target=TINY,
    draft=TINY,
    ctx=32,
    batch=2,
    tokens=64 * 8,
    draft_tokens=64 * 2,
    lr_target=1e-2,
    lr_draft=1e-2,
    warmup_steps=2,
)


@pytest.fixture
def run_dir(tiny_tree: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    stats = prepare(PrepareConfig(tiny_tree, out, vocab_size=300, heldout_permille=300))
    assert stats["train_tokens"] > 10 * CFG.ctx and stats["heldout_tokens"] > 0
    return out


def test_sampler_is_a_function_of_step(run_dir: Path) -> None:
    tokens = load_tokens(run_dir / "train.bin")
    a = WindowSampler(tokens, 32, 2, seed=0)
    b = WindowSampler(tokens, 32, 2, seed=0)
    for step in (5, 0, 3 * a.per_epoch):  # out of order and across epochs
        xa, ya = a.batch_at(step)
        xb, _ = b.batch_at(step)
        assert torch.equal(xa, xb) and xa.shape == (2, 32)
        assert torch.equal(xa[:, 1:], ya[:, :-1])


def test_schedule_warms_up_then_decays() -> None:
    f = lr_lambda(warmup=2, total=10, min_ratio=0.1)
    assert f(0) == 0.5 and f(1) == 1.0
    assert math.isclose(f(10), 0.1) and f(5) > f(8)


def test_training_lowers_both_losses(run_dir: Path) -> None:
    torch.set_num_threads(1)
    trainer = Trainer(run_dir, CFG)
    first = trainer.train_step()
    while trainer.step < CFG.cotrain_steps:
        last = trainer.train_step()
    assert last["loss_t"] < first["loss_t"]
    assert last["loss_d"] < first["loss_d"]
    while not trainer.done:  # phase 2: the target is frozen, the draft still learns
        before = {k: v.clone() for k, v in trainer.target.state_dict().items()}
        trainer.train_step()
        assert all(torch.equal(before[k], v) for k, v in trainer.target.state_dict().items())


def test_resume_continues_identically(run_dir: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    straight = Trainer(run_dir, CFG)
    losses = [straight.train_step() for _ in range(3)]

    first = Trainer(run_dir, CFG)
    first.train_step()
    first.train_step()
    first.save()
    resumed = Trainer(run_dir, FitConfig())  # the checkpoint's config wins
    assert resumed.step == 2 and resumed.cfg == CFG
    assert resumed.train_step() == losses[2]


ROLLOUTS = {
    "rollouts": 2,
    "rollout_prefix": 4,
    "rollout_tokens": 6,
    "unlikelihood": 0.5,
    "rollout_ce": 0.25,
}


def test_rollout_steps_train_on_the_targets_own_text_and_resume_identically(
    run_dir: Path,
) -> None:
    torch.set_num_threads(1)
    cfg = replace(CFG, **ROLLOUTS)
    straight = Trainer(run_dir, cfg)
    steps = [straight.train_step() for _ in range(3)]
    assert {"ul", "rep", "kl_roll", "kl_text"} <= steps[0].keys()
    assert steps[0]["kl_d"] == pytest.approx(steps[0]["kl_text"] + steps[0]["kl_roll"])
    # Text batches are those of a run without rollouts (the prefixes have their own stream).
    assert steps[0]["loss_t"] == Trainer(run_dir, CFG).train_step()["loss_t"]

    first = Trainer(run_dir, cfg)
    first.train_step()
    first.train_step()
    first.save()
    assert Trainer(run_dir, FitConfig()).train_step() == steps[2]


def test_ditto_steps_add_the_loop_loss_to_the_target_and_resume_identically(
    run_dir: Path,
) -> None:
    torch.set_num_threads(1)
    cfg = replace(CFG, ditto=1.0, rollout_prefix=4)
    straight = Trainer(run_dir, cfg)
    steps = [straight.train_step() for _ in range(3)]
    assert steps[0]["ditto"] > 0
    # The text batch and the target's start are those of a run without it.
    assert steps[0]["loss_t"] == Trainer(run_dir, CFG).train_step()["loss_t"]
    plain = Trainer(run_dir, CFG)
    plain.train_step()
    assert plain.train_step()["loss_t"] != steps[1]["loss_t"]  # it did change the target

    first = Trainer(run_dir, cfg)
    first.train_step()
    first.train_step()
    first.save()
    assert Trainer(run_dir, FitConfig()).train_step() == steps[2]
    # Phase 2 leaves the target alone, so it has no loop loss either.
    assert "ditto" not in Trainer(run_dir, FitConfig(), budget={"tokens": 0}).train_step()


def test_mixed_labels_are_minimised_by_the_data_and_draft_mixture() -> None:
    # One context seen with 3 labels (frequencies 1/2, 1/4, 1/4) and a draft that prefers the
    # second: the target's free logits settle at (p_data + w * p_d) / (1 + w).
    labels = torch.tensor([0, 0, 1, 2])
    draft = torch.log(torch.tensor([0.1, 0.8, 0.05, 0.05])).expand(4, 4)
    logits = torch.zeros(4, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=0.05)
    for _ in range(2000):
        opt.zero_grad()
        mixed_label_loss(logits.expand(4, 4), labels, draft, 1.0).backward()
        opt.step()
    want = (torch.tensor([0.5, 0.25, 0.25, 0.0]) + torch.tensor([0.1, 0.8, 0.05, 0.05])) / 2
    assert torch.allclose(torch.softmax(logits, -1), want, atol=1e-3)
    assert torch.softmax(logits, -1).argmax() == 1  # the draft's favourite won the argmax
    # w = 0 is the plain LM loss, and the draft receives no gradient from it.
    logits_d = draft.clone().requires_grad_()
    loss = mixed_label_loss(logits.detach().expand(4, 4), labels, logits_d, 0.0)
    assert loss == pytest.approx(
        torch.nn.functional.cross_entropy(logits.detach().expand(4, 4), labels).item()
    )
    loss = mixed_label_loss(logits.expand(4, 4), labels, logits_d, 1.0)
    assert torch.autograd.grad(loss, logits_d, allow_unused=True)[0] is None


def test_draft_mix_moves_the_target_but_not_the_drafts_step(run_dir: Path) -> None:
    torch.set_num_threads(1)
    cfg = replace(CFG, draft_mix=0.5)
    mixed, plain = Trainer(run_dir, cfg), Trainer(run_dir, CFG)
    first, ref = mixed.train_step(), plain.train_step()
    # Same batch, same starting target: the plain LM loss is reported unchanged, the draft's
    # step (against the target's logits from before its update) is identical...
    assert first["loss_t"] == ref["loss_t"] and first["kl_d"] == ref["kl_d"]
    assert first["mix"] > first["loss_t"]
    assert all(
        torch.equal(a, b)
        for a, b in zip(mixed.draft.parameters(), plain.draft.parameters(), strict=True)
    )
    # ...while the target's update differs.
    assert any(
        not torch.equal(a, b)
        for a, b in zip(mixed.target.parameters(), plain.target.parameters(), strict=True)
    )
    assert "mix" not in Trainer(run_dir, cfg, budget={"tokens": 0}).train_step()


def test_a_draft_only_stage_leaves_the_target_as_it_was(run_dir: Path) -> None:
    torch.set_num_threads(1)
    trainer = Trainer(run_dir, replace(CFG, tokens=0, **ROLLOUTS))
    before = {k: v.clone() for k, v in trainer.target.state_dict().items()}
    trainer.fit()
    assert trainer.step == CFG.draft_tokens // CFG.tokens_per_step
    assert all(torch.equal(before[k], v) for k, v in trainer.target.state_dict().items())


def test_fit_stops_on_deadline_and_replans_budget(run_dir: Path) -> None:
    torch.set_num_threads(1)
    trainer = Trainer(run_dir, CFG)
    trainer.fit(minutes=0.0)
    assert trainer.step == 0 and (run_dir / "checkpoint.pt").exists()
    replanned = Trainer(run_dir, CFG, budget={"tokens": 64 * 4})
    assert replanned.cfg.cotrain_steps == 4
    assert replanned.replans == [{"step": 0, "tokens": CFG.tokens}]
    replanned.fit()
    assert replanned.done and replanned.step == replanned.cfg.total_steps == 6


def test_a_stage_that_was_replanned_and_stopped_is_replayed_by_its_fit_lines(
    run_dir: Path, tmp_path: Path
) -> None:
    import shutil

    from saguaro.train.cli import main
    from saguaro.train.export import continuation, export, render_card, stage_fits

    torch.set_num_threads(1)
    Trainer(run_dir, CFG).fit(stop_at=3)
    replanned = Trainer(run_dir, CFG, budget={"tokens": 64 * 6})
    replanned.fit(stop_at=5)
    assert replanned.step == 5 and not replanned.done
    meta = export(run_dir, tmp_path / "stage")
    lines = stage_fits(meta).split("\n")
    assert lines[0].startswith("--tokens 512 --draft-tokens 128 --batch 2 --ctx 32")
    assert lines[0].endswith(" --stop-at 3")
    assert lines[1:] == ["--tokens 384 --draft-tokens 128 --stop-at 5"]

    replay = tmp_path / "replay"
    replay.mkdir()
    for name in ("tokenizer.json", "train.bin", "heldout.bin", "split.json"):
        shutil.copy(run_dir / name, replay / name)
    # The tiny shapes are not `fit` options, so a step-0 checkpoint carries them into the replay.
    Trainer(replay, CFG).save()
    for line in lines:
        assert main(["--run-dir", str(replay), "--threads", "1", "fit", *line.split()]) == 0
    again = Trainer(replay, FitConfig())
    assert again.step == 5 and [r["step"] for r in again.replans] == [3]
    for a, b in ((again.target, replanned.target), (again.draft, replanned.draft)):
        assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    # A later stage's card replays it line by line in its own run directory, then exports it.
    later = {**meta, "config": {**meta["config"], **continuation(tmp_path / "stage")}}
    card = render_card("target", later, None).splitlines()
    at = card.index("python -m saguaro.train --run-dir RUN1 prepare")
    assert card[at + 1 : at + 4] == [
        f"python -m saguaro.train --run-dir RUN1 fit {lines[0]}",
        f"python -m saguaro.train --run-dir RUN1 fit {lines[1]}",
        "python -m saguaro.train --run-dir RUN1 export --out STAGE1",
    ]
    assert card[at + 5].endswith("--init-from STAGE1")


def test_a_run_continues_an_export_and_counts_its_tokens(run_dir: Path, tmp_path: Path) -> None:
    import json
    import shutil

    from saguaro.train.export import TRAINING_META, continuation, export, render_card
    from saguaro.train.trainer import CKPT_NAME

    torch.set_num_threads(1)
    first = Trainer(run_dir, CFG)
    first.fit()
    stage1 = export(run_dir, tmp_path / "stage1")

    second_dir = tmp_path / "run2"
    second_dir.mkdir()
    for name in ("tokenizer.json", "train.bin", "heldout.bin", "split.json"):
        shutil.copy(run_dir / name, second_dir / name)
    second = Trainer(second_dir, replace(CFG, **continuation(tmp_path / "stage1")))
    for a, b in ((first.target, second.target), (first.draft, second.draft)):
        assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    second.fit()
    stage2 = export(second_dir, tmp_path / "stage2")
    assert stage2["target_tokens_seen"] == 2 * stage1["target_tokens_seen"]
    assert stage2["tokens_seen"] == 2 * stage1["tokens_seen"]
    card = (tmp_path / "stage2" / "target" / "README.md").read_text()
    assert "--init-from STAGE1" in card and "--tokens 512 --draft-tokens 128" in card
    # a third stage lists both earlier ones, each continuing the one before
    third_dir = tmp_path / "run3"
    shutil.copytree(second_dir, third_dir)
    (third_dir / CKPT_NAME).unlink()
    cfg3 = replace(
        CFG, seed=5, ditto=0.5, draft_mix=0.25, **ROLLOUTS, **continuation(tmp_path / "stage2")
    )
    assert len(cfg3.prior_fits) == 2 and "--seed" not in cfg3.prior_fits[0]
    Trainer(third_dir, cfg3).fit()
    stage3 = export(third_dir, tmp_path / "stage3")
    assert stage3["target_tokens_seen"] == 3 * stage1["target_tokens_seen"]
    card = (tmp_path / "stage3" / "target" / "README.md").read_text()
    assert "RUN2 fit --tokens" in card and "--init-from STAGE1\n" in card
    last = next(line for line in card.splitlines() if "--init-from STAGE2" in line)
    assert "RUN fit" in last and "--seed 5" in last and "2 earlier stages" in card
    assert "--rollouts 2 --unlikelihood 0.5 --rollout-ce 0.25" in last
    assert "unlikelihood of every token" in card and "the target's greedy tokens" in card
    assert "--ditto 0.5" in last and "adds 0.5 x a loss against loops" in card
    assert "--draft-mix 0.25" in last and "mixed 0.25 x the draft's distribution" in card
    # configs written before prior_fits named their one earlier stage prior_fit
    legacy = {**FitConfig().to_dict(), "prior_fit": "--tokens 1"}
    del legacy["prior_fits"]
    assert FitConfig.from_dict(legacy).prior_fits == ["--tokens 1"]
    meta2 = json.loads((tmp_path / "stage2" / "target" / TRAINING_META).read_text())
    meta2["config"]["prior_fit"] = meta2["config"].pop("prior_fits")[0]
    assert "--init-from STAGE1" in render_card("target", meta2, None)
    # a draft-only stage (--tokens 0) says the target was trained earlier, not by it
    meta2["config"]["tokens"] = 0
    assert "this stage trained only the draft" in render_card("target", meta2, None)
    meta3 = json.loads((tmp_path / "stage3" / "target" / TRAINING_META).read_text())
    later = {**meta3, "config": {**continuation(tmp_path / "stage3"), "tokens": 0}}
    later["config"] = {**FitConfig().to_dict(), **later["config"]}
    later_card = render_card("target", later, None)
    assert "An earlier stage (its command is below) trained the target against loops" in later_card
    assert "An earlier stage (its command is below) mixed the draft's" in later_card


def test_continuing_an_export_with_another_tokenizer_is_refused(
    run_dir: Path, tiny_tree: Path, tmp_path: Path
) -> None:
    from saguaro.train.export import export

    torch.set_num_threads(1)
    Trainer(run_dir, CFG).save()
    export(run_dir, tmp_path / "stage1")
    other = tmp_path / "other"
    prepare(PrepareConfig(tiny_tree, other, vocab_size=280, heldout_permille=300))
    with pytest.raises(ValueError, match="tokenizer differs"):
        Trainer(other, replace(CFG, init_from=str(tmp_path / "stage1")))
