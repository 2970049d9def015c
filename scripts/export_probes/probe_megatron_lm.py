"""Megatron-LM's own code on each exported flag list: parse_args + validate_args at the plan's world size, the
TransformerConfig they make, and the GPT model gpt_builders.gpt_builder builds, whole (tp = pp = ep = cp = 1) on
the meta device with the local layer spec.

What this CPU-only check stands in for (declared, never run): a Hopper GPU (compute capability 9.0, which
validate_args asks for), Transformer Engine 2.14 (its version, and its fused RoPE kernel's presence, which
TransformerConfig asks for), CUDA streams (the MoE layer makes some at build time); on Python 3.11 it backports
typing.override, the one 3.12 name Megatron-LM d98e8a64 imports. The local spec builds the same parameters as the
Transformer Engine one (its norms stand apart instead of fused into the next linear layer); its core attention,
which holds no weights, is let take the per-head widths latent attention hands it.
"""

from __future__ import annotations

import copy
import os
import sys
import typing

import _common

args = _common.options()
sys.path.insert(0, args.source)
if not hasattr(typing, "override"):  # Python < 3.12
    import typing_extensions

    typing.override = typing_extensions.override

import torch  # noqa: E402


class _Stream:  # torch.cuda.Stream on a machine without CUDA: created at build time, never used here
    def __init__(self, *a, **k) -> None:
        pass


torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
torch.cuda.Stream = _Stream
torch.cuda.current_device = lambda: "cpu"  # the few tensors built with an explicit device (a head's sink logit)

import megatron.core.utils as core_utils  # noqa: E402
from packaging.version import Version  # noqa: E402

assert os.path.realpath(core_utils.__file__).startswith(os.path.realpath(args.source)), core_utils.__file__
core_utils._te_version = Version("2.14.0")
import megatron.core.models.common.embeddings.rope_utils as rope_utils  # noqa: E402


def _te_kernel(*a, **k):
    raise RuntimeError("Transformer Engine is declared, not present")


for _name in ("fused_apply_rotary_pos_emb", "fused_apply_rotary_pos_emb_thd"):
    if getattr(rope_utils, _name, None) is None:
        setattr(rope_utils, _name, _te_kernel)

import megatron.training.arguments as arguments  # noqa: E402

arguments.get_device_arch_version = lambda: 9
import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.tokenizers.utils.build_tokenizer import vocab_size_with_padding  # noqa: E402
from megatron.core.transformer.utils import is_layer_window_attention  # noqa: E402
from megatron.training.argument_utils import core_transformer_config_from_args  # noqa: E402
from megatron.training.global_vars import set_args  # noqa: E402

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29561")
dist.init_process_group("gloo", rank=0, world_size=1)
parallel_state.initialize_model_parallel(1, 1)
from gpt_builders import gpt_builder  # noqa: E402
from megatron.core.transformer.dot_product_attention import DotProductAttention  # noqa: E402

_local_attention_init = DotProductAttention.__init__


def _takes_mla_widths(self, *a, k_channels=None, v_channels=None, **k):
    """Latent attention hands its core attention the query/key and value widths, which Transformer Engine's core
    attention takes and the local one (no parameters of its own) does not."""
    _local_attention_init(self, *a, **k)


DotProductAttention.__init__ = _takes_mla_widths

# Settings of the whole-model build that change no parameter: one rank, the local spec, no fused kernels.
WHOLE = dict(
    tensor_model_parallel_size=1,
    pipeline_model_parallel_size=1,
    expert_model_parallel_size=1,
    expert_tensor_parallel_size=1,
    context_parallel_size=1,
    sequence_parallel=False,
    virtual_pipeline_model_parallel_size=None,
    pipeline_model_parallel_layout=None,
    num_layers_per_virtual_pipeline_stage=None,
    transformer_impl="local",
    use_cpu_initialization=True,
    init_model_with_meta_device=True,
    moe_grouped_gemm=False,
    tp_comm_overlap=False,
    fp8=None,
    fp8_param_gather=False,
    recompute_granularity=None,
    recompute_method=None,
    recompute_num_layers=None,
    recompute_modules=None,
    no_persist_layer_norm=True,
    apply_rope_fusion=False,
    gradient_accumulation_fusion=False,
    masked_softmax_fusion=False,
    bias_gelu_fusion=False,
    bias_swiglu_fusion=False,
    bias_dropout_fusion=False,
    use_megatron_fsdp=False,
    use_torch_fsdp2=False,
    use_distributed_optimizer=False,
)


def probe(name: str, plan: dict, export: dict) -> dict:
    problems: list[str] = []
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    os.environ.update(export["env"])
    os.environ["WORLD_SIZE"], os.environ["RANK"] = str(plan["gpus"]), "0"
    sys.argv = ["pretrain_gpt.py", *export["argv"]]
    a = arguments.parse_args()
    arguments.validate_args(a)
    # the tokenizer's vocabulary padded as Megatron pads it (a tokenizer of the plan's vocabulary)
    a.padded_vocab_size = vocab_size_with_padding(plan["vocab"], a, logging_enabled=False)
    core_transformer_config_from_args(a)  # TransformerConfig.__post_init__ checks the whole configuration
    _common.accepted()
    _common.expect(problems, "data-parallel size", a.data_parallel_size, plan["dp"])
    _common.expect(problems, "padded vocabulary", a.padded_vocab_size, plan["vocab"])
    per_step = a.global_batch_size // (a.micro_batch_size * a.data_parallel_size)
    _common.expect(problems, "micro-batches per step", per_step, plan["num_microbatches"])
    whole = copy.copy(a)
    for key, value in WHOLE.items():
        setattr(whole, key, value)
    config = core_transformer_config_from_args(whole)
    set_args(whole)
    with torch.device("meta"):
        model = gpt_builder(whole, True, True, config=config)
    params, bias = _common.count(model)
    windowed = sum(
        is_layer_window_attention(config.window_size, config.window_attn_skip_freq, n)
        for n in range(1, config.num_layers + 1)
    )  # what each layer's core attention is built with
    _common.expect(problems, "sliding-window layers", windowed, plan["windowed_layers"])
    if plan["sliding_window"]:
        _common.expect(
            problems,
            "window (keys before, after)",
            tuple(config.window_size) if config.window_size else None,
            (plan["sliding_window"] - 1, 0),
        )
    return {"params": params, "bias_buffers": bias, "problems": problems}


_common.run_all(args, probe)
