"""Helpers for the checkpoint tests: the trainer tests' multi-rank harness (tests/helpers/trainer_runs.py)
with the checkpoint, resume and sample-recording options of TrainConfig."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.helpers.trainer_runs import Run, config, max_rel_diff, read_run

from exatrain.trainer.spawn import launch_local

TRAIN_KEYS = (
    "checkpoint_dir",
    "save_every",
    "keep_last",
    "async_save",
    "resume_from",
    "tensorboard_dir",
    "record_samples",
    "nan_policy",
)


def run_cases(out: Path, cases: dict[str, dict[str, Any]], timeout_s: float) -> dict[str, Run]:
    """Every case in one launch, in order (a later case may resume from an earlier one's checkpoint).
    Keys of TrainConfig (TRAIN_KEYS) go to the config, the rest to the plan, as in trainer_runs.
    ``timeout_s`` is no deadline: the launch fails only when no rank makes progress for that long."""
    out.mkdir(parents=True, exist_ok=True)
    configs = []
    for name, kw in cases.items():
        train = {k: kw.pop(k) for k in list(kw) if k in TRAIN_KEYS}
        configs.append(replace(config(out, name, **kw), **{"record_samples": True, **train}))
    launch_local(configs, stall_s=timeout_s)
    return {name: read_run(out / f"{name}.jsonl") for name in cases}


def samples_by_step(run: Run) -> list[list[int]]:
    """The global sample indices each step read, all dp ranks together, in dp-rank order."""
    return [[i for share in s["samples"] for i in share] for s in run.steps]


__all__ = ["Run", "max_rel_diff", "run_cases", "samples_by_step"]
