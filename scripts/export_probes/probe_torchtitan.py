"""torchtitan's own code on each export: v0.2.2's ConfigManager on the TOML job file (``--target torchtitan``) or
0.3's on the exported command line (``--target torchtitan-0.3``); the model it names built on the meta device as
its trainer builds it (v0.2.2: ``train_spec.model_args[flavor]``, the flavor first registered as the export's
header says where it names one; 0.3: the config function's ``model_spec.model``); ParallelDims and the device
mesh at the plan's world size over a fake process group (no ranks, no devices); the batch arithmetic of its
trainer (gradient accumulation, pipeline micro-batches, the sequence's divisibility under sp and cp); and the
pipeline's module names against the built model. A float8 converter (torchtitan 0.3's llama3_405b) is told the
GPU is a Hopper (compute capability 9.0); nothing runs on it.
"""

from __future__ import annotations

import importlib
import os
import sys

import _common

args = _common.options()
V03 = args.target == "torchtitan-0.3"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

from torchtitan.config import ConfigManager  # noqa: E402
from torchtitan.distributed.parallel_dims import ParallelDims  # noqa: E402

if not V03:
    from torchtitan.protocols.train_spec import get_train_spec
else:  # a config function's float8 converter asks for a Hopper-class GPU: declared, never used on the meta device
    import torchtitan.components.quantization.float8 as _float8

    _float8.has_cuda_capability = lambda major, minor: (9, 0) >= (major, minor)


def _mesh(parallel_dims: ParallelDims, world: int) -> None:
    """Build the device mesh as the trainer does, over a fake process group of ``world`` ranks."""
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        parallel_dims.build_mesh()
    finally:
        dist.destroy_process_group()


def _modules(model: torch.nn.Module, parts: list[list[str]] | None, plan: dict, problems: list[str]) -> None:
    if not parts:
        return
    names = dict(model.named_modules())
    missing = [n for part in parts for n in part if n not in names]
    if missing:
        problems.append(f"module_fqns_per_model_part names no module {missing[:3]}")
    layers = [n for part in parts for n in part if n.startswith("layers.")]
    _common.expect(
        problems,
        "layers of each model part",
        [sum(n.startswith("layers.") for n in p) for p in parts],
        plan["layers_per_stage"],
    )
    _common.expect(
        problems, "layers in the model parts", sorted(layers), sorted(f"layers.{i}" for i in range(plan["layers"]))
    )


def _batch(training, parallel, dp_degree: int, plan: dict, problems: list[str]) -> None:
    """train.py / trainer.py: gradient accumulation = global / (local x dp); pipeline micro-batches = local /
    microbatch size."""
    local, global_ = training.local_batch_size, training.global_batch_size
    if global_ % (local * dp_degree):
        raise ValueError(f"global batch size {global_} is not a multiple of local {local} x dp {dp_degree}")
    accumulation = global_ // (local * dp_degree)
    pipelined = parallel.pipeline_parallel_degree > 1
    per_step = accumulation * (local // parallel.pipeline_parallel_microbatch_size if pipelined else 1)
    micro = parallel.pipeline_parallel_microbatch_size if pipelined else local
    _common.expect(problems, "micro-batches per step", per_step, plan["num_microbatches"])
    _common.expect(problems, "micro-batch size", micro, plan["micro_batch"])
    _common.expect(problems, "global batch", global_, plan["global_batch"])


def probe_022(name: str, plan: dict, export: dict) -> dict:
    problems: list[str] = []
    cfg = ConfigManager().parse_args(["--job.config_file", export["path"]])
    _common.accepted()
    for line in export.get("register", []):  # the header's flavor, registered as it says
        family = importlib.import_module(f"torchtitan.models.{cfg.model.name}")
        exec(line, vars(family))
    spec = get_train_spec(cfg.model.name)
    model_args = spec.model_args[cfg.model.flavor]
    model_args.update_from_config(cfg)
    with torch.device("meta"):
        model = spec.model_cls(model_args)
    params, bias = _common.count(model)
    p = cfg.parallelism
    dims = ParallelDims(
        dp_replicate=p.data_parallel_replicate_degree,
        dp_shard=p.data_parallel_shard_degree,
        cp=p.context_parallel_degree,
        tp=p.tensor_parallel_degree,
        pp=p.pipeline_parallel_degree,
        ep=p.expert_parallel_degree,
        etp=p.expert_tensor_parallel_degree,
        world_size=plan["gpus"],
    )
    _mesh(dims, plan["gpus"])
    _common.expect(problems, "data-parallel size", dims.dp_replicate * dims.dp_shard, plan["dp"])
    _batch(cfg.training, p, dims.dp_replicate * dims.dp_shard, plan, problems)
    _modules(model, p.module_fqns_per_model_part, plan, problems)
    return {"params": params, "bias_buffers": bias, "problems": problems}


def probe_03(name: str, plan: dict, export: dict) -> dict:
    problems: list[str] = []
    cfg = ConfigManager().parse_args(list(export["argv"]))
    _common.accepted()
    model_config = cfg.model_spec.model
    model_config.update_from_config(config=cfg)
    with torch.device("meta"):
        model = model_config.build()
    params, bias = _common.count(model)
    dims = ParallelDims.from_config(cfg.parallelism, plan["gpus"])
    _mesh(dims, plan["gpus"])
    p = cfg.parallelism
    # trainer.py: the sequence divides over sp (tp) and 2 x cp
    divisor = (dims.tp if p.enable_sequence_parallel else 1) * (2 * dims.cp if dims.cp > 1 else 1)
    if cfg.training.seq_len % divisor:
        raise ValueError(f"sequence length {cfg.training.seq_len} is not divisible by {divisor}")
    _common.expect(problems, "sequence length", cfg.training.seq_len, plan["seq_len"])
    _common.expect(problems, "data-parallel size", dims.dp_replicate * dims.dp_shard, plan["dp"])
    _batch(cfg.training, p, dims.dp_replicate * dims.dp_shard, plan, problems)
    _modules(model, p.module_fqns_per_model_part, plan, problems)
    return {"params": params, "bias_buffers": bias, "problems": problems}


os.environ.setdefault("LOCAL_RANK", "0")
_common.run_all(args, probe_03 if V03 else probe_022)
sys.exit(0)
