"""Helpers for the multi-process trainer tests: build configs, run a batch of them in one set of
spawned ranks (one torch import per rank for the whole batch), read back the metrics files and the
per-parameter dumps (trainer/debug.py), and measure how far two runs' parameters are apart."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch

from exatrain.catalog import get_model
from exatrain.catalog.models import ModelSpec
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.data.prepare import default_dataset
from exatrain.trainer.config import TrainConfig
from exatrain.trainer.debug import read_dump
from exatrain.trainer.spawn import launch_local

STEPS = 10
MICRO_BATCH = 2
GLOBAL_BATCH = 8  # 4 micro-batches with dp 1, 2 per replica with dp 2: every schedule's minimum
LR = 3e-3  # high enough that 10 steps move the loss well away from its start
# The bounds of a layout's parity with its single-process reference (test_parity.py's docstring says how
# far the runs were measured to be): per-step losses and gradient norms; grad_error of the step-1
# gradients; weight_errors' whole update and any single weight after the last step.
RTOL = 1e-5
GRAD_RTOL = 1e-5
UPDATE_RTOL = 1e-4
WEIGHT_ATOL = 1e-4


@dataclass(frozen=True)
class Run:
    losses: list[float]
    grad_norms: list[float]
    steps: list[dict[str, Any]]
    record: dict[str, Any] | None
    dump: Path | None = None  # the run's dump directory (trainer/debug.py)

    def grads(self) -> dict[str, torch.Tensor]:
        """Whole gradients of the run's first step, by parameter name in the single-device model."""
        return read_dump(self._dump(), f"grads-step{self.steps[0]['step']:08d}")

    def weights(self, step: int | None = None) -> dict[str, torch.Tensor]:
        """Whole weights after ``step`` optimizer steps (the run's first or its last; default: the last)."""
        return read_dump(self._dump(), f"weights-step{self.steps[-1]['step'] if step is None else step:08d}")

    def dtypes(self) -> dict[str, str]:
        """The dtypes the first attention query projection saw in the run's first forward."""
        record = json.loads((self._dump() / "dtypes.pp0.json").read_text())
        return {k: v for k, v in record.items() if k != "module"}

    def layer_class(self) -> str:
        """The class of that layer (``Float8Linear`` under --fp8, else ``Linear``)."""
        return json.loads((self._dump() / "dtypes.pp0.json").read_text())["module"]

    def _dump(self) -> Path:
        assert self.dump is not None, "this run was not dumped"
        return self.dump


@cache
def default_data() -> str:
    """The default corpus's prepared dataset (data/prepare.py), found once per test process: the path a
    rank would find itself, handed over so that no rank of any case generates the corpus again."""
    return str(default_dataset())


def config(
    out: Path,
    name: str,
    *,
    model: str | ModelSpec = "gpt-tiny",
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    ep: int = 1,
    cp: int = 1,
    dtype: str = "float32",
    steps: int = STEPS,
    compile: bool = False,
    dropout: float = 0.0,
    tied: bool | None = None,
    train_kw: dict[str, Any] | None = None,
    **plan_kw: Any,
) -> TrainConfig:
    """The config of one case, dumped to out/<name>.dump/: ``model`` a preset name or a spec; ``dropout``
    and ``tied`` override the model's; ``train_kw`` further TrainConfig fields."""
    spec = (get_model(model) if isinstance(model, str) else model).replace(dropout=dropout)
    if tied is not None:
        spec = spec.replace(tied_embeddings=tied)
    plan = Plan(
        model=spec,
        dims=ParallelDims(tp=tp, pp=pp, dp=dp, ep=ep, cp=cp),
        shape=TrainShape(MICRO_BATCH, GLOBAL_BATCH),
        dtype=dtype,
        **plan_kw,
    ).validate()
    kw = {"dump_dir": str(out / f"{name}.dump"), "data_dir": default_data(), **(train_kw or {})}
    return TrainConfig(
        plan=plan,
        steps=steps,
        seed=0,
        lr=LR,
        metrics_file=str(out / f"{name}.jsonl"),
        quiet=True,
        compile=compile,
        **kw,
    ).check()


