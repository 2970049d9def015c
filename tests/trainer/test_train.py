"""The step loop in this process (a one-rank gloo group): metrics lines, and a failed run's record."""

from __future__ import annotations

from pathlib import Path

import pytest

from exatrain.catalog import get_model
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.records import read_run_records
from exatrain.trainer.config import TrainConfig
from exatrain.trainer.train import Trainer


def config(tmp_path: Path, steps: int) -> TrainConfig:
    plan = Plan(model=get_model("gpt-tiny"), dims=ParallelDims(), shape=TrainShape(2, 4), dtype="float32").validate()
    return TrainConfig(plan=plan, steps=steps, metrics_file=str(tmp_path / "m.jsonl"), quiet=True).check()


def test_a_failed_run_still_leaves_a_record_of_what_it_measured(
    tmp_path: Path, one_rank: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = Trainer(config(tmp_path, steps=5))
    real_step = trainer.step

    def step(i: int):
        if i == 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_step(i)

    monkeypatch.setattr(trainer, "step", step)
    with pytest.raises(RuntimeError, match="out of memory"):
        trainer.run()
    (rec,) = read_run_records(tmp_path / "m.jsonl")
    assert rec.status == "oom" and "Tried to allocate" in rec.error
    assert rec.measured is not None and rec.measured.steps == 2


def test_each_step_updates_and_reports(tmp_path: Path, one_rank: None) -> None:
    history = Trainer(config(tmp_path, steps=3)).run()
    assert [m.step for m in history] == [1, 2, 3]
    assert history[0].lr < history[1].lr  # warm-up
    assert history[-1].loss < history[0].loss and all(m.grad_norm > 0 for m in history)
    (rec,) = read_run_records(tmp_path / "m.jsonl")
    assert rec.status == "ok" and rec.measured.last_loss == history[-1].loss and rec.env["world_size"] == 1
