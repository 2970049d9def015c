"""Megatron-DeepSpeed's and DeepSpeed's own code on each export: Megatron-DeepSpeed's parse_args (which adds
DeepSpeed's --deepspeed options) + validate_args at the plan's world size, DeepSpeed's DeepSpeedConfig on the
exported JSON at the plan's data-parallel size (its batch arithmetic: train_batch_size = micro-batch x
accumulation x dp), and the GPTModel of pretrain_gpt.py's model_provider, whole (tp = pp = 1, no DeepSpeed
pipeline) on the meta device.

Stand-ins of this CPU-only check: the model is built with --use-cpu-initialization (weights made where the
default device says: the meta device; the accelerator's device, where a few buffers are moved, is the meta
device too; a scalar read off a meta tensor, which only the stochastic-depth rates are, reads 0, their value
unless --drop-path-rate is set), the fusions that need CUDA extensions (gradient accumulation, softmax, bias-GELU,
bias-dropout) off, and the flash-attention package's kernels, which a build does not run, not imported; none of
them holds a parameter.
"""

from __future__ import annotations

import copy
import json
import os
import sys

import _common

args = _common.options()
sys.path.insert(0, args.source)

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402

from megatron import arguments  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402
from megatron.core import mpu  # noqa: E402
from megatron.core.enums import ModelType  # noqa: E402
from megatron.global_vars import set_args  # noqa: E402

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29563")
dist.init_process_group("gloo", rank=0, world_size=1)
deepspeed.init_distributed(dist_backend="gloo")  # DeepSpeedConfig asks deepspeed.comm for the rank
mpu.initialize_model_parallel(1, 1)


class _Mpu:
    """DeepSpeedConfig's view of the layout: the plan's data-parallel size."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_model_parallel_world_size(self) -> int:
        return 1


def probe(name: str, plan: dict, export: dict) -> dict:
    problems: list[str] = []
    os.environ["WORLD_SIZE"], os.environ["RANK"] = str(plan["gpus"]), "0"
    ds_json = json.loads(open(export["files"]["ds_config.json"]).read())
    argv = list(export["argv"])
    argv[argv.index("--deepspeed_config") + 1] = export["files"]["ds_config.json"]
    sys.argv = ["pretrain_gpt.py", *argv]
    a = arguments.parse_args()
    arguments.validate_args(a)
    ds = DeepSpeedConfig(ds_json, mpu=_Mpu(a.data_parallel_size))
    _common.expect(problems, "data-parallel size", a.data_parallel_size, plan["dp"])
    _common.expect(problems, "DeepSpeed micro-batch", ds.train_micro_batch_size_per_gpu, a.micro_batch_size)
    _common.expect(problems, "DeepSpeed batch", ds.train_batch_size, a.global_batch_size)
    _common.expect(problems, "DeepSpeed accumulation steps", ds.gradient_accumulation_steps, plan["num_microbatches"])
    _common.expect(problems, "ZeRO stage", ds.zero_optimization_stage, a.zero_stage)
    _common.accepted()
    whole = copy.copy(a)
    for key, value in dict(
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1,
        no_pipeline_parallel=True,
        ds_pipeline_enabled=False,
        sequence_parallel=False,
        use_cpu_initialization=True,
        use_flash_attn_v2=False,
        use_flash_attn=False,
        deepspeed=False,
        padded_vocab_size=plan["vocab"],
        model_type=ModelType.encoder_or_decoder,
        gradient_accumulation_fusion=False,
        masked_softmax_fusion=False,
        bias_gelu_fusion=False,
        bias_dropout_fusion=False,
    ).items():
        setattr(whole, key, value)
    set_args(whole)
    from megatron.arguments import core_transformer_config_from_args
    from megatron.model import GPTModel

    config = core_transformer_config_from_args(whole)
    accelerator = get_accelerator()
    device_name = accelerator.current_device_name
    accelerator.current_device_name = lambda *a: "meta"  # buffers moved "to the device" stay on the meta device
    item = torch.Tensor.item
    torch.Tensor.item = lambda t: 0.0 if t.is_meta else item(t)  # the stochastic-depth rates (0 unless asked)
    try:
        with torch.device("meta"):
            model = GPTModel(config=config, num_tokentypes=0, parallel_output=True, pre_process=True, post_process=True)
    finally:
        accelerator.current_device_name, torch.Tensor.item = device_name, item
    params, bias = _common.count(model)
    return {"params": params, "bias_buffers": bias, "problems": problems}


print(f"deepspeed {deepspeed.__version__}", flush=True)
_common.run_all(args, probe)
