import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from saguaro.train.data import PrepareConfig, WindowSampler, load_tokens, prepare  # noqa: E402
from saguaro.train.models import ModelSpec  # noqa: E402
from saguaro.train.trainer import FitConfig, Trainer, lr_lambda  # noqa: E402

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


def test_fit_stops_on_deadline_and_replans_budget(run_dir: Path) -> None:
    torch.set_num_threads(1)
    trainer = Trainer(run_dir, CFG)
    trainer.fit(minutes=0.0)
    assert trainer.step == 0 and (run_dir / "checkpoint.pt").exists()
    replanned = Trainer(run_dir, CFG, budget={"tokens": 64 * 4})
    assert replanned.cfg.cotrain_steps == 4
    replanned.fit()
    assert replanned.done and replanned.step == replanned.cfg.total_steps == 6
