"""The passes exatrain's own trainer makes over its parameters every micro-batch (``EngineProfile.autocast_casts``,
``autograd_accum``; ``cost.step.with_parameter_passes``): counted here on the trainer's own model as its step runs it
(a dispatch-mode counter over ``aten._to_copy`` and ``add_``; FSDP2 on two gloo ranks,
``tests/helpers/fsdp_grad_passes.py``), then priced exactly as counted: on the CPU all of them, on a GPU those on the
compute stream.

Broken on purpose and seen to fail here: the full recomputation's rerun casts left out of the step (the step test,
recompute full), the embedding table counted as a GEMM weight (the counting test), the adds priced on every
micro-batch instead of all but the first (the step and float32 tests), the casts priced under float32 training (the
float32 test), FSDP's kept gradients priced from the first micro-batch's add on (``m - 2`` for ``m - 1``: the FSDP
step test), ``plan_stage_times`` without them (the timeline test), the shard-sized copies FSDP2 runs on its own streams
priced on a GPU's compute stream (the FSDP compute-stream tests), or left out on the CPU, which has no streams (the
CPU test)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from exatrain.accounting import engines
from exatrain.accounting.params import total_params
from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster, get_model
from exatrain.planner.cost import compute
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.cost.step import (
    CAST_BYTES_FP32_BF16,
    COPY_BYTES_BF16,
    COPY_BYTES_FP32,
    GRAD_ADD_BYTES_BF16_INTO_FP32,
    GRAD_ADD_BYTES_FP32,
    cast_params,
)
from exatrain.planner.plan_cost import plan_stage_times
from exatrain.planner.estimate import estimate_plan
from exatrain.trainer.model import Transformer
from exatrain.trainer.parallel.activation import apply_activation_checkpointing
from tests.helpers.passes import rank_params

H100 = get_cluster("dgx-h100")


class _Elements(TorchDispatchMode):
    """Elements each kind of pass moves: weights cast to bf16, gradients cast to fp32, adds into .grad."""

    def __init__(self, shapes: set[tuple[int, ...]]) -> None:
        super().__init__()
        self.shapes, self.n = shapes, Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name, x = func.overloadpacket.__name__, args[0]
        if isinstance(x, torch.Tensor) and tuple(x.shape) in self.shapes:
            if name == "_to_copy" and x.dtype == torch.float32 and out.dtype == torch.bfloat16:
                self.n["cast"] += x.numel()
            elif name == "_to_copy" and x.dtype == torch.bfloat16 and out.dtype == torch.float32:
                self.n["grad_cast"] += x.numel()
            elif name == "add_" and x.dtype == torch.float32:
                self.n["add"] += x.numel()
        return out


def _count(model_name: str, recompute: str) -> tuple[Counter, Counter, Transformer]:
    """(first micro-batch's elements, second's) of the trainer's model under bf16 autocast, as train.py runs it."""
    spec = get_model(model_name).replace(dropout=0.0)
    torch.manual_seed(0)
    model = Transformer(spec)
    apply_activation_checkpointing(model, recompute)
    shapes = {tuple(p.shape) for p in model.parameters()}
    counts = []
    for _ in range(2):
        with _Elements(shapes) as c:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(torch.randint(0, spec.vocab, (2, 16))).float().mean()
            loss.backward()
        counts.append(c.n)
    return counts[0], counts[1], model


