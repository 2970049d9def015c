"""float16 training in the trainer (``exatrain train --dtype float16``): autocast in float16 and dynamic loss scaling
with torch's gradient scaler (trainer/train.py ``LossScaler``: a ShardedGradScaler over the world group, unscaling
each rank's local gradients in place). The CPU runs it too (torch's CPU autocast has float16), so nothing refuses it.

Broken on purpose and seen to fail here: the unscale skipped (``LossScaler.unscale`` not called: the grad norms are
the scale times the bf16 run's), the scaler over each rank's own group (``process_group=None`` on gloo: the rank
without the overflow stepped), the loss not multiplied by the scale (the scaled-gradient check); clipping applied to
the still-scaled gradients, the logged norm divided back by the scale (Trainer.step: clip_grad_norm before
``unscale``; test_three_float16_steps_with_the_scaler_are_those_without_it, the second step's loss 0.2% off); the
scaler's update called only on steps taken (Trainer.step: ``update`` inside the branch that steps;
test_an_overflow_through_the_trainer_skips_the_step_and_backs_the_scale_off, the scale stays 65,536)."""

from __future__ import annotations

import math
from datetime import timedelta
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.helpers.trainer_runs import run_batch


def _ranks(rank: int, world: int, init: str, out: str) -> None:
    """Two ranks, each holding its own parameter (as a DTensor's local shard would be): rank 1's gradient
    overflows in the first step only."""
    from exatrain.trainer.train import LossScaler

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        p = torch.nn.Parameter(torch.ones(4))
        opt = torch.optim.SGD([p], lr=1.0)
        scaler = LossScaler(opt, [SimpleNamespace(param=p)], torch.device("cpu"))
        log = []
        for step in range(2):
            scale = scaler.scale
            p.grad = torch.full((4,), 2.0 * scale)  # a gradient of 2 at the loss scale
            if step == 0 and rank == 1:
                p.grad[0] = float("inf")
            scaler.unscale()
            found = scaler.found_inf
            if not found:
                scaler.step()
            scaler.update()
            opt.zero_grad(set_to_none=True)
            log.append((scale, found, p.detach().tolist()))
        torch.save(log, os.path.join(out, f"rank{rank}.pt"))
        # both ranks past every collective before either tears its gloo pairs down (destroying the group while the
        # other still talks over it can abort that process); bounded, so a rank that failed above is not waited on
        dist.monitored_barrier(timeout=timedelta(seconds=120))
    finally:
        dist.destroy_process_group()


def test_an_overflow_on_one_rank_skips_the_step_on_every_rank_and_halves_the_scale(tmp_path: Path) -> None:
    init = f"file://{tmp_path / 'init'}"
    mp.spawn(_ranks, args=(2, init, str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        (s0, found0, p0), (s1, found1, p1) = torch.load(tmp_path / f"rank{rank}.pt")
        assert found0 and p0 == [1.0] * 4  # skipped on both ranks, the rank without the inf too
        assert s1 == s0 / 2 and not found1  # the backoff (0.5), then a good step
        assert p1 == [1.0 - 2.0] * 4  # unscaled: the update is lr x 2, not lr x 2 x scale


def test_a_two_rank_float16_run_trains_as_the_bfloat16_one(tmp_path: Path) -> None:
    runs = run_batch(
        tmp_path,
        {
            "fp16": dict(dp=2, zero_stage=1, dtype="float16", steps=3),
            "bf16": dict(dp=2, zero_stage=1, dtype="bfloat16", steps=3),
        },
        timeout_s=600,
    )
    fp16, bf16 = runs["fp16"], runs["bf16"]
    assert len(fp16.losses) == 3 and all(math.isfinite(x) for x in fp16.losses)
    # the first step's loss is the same forward in another 16-bit format
    assert fp16.losses[0] == pytest.approx(bf16.losses[0], rel=2e-2)
    # a step the scaler took reports the unscaled norm (a skipped one reports inf and does not update)
    taken = [i for i, g in enumerate(fp16.grad_norms) if math.isfinite(g)]
    assert taken and taken[0] == 0
    assert fp16.grad_norms[0] == pytest.approx(bf16.grad_norms[0], rel=5e-2)


def _fp16_trainer(steps: int = 3):
    """A one-rank float16 Trainer of gpt-tiny (two micro-batches of 2 sequences), the trainer's defaults (AdamW,
    gradient clipping at 1.0)."""
    from exatrain.catalog import get_model
    from exatrain.plan import ParallelDims, Plan, TrainShape
    from exatrain.trainer.config import TrainConfig
    from exatrain.trainer.train import Trainer

    plan = Plan(
        model=get_model("gpt-tiny"), dims=ParallelDims(), shape=TrainShape(2, 4), dtype="float16", cluster="local-cpu"
    ).validate()
    return Trainer(TrainConfig(plan=plan, steps=steps, quiet=True).check())


def test_three_float16_steps_with_the_scaler_are_those_without_it(one_rank: None) -> None:
    """The trainer's float16 step (scale the loss, unscale, clip, step) against the same run without loss scaling
    (no scaler: the loss at scale 1, nothing to unscale). The scale is a power of two, so without an overflow or an
    underflow the gradients are the same numbers times it: every step's loss and gradient norm agree to float16's
    rounding noise. Clipping the still-scaled gradients clips every step (their norm is 65,536 times the true one)
    and moves the losses from step 2 and the norms by far more."""
    scaled, plain = _fp16_trainer(), _fp16_trainer()
    plain.scaler = None
    assert scaled.scaler is not None and scaled.scaler.scale == 2.0**16
    got = [scaled.step(i) for i in range(3)]
    want = [plain.step(i) for i in range(3)]
    assert not any(m.skipped for m in got + want)
    assert scaled.scaler.scale == 2.0**16  # no overflow: the scale did not back off
    for step, (g, w) in enumerate(zip(got, want), 1):
        assert g.loss == pytest.approx(w.loss, rel=1e-4), step
        assert g.grad_norm == pytest.approx(w.grad_norm, rel=1e-3), step


def test_an_overflow_through_the_trainer_skips_the_step_and_backs_the_scale_off(one_rank: None) -> None:
    """An infinite gradient in the first step (a hook on one weight): the trainer skips the update (the weights
    stay, no NaN counted), reports the step skipped, and the scaler's update halves the scale for the next step,
    which is taken."""
    t = _fp16_trainer()
    weight = next(p for p in t.pm.modules[0].parameters() if p.requires_grad)
    hook = weight.register_hook(lambda g: torch.full_like(g, float("inf")))
    before = [p.detach().clone() for p in t.pm.modules[0].parameters()]
    first = t.step(0)
    hook.remove()
    assert first.skipped and math.isfinite(first.loss) and t.nan_skipped == 0
    assert all(torch.equal(b, p.detach()) for b, p in zip(before, t.pm.modules[0].parameters()))
    assert t.scaler.scale == 2.0**15  # backed off from 65,536
    second = t.step(1)
    assert not second.skipped and math.isfinite(second.grad_norm) and t.scaler.scale == 2.0**15
    assert any(not torch.equal(b, p.detach()) for b, p in zip(before, t.pm.modules[0].parameters()))