def run_batch(out: Path, cases: dict[str, dict[str, Any]], timeout_s: float) -> dict[str, Run]:
    """Run every case (all with the same number of ranks) in one launch; results by case name.
    ``timeout_s`` is no deadline: the launch fails only when no rank makes progress for that long."""
    out.mkdir(parents=True, exist_ok=True)
    configs = [config(out, name, **kw) for name, kw in cases.items()]
    launch_local(configs, stall_s=timeout_s)
    return {name: read_run(out / f"{name}.jsonl") for name in cases}


def read_run(path: Path) -> Run:
    """The metrics file out/<name>.jsonl, and the dump directory out/<name>.dump/ when there is one."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    steps = [x for x in lines if x["kind"] == "step"]
    records = [x for x in lines if x["kind"] == "run_record"]
    dump = path.with_suffix(".dump")
    return Run(
        losses=[s["loss"] for s in steps],
        grad_norms=[s["grad_norm"] for s in steps],
        steps=steps,
        record=records[-1] if records else None,
        dump=dump if dump.is_dir() else None,
    )


def parity_checks(run: Run, ref: Run) -> dict[str, bool]:
    """The parity checks of ``run`` against its single-process reference ``ref`` (the bounds above), by a
    name that carries the measured error: losses and gradient norms per step, the step-1 gradients, the
    update and the single weights after the last step."""
    assert len(run.losses) == len(ref.losses), (len(run.losses), len(ref.losses))
    g_err, g_at = grad_error(run.grads(), ref.grads())
    u_err, w_err, w_at = weight_errors(run.weights(), ref.weights(), ref.weights(0))
    return {
        f"losses ({max_rel_diff(run.losses, ref.losses):.2e})": max_rel_diff(run.losses, ref.losses) <= RTOL,
        f"gradient norms ({max_rel_diff(run.grad_norms, ref.grad_norms):.2e})": (
            max_rel_diff(run.grad_norms, ref.grad_norms) <= RTOL
        ),
        f"step-1 gradients ({g_err:.2e} at {g_at})": g_err <= GRAD_RTOL,
        f"update ({u_err:.2e})": u_err <= UPDATE_RTOL,
        f"weights ({w_err:.2e} at {w_at})": w_err <= WEIGHT_ATOL,
    }


def assert_checks(checks: dict[str, bool]) -> None:
    """Fail naming every check that failed, with its measured error."""
    failed = [name for name, ok in checks.items() if not ok]
    assert not failed, failed


def lines(metrics: Path) -> list[dict]:
    """A run's metrics file (JSON lines), [] before it exists."""
    if not metrics.is_file():
        return []
    return [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]


def steps(metrics: Path) -> list[int]:
    """The steps a run's metrics file has recorded, in order."""
    return [x["step"] for x in lines(metrics) if x["kind"] == "step"]


def max_rel_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def grad_error(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> tuple[float, str]:
    """The worst parameter's largest gradient difference, relative to that parameter's largest
    reference entry, or to 1e-3 of the largest entry of any parameter when that is larger (a
    parameter whose exact gradient is zero, such as the key bias (softmax ignores a shift of all
    of a query's scores), holds only rounding noise); and its name."""
    assert set(got) == set(ref), sorted(set(got) ^ set(ref))
    top = max(r.abs().max().item() for r in ref.values())
    return max(((got[n] - r).abs().max().item() / max(r.abs().max().item(), 1e-3 * top), n) for n, r in ref.items())


def weight_errors(
    got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], init: dict[str, torch.Tensor]
) -> tuple[float, float, str]:
    """(relative L2 error of the whole model's training update, W - W0, against the reference's;
    the largest single weight difference; the parameter it is in).

    Two views because AdamW divides each entry's gradient by its own running RMS: an entry whose
    gradient is at rounding level (a dead GELU unit, the key bias) turns rounding differences into
    visible update differences (~1e-5 here), so single entries are bounded loosely, while a
    systematic error (a wrong decay, a stale shard, a scaled update) moves the whole update."""
    assert set(got) == set(ref) == set(init), sorted(set(got) ^ set(ref))
    num = sum(float((got[n] - ref[n]).double().pow(2).sum()) for n in ref)
    den = sum(float((ref[n] - init[n]).double().pow(2).sum()) for n in ref)
    worst, at = max(((got[n] - ref[n]).abs().max().item(), n) for n in ref)
    return (num / den) ** 0.5, worst, at