@pytest.mark.parametrize("model_name", ["llama-tiny", "gpt-tiny"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_the_counts_are_the_trainers_own(model_name: str, recompute: str) -> None:
    first, second, model = _count(model_name, recompute)
    spec = model.spec
    total = sum(p.numel() for p in model.parameters())
    assert total == total_params(spec)
    gemm, blocks = cast_params(spec, [1], 1, [[float(total)]])
    # autocast leaves the norms' weights (and GPT's norm biases) fp32: the priced count includes them
    # (cast_params' docstring); a linear's bias is cast with its weight
    norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    block_norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n and n.startswith("layers."))
    rerun = blocks[0, 0] - block_norms if recompute == "full" else 0
    for c in (first, second):
        assert c["cast"] == gemm[0, 0] - norms + rerun
        assert c["grad_cast"] == gemm[0, 0] - norms
    # autograd takes the first micro-batch's gradient as it is and adds every later one: every parameter
    assert first["add"] == 0 and second["add"] == total


def _plan(**kw):
    args = dict(gpus=8, tp=2, pp=1, micro_batch=1, global_batch=16, zero=1, recompute="full", runtime="exatrain")
    args.update(kw)
    return make_plan("llama3-8b", H100, **args)


def _without_passes(monkeypatch) -> None:
    plain = dataclasses.replace(engines.EXATRAIN, autocast_casts=False, autograd_accum=False, fsdp_pass_zero=())
    monkeypatch.setitem(engines.ENGINES, "exatrain", plain)


def _priced(plan, monkeypatch, cluster=H100) -> tuple[float, float]:
    params = default_params(cluster.device.name)
    with_passes = estimate_plan(plan, cluster, params).time_s.compute
    with monkeypatch.context() as mp:
        _without_passes(mp)
        without = estimate_plan(plan, cluster, params).time_s.compute
    return with_passes, without


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_the_step_pays_them_every_micro_batch(monkeypatch, recompute: str) -> None:
    plan = _plan(recompute=recompute)
    with_passes, without = _priced(plan, monkeypatch)
    params = rank_params(plan)
    gemm, blocks = cast_params(plan.model, [plan.tp], 1, params)
    m = plan.num_microbatches
    per_micro_batch = (
        CAST_BYTES_FP32_BF16 * (2 * gemm + (blocks if recompute == "full" else 0))
        + GRAD_ADD_BYTES_FP32 * (m - 1) / m * params
    )[0, 0]
    dev = compute.device_for(H100, "bfloat16", default_params(H100.device.name), plan.gpus)
    assert m == 4
    assert with_passes - without == pytest.approx(m * float(compute.elementwise_time_s(per_micro_batch, dev)), rel=1e-9)
    notes = estimate_plan(plan, H100).notes
    assert any(n.startswith("parameter passes every micro-batch (DDP") for n in notes)


def test_float32_training_pays_the_adds_only(monkeypatch) -> None:
    plan = _plan(dtype="float32", gpus=16, tp=4)
    with_passes, without = _priced(plan, monkeypatch)
    m, params = plan.num_microbatches, rank_params(plan)[0, 0]
    dev = compute.device_for(H100, "float32", default_params(H100.device.name), plan.gpus)
    assert with_passes - without == pytest.approx(
        m * float(compute.elementwise_time_s(GRAD_ADD_BYTES_FP32 * (m - 1) / m * params, dev)), rel=1e-9
    )


@pytest.mark.parametrize("zero", [2, 3])
def test_fsdp_counts_are_the_trainers_own(zero: int) -> None:
    # two gloo ranks shard the trainer's model as trainer/parallel/data.py does; three micro-batches, sync on the last
    from exatrain.trainer.spawn import _free_port

    helper = Path(__file__).resolve().parents[1] / "helpers" / "fsdp_grad_passes.py"
    out = subprocess.run(
        [sys.executable, str(helper), str(_free_port()), str(zero)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    total, counts = json.loads(out.stdout.strip().splitlines()[-1])
    gathers = 2 if zero == 3 else 1  # ZeRO-3 gathers again for the backward
    each = {"copy_in": gathers * total // 2, "copy_out": gathers * total}
    # the first backward's unsharded gradients cast to fp32 and kept; each later one added in (the last's too);
    # the last copies them into the reduce-scatter and its output into the shard's .grad
    assert counts == [
        {**each, "grad_cast": total},
        {**each, "add": total},
        {**each, "add": total, "rs_in": total, "rs_out": total // 2},
    ]


def _fsdp_per_step(plan, *, inline: bool) -> float:
    """Bytes of the counted FSDP2 passes a step moves on one rank; ``inline``: also the two shard-sized copies FSDP2
    runs on its own streams on a GPU (each gather's copy-in, the reduce-scatter output's copy into .grad)."""
    m, params, shard = plan.num_microbatches, rank_params(plan)[0, 0], plan.dp * plan.cp
    side = 1.0 if inline else 0.0
    gather = side * CAST_BYTES_FP32_BF16 / shard + COPY_BYTES_BF16
    kept = CAST_BYTES_FP32_BF16 + GRAD_ADD_BYTES_BF16_INTO_FP32 * (m - 1) if m > 1 else 0.0
    rs_in = COPY_BYTES_FP32 if m > 1 else CAST_BYTES_FP32_BF16  # the kept fp32 gradients, or the one bf16 backward's
    return (m * gather * (2 if plan.zero_stage == 3 else 1) + kept + rs_in + side * COPY_BYTES_FP32 / shard) * params


@pytest.mark.parametrize("zero", [2, 3])
def test_fsdp_pays_what_was_counted_on_its_compute_stream(monkeypatch, zero: int) -> None:
    plan = _plan(zero=zero)
    with_passes, without = _priced(plan, monkeypatch)
    dev = compute.device_for(H100, "bfloat16", default_params(H100.device.name), plan.gpus)
    assert plan.num_microbatches == 4 and plan.dp * plan.cp == 4
    expect = float(compute.elementwise_time_s(_fsdp_per_step(plan, inline=False), dev))
    assert with_passes - without == pytest.approx(expect, rel=1e-9)


def test_fsdp_on_the_cpu_pays_every_copy_in_line(monkeypatch) -> None:
    cpu = get_cluster("local-cpu")
    plan = make_plan(
        "llama-tiny", cpu, gpus=2, micro_batch=1, global_batch=6, zero=3, dtype="bfloat16", runtime="exatrain"
    )
    with_passes, without = _priced(plan, monkeypatch, cpu)
    dev = compute.device_for(cpu, "bfloat16", default_params(cpu.device.name), plan.gpus)
    assert plan.num_microbatches == 3
    expect = float(compute.elementwise_time_s(_fsdp_per_step(plan, inline=True), dev))
    assert with_passes - without == pytest.approx(expect, rel=1e-9)


def test_fsdp_with_one_micro_batch_keeps_nothing(monkeypatch) -> None:
    # the one backward's bf16 gradients go straight into the reduce-scatter's fp32 input: a cast, no add
    plan = _plan(zero=2, global_batch=4)
    with_passes, without = _priced(plan, monkeypatch)
    dev = compute.device_for(H100, "bfloat16", default_params(H100.device.name), plan.gpus)
    per_step = (COPY_BYTES_BF16 + CAST_BYTES_FP32_BF16) * rank_params(plan)[0, 0]
    assert plan.num_microbatches == 1
    assert _fsdp_per_step(plan, inline=False) == per_step
    assert with_passes - without == pytest.approx(float(compute.elementwise_time_s(per_step, dev)), rel=1e-9)


def test_the_other_engines_are_unchanged(monkeypatch) -> None:
    for plan in (_plan(runtime="megatron-core"), _plan(runtime="torchtitan", zero=3)):
        with_passes, without = _priced(plan, monkeypatch)
        assert with_passes == without, (plan.runtime, plan.zero_stage)


def test_the_timeline_replays_the_same_passes(monkeypatch) -> None:
    plan = _plan(pp=2, gpus=8, tp=2)
    params = default_params(H100.device.name)
    st = plan_stage_times(plan, H100, params)
    with monkeypatch.context() as mp:
        _without_passes(mp)
        plain = plan_stage_times(plan, H100, params)
    assert np.all(st.fwd > plain.fwd) and np.all(st.bwd > plain.bwd)
    gemm, _ = cast_params(plan.model, [plan.tp], 2, rank_params(plan))
    dev = compute.device_for(H100, "bfloat16", params, plan.gpus)
    assert np.allclose(st.fwd - plain.fwd, compute.elementwise_time_s(CAST_BYTES_FP32_BF16 * gemm, dev), rtol=1e-9)
