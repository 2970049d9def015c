"""exatrain's trainer under ``--offload params``: FSDP2 with ``CPUOffloadPolicy`` (trainer/parallel/data.py
``apply_fsdp``), on CPU gloo ranks.

What a CPU run can show: the trainer asks FSDP2 for CPU offload (the policy on every sharded module), FSDP2's
offload code paths run (the copy of each shard to the mesh's device before its all-gather, the reduced gradient
copied to the CPU, the optimizer stepping over CPU tensors) and training matches the run without offload. What it
cannot show: on a CPU mesh the "device" is the CPU, so no byte crosses a host link, nothing is pinned (torch 2.13
refuses pin_memory without an accelerator) and no accelerator memory is saved; those are a GPU run's to measure.

Broken on purpose and seen to fail here: the trainer's FSDP built without the policy (``apply_fsdp`` called with
``offload=False`` in parallel/build.py: the policy test; the parity test alone cannot see it, a CPU run computing
the same numbers either way); the trainer's refusal of --offload optimizer dropped from its registry record (the
refusal test)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from exatrain.catalog import get_cluster
from exatrain.errors import UserError
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.trainer.config import TrainConfig
from tests.helpers.trainer_runs import run_batch

STEPS = 3


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("offload")
    return run_batch(
        out,
        {
            "plain": dict(dp=2, zero_stage=3, steps=STEPS),
            "offload": dict(dp=2, zero_stage=3, steps=STEPS, offload="params"),
        },
        timeout_s=600,
    )


def test_the_offloaded_run_trains_as_the_one_without(runs) -> None:
    plain, off = runs["plain"], runs["offload"]
    assert len(off.losses) == STEPS and all(math.isfinite(x) for x in off.losses)
    assert off.losses[-1] < off.losses[0]
    # the same arithmetic on the same ranks: FSDP2's offload moves the shards, not the numbers
    assert off.losses == pytest.approx(plain.losses, rel=1e-6)
    assert off.grad_norms == pytest.approx(plain.grad_norms, rel=1e-6)
    assert off.record is not None and off.record["plan"]["offload"] == "params"


def test_the_trainer_shards_with_cpu_offload_policy(tmp_path: Path) -> None:
    """One gloo rank: the trainer's stage sharding (parallel/build.py ``shard_stage``) for a ZeRO-3 plan over dp 2
    gives every sharded module FSDP2's CPUOffloadPolicy under --offload params, and none without."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy

    from exatrain.catalog import get_model
    from exatrain.trainer.model import Transformer
    from exatrain.trainer.parallel.build import shard_stage

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        policies = {}
        for offload in ("params", "none"):
            plan = Plan(
                model=get_model("gpt-tiny"),
                dims=ParallelDims(dp=2),
                shape=TrainShape(2, 8),
                zero_stage=3,
                dtype="float32",
                offload=offload,
            )
            with torch.device("meta"):
                module = Transformer(plan.model)
            shard_stage(module, plan, None, mesh)
            states = [m._get_fsdp_state() for m in (module, *module.layers.values())]
            policies[offload] = [type(s._fsdp_param_group.offload_policy) for s in states]
        assert policies["params"] == [CPUOffloadPolicy] * (1 + get_model("gpt-tiny").layers)
        assert CPUOffloadPolicy not in policies["none"]
    finally:
        dist.destroy_process_group()


def test_the_trainer_refuses_what_it_does_not_offload() -> None:
    from exatrain.api.plans import make_plan

    cpu = get_cluster("local-cpu")
    # a plan made for DeepSpeed's optimizer offload: the trainer's own refusal (settings.SETTINGS' record)
    ds = make_plan(
        "llama-tiny",
        cpu,
        gpus=2,
        micro_batch=1,
        global_batch=2,
        zero=1,
        runtime="megatron-deepspeed",
        offload="optimizer",
    )
    with pytest.raises(UserError) as e:
        TrainConfig(plan=ds).check()
    assert str(e.value) == (
        "the exatrain trainer offloads through FSDP2's CPUOffloadPolicy (--offload params, "
        "ZeRO-2/3); plan --offload optimizer for DeepSpeed or Megatron-Core, or train a plan made "
        "with --offload params"
    )
    # a plan for the trainer itself: the plan's rule says which offload it runs, at which stages
    with pytest.raises(
        UserError,
        match=r"^--offload optimizer is not run by exatrain; it is run by "
        r"megatron-deepspeed or megatron-core \(exatrain offloads --offload params\)$",
    ):
        make_plan("llama-tiny", cpu, gpus=2, micro_batch=1, global_batch=2, zero=3, offload="optimizer")
    with pytest.raises(UserError, match=r"^--offload params under exatrain needs --zero 2 or 3 \(got 1\)$"):
        make_plan("llama-tiny", cpu, gpus=2, micro_batch=1, global_batch=2, zero=1, offload="params")
    plan = make_plan("llama-tiny", cpu, gpus=2, micro_batch=1, global_batch=2, zero=3, offload="params")
    assert TrainConfig(plan=plan).check().plan.offload == "params"
