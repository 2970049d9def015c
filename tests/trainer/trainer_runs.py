"""Helpers for the multi-process trainer tests: build configs, run a batch of them in one set of
spawned ranks (one torch import per rank for the whole batch), read back the metrics files."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exatrain.catalog import get_model
from exatrain.catalog.models import ModelSpec
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.trainer.config import TrainConfig
from exatrain.trainer.spawn import launch_local

STEPS = 10
MICRO_BATCH = 2
GLOBAL_BATCH = 8  # 4 micro-batches with dp 1, 2 per replica with dp 2: every schedule's minimum
LR = 3e-3  # high enough that 10 steps move the loss well away from its start


@dataclass(frozen=True)
class Run:
    losses: list[float]
    grad_norms: list[float]
    steps: list[dict[str, Any]]
    record: dict[str, Any] | None


def config(out: Path, name: str, *, model: str | ModelSpec = "gpt-tiny", tp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1,
           dtype: str = "float32", steps: int = STEPS, compile: bool = False, train_kw: dict[str, Any] | None = None,
           **plan_kw: Any) -> TrainConfig:
    """One run's TrainConfig: ``model`` a preset name or a spec; ``train_kw`` further TrainConfig fields."""
    plan = Plan(model=get_model(model) if isinstance(model, str) else model, dims=ParallelDims(tp=tp, pp=pp, dp=dp, ep=ep),
                shape=TrainShape(MICRO_BATCH, GLOBAL_BATCH), dtype=dtype, **plan_kw).validate()
    return TrainConfig(plan=plan, steps=steps, seed=0, lr=LR, metrics_file=str(out / f"{name}.jsonl"),
                       quiet=True, compile=compile, **(train_kw or {})).check()


def run_batch(out: Path, cases: dict[str, dict[str, Any]], timeout_s: float) -> dict[str, Run]:
    """Run every case (all with the same number of ranks) in one launch; results by case name.
    ``timeout_s`` is no deadline: the launch fails only when no rank makes progress for that long."""
    out.mkdir(parents=True, exist_ok=True)
    configs = [config(out, name, **kw) for name, kw in cases.items()]
    launch_local(configs, stall_s=timeout_s)
    return {name: read_run(out / f"{name}.jsonl") for name in cases}


def read_run(path: Path) -> Run:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    steps = [x for x in lines if x["kind"] == "step"]
    records = [x for x in lines if x["kind"] == "run_record"]
    return Run(losses=[s["loss"] for s in steps], grad_norms=[s["grad_norm"] for s in steps], steps=steps,
               record=records[-1] if records else None)


def max_rel_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))
