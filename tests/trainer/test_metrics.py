"""Model FLOPs, device peaks, run summaries and the learning-rate schedule."""

from __future__ import annotations

import math

import pytest
import torch

from exatrain.catalog import get_model, match_device
from exatrain.errors import PlanError
from exatrain.plan import MemoryBreakdown, ParallelDims, Plan, StepEstimate, TrainShape
from exatrain.trainer.config import TrainConfig
from exatrain.trainer.metrics import StepMetrics, plan_model_flops, peak_flops, summarize
from exatrain.trainer.train import lr_factor


def plan_for(name: str, **kw) -> Plan:
    return Plan(model=get_model(name), dims=ParallelDims(tp=1, pp=1, dp=1), shape=TrainShape(1, 8), **kw).validate()


def test_model_flops_without_an_estimate_is_korthikanti_eq7() -> None:
    plan = plan_for("gpt-175b")
    m = plan.model
    B, s, L, h, V = plan.global_batch, m.seq_len, m.layers, m.hidden, m.vocab
    eq7 = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    assert plan_model_flops(plan) == pytest.approx(eq7, rel=1e-12)


def test_model_flops_come_from_the_plans_estimate_when_it_has_one() -> None:
    mem = MemoryBreakdown()
    est = StepEstimate(
        params=1,
        params_by_stage=(1,),
        memory_bytes=mem,
        memory_by_stage=(mem,),
        capacity_bytes=1,
        fits=True,
        model_flops_per_step=1.25e15,
    )
    assert plan_model_flops(plan_for("gpt-tiny").with_estimate(est)) == 1.25e15


def test_device_peaks() -> None:
    assert match_device("NVIDIA H200").name == "h200-sxm"
    assert match_device("NVIDIA H100 80GB HBM3").name == "h100-sxm"
    assert match_device("NVIDIA A100-SXM4-80GB").name == "a100-80gb"
    assert match_device("AMD Instinct MI250X").name == "mi250x-gcd"
    assert match_device("AMD Instinct MI300X").name == "mi300x"
    assert match_device("NVIDIA GeForce RTX 4090") is None
    assert peak_flops(torch.device("cpu"), "bfloat16") is None


def test_summary_takes_medians_after_warm_up_and_peaks_by_stage() -> None:
    plan = Plan(model=get_model("gpt-tiny"), dims=ParallelDims(tp=1, pp=2, dp=2), shape=TrainShape(1, 8)).validate()
    times = [5.0, 3.0, 1.0, 2.0, 4.0]
    steps = [
        StepMetrics(
            step=i + 1,
            loss=10.0 - i,
            grad_norm=1.0,
            lr=1e-3,
            step_time_s=t,
            tokens_per_s=100 / t,
            model_tflops_per_gpu=1 / t,
            mfu=None,
            peak_memory_bytes=(1, 2, 7, 4 + i),
        )
        for i, t in enumerate(times)
    ]
    m = summarize(steps, plan, measure_after=2)
    assert m.step_time_s == 2.0 and m.tokens_per_s == 50.0 and m.model_tflops_per_gpu == 0.5
    assert m.mfu is None and (m.first_loss, m.last_loss) == (10.0, 6.0) and m.steps == 5
    assert m.peak_memory_by_stage == (2.0, 8.0) and m.peak_memory_bytes == 8.0


def test_learning_rate_warms_up_then_decays_to_the_floor() -> None:
    cfg = TrainConfig(plan=plan_for("gpt-tiny"), steps=110, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_factor(0, cfg) == pytest.approx(0.1) and lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(10, cfg) == pytest.approx(1.0)
    assert lr_factor(60, cfg) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_factor(110, cfg) == pytest.approx(0.1) and lr_factor(500, cfg) == pytest.approx(0.1)


def test_zero_bubble_with_fsdp_is_refused() -> None:
    plan = Plan(
        model=get_model("gpt-tiny"),
        dims=ParallelDims(pp=2, dp=2),
        shape=TrainShape(1, 8),
        zero_stage=3,
        schedule="zero_bubble",
        interleave=2,
    ).validate()
    with pytest.raises(PlanError, match="zero_bubble"):
        TrainConfig(plan=plan).check()
    TrainConfig(plan=plan.replace(zero_stage=1)).check()
