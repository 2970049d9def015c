"""The plans every ``export-config`` target is checked against: one or more of each feature an export has to
carry (dense GPT and Llama shapes, interleaved and uneven pipelines, context parallelism, FP8, mixture of
experts, latent attention, QK-norm and a head width of its own, sliding windows with attention sinks and
biases, a shape no engine ships as a preset).

``scripts/check_exports.py`` feeds every export of these plans through the engines' own parsers and model
builders; ``tests/launch/test_export_params.py`` reads every export back into a ModelSpec and counts it, torch-
and engine-free.
"""

from __future__ import annotations

from typing import Callable

from exatrain.catalog import get_model
from exatrain.catalog.models import ModelSpec
from exatrain.plan import ParallelDims, Plan, TrainShape

# A dense Llama-family shape that no engine ships as a preset (torchtitan has no flavor of it): 24 layers,
# width 3072, 24 heads over 8 key/value groups, SwiGLU 8192, a 64K vocabulary.
CUSTOM_DENSE = ModelSpec(
    name="custom-3b",
    arch="llama",
    layers=24,
    hidden=3072,
    heads=24,
    kv_heads=8,
    ffn_hidden=8192,
    seq_len=4096,
    vocab=65536,
    rope_theta=500000.0,
)


# Qwen3-0.6B (its config.json): QK-norm, 128-wide heads at width 1024 (hidden/heads is 64), a tied head; dense.
QWEN3_06B = ModelSpec(
    name="qwen3-0.6b",
    arch="llama",
    layers=28,
    hidden=1024,
    heads=16,
    kv_heads=8,
    kv_channels=128,
    qk_norm=True,
    ffn_hidden=3072,
    seq_len=4096,
    vocab=151936,
    tied_embeddings=True,
    rope_theta=1000000.0,
    norm_eps=1e-6,
)


def _plan(
    model: str | ModelSpec,
    *,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    ep: int = 1,
    cp: int = 1,
    micro: int = 1,
    batch: int,
    **fields,
) -> Plan:
    spec = model if isinstance(model, ModelSpec) else get_model(model)
    return Plan(
        model=spec,
        dims=ParallelDims(tp=tp, pp=pp, dp=dp, ep=ep, cp=cp),
        shape=TrainShape(micro_batch=micro, global_batch=batch),
        **fields,
    ).validate()


# name -> builder; the names are the rows of RESULTS.md's export check.
PLANS: dict[str, Callable[[], Plan]] = {
    # dense GPT (learned positions, LayerNorm, biases, tied head): the Frontier study's layouts
    "gpt-175b-tp4-pp16": lambda: _plan(
        "gpt-175b", tp=4, pp=16, dp=2, batch=640, zero_stage=1, recompute="full", cluster="frontier"
    ),
    "gpt3-1.3b-dp8-selective": lambda: _plan(
        "gpt3-1.3b", dp=8, micro=4, batch=256, zero_stage=1, recompute="selective"
    ),
    # dense Llama
    "llama3-8b-fsdp-tp2": lambda: _plan(
        "llama3-8b", tp=2, dp=4, batch=32, zero_stage=3, recompute="full", sequence_parallel=True
    ),
    "llama3-8b-ddp": lambda: _plan("llama3-8b", dp=8, batch=64),
    "llama3-70b-interleaved": lambda: _plan(
        "llama3-70b",
        tp=4,
        pp=4,
        dp=4,
        batch=256,
        zero_stage=1,
        sequence_parallel=True,
        schedule="interleaved",
        interleave=5,
        recompute="selective",
        runtime="megatron-core",
    ),
    "llama3-70b-uneven-pp": lambda: _plan(
        "llama3-70b",
        tp=8,
        pp=3,
        dp=2,
        batch=96,
        zero_stage=1,
        sequence_parallel=True,
        recompute="full",
        recompute_layers=7,
        runtime="megatron-core",
    ),
    "llama3.1-405b-cp4": lambda: _plan(
        "llama3.1-405b-128k",
        tp=8,
        pp=16,
        cp=4,
        dp=1,
        batch=16,
        zero_stage=1,
        sequence_parallel=True,
        recompute="full",
        runtime="megatron-core",
    ),
    "llama3.1-8b-cp2-fsdp": lambda: _plan(
        "llama3.1-8b-128k",
        tp=4,
        cp=2,
        dp=2,
        batch=8,
        zero_stage=3,
        sequence_parallel=True,
        recompute="full",
        runtime="torchtitan",
    ),
    "custom-3b-dp8": lambda: _plan(CUSTOM_DENSE, dp=8, micro=2, batch=128, zero_stage=1, recompute="selective"),
    # FP8
    "llama3-8b-fp8-fsdp": lambda: _plan(
        "llama3-8b", dp=8, micro=2, batch=64, zero_stage=3, fp8="current", fp8_param_gather=True, runtime="torchtitan"
    ),
    "llama3-70b-fp8-delayed": lambda: _plan(
        "llama3-70b",
        tp=8,
        pp=2,
        dp=4,
        batch=128,
        zero_stage=1,
        sequence_parallel=True,
        recompute="full",
        fp8="delayed",
        runtime="megatron-core",
    ),
    # mixture of experts
    "mixtral-8x7b-ep8": lambda: _plan(
        "mixtral-8x7b",
        tp=2,
        pp=4,
        dp=8,
        ep=8,
        batch=256,
        zero_stage=1,
        sequence_parallel=True,
        recompute="full",
        runtime="megatron-core",
    ),
    # QK-norm and a head width of its own, dense, tied
    "qwen3-0.6b-dp8": lambda: _plan(QWEN3_06B, dp=8, micro=4, batch=256, zero_stage=2, runtime="torchtitan"),
    # mixture of experts + QK-norm + a head width of its own
    "qwen3-30b-a3b-ep8": lambda: _plan(
        "qwen3-30b-a3b", pp=2, dp=8, ep=8, batch=128, zero_stage=1, recompute="full", runtime="megatron-core"
    ),
    "qwen3-235b-a22b-ep16": lambda: _plan(
        "qwen3-235b-a22b",
        tp=4,
        pp=8,
        dp=16,
        ep=16,
        batch=1024,
        zero_stage=1,
        sequence_parallel=True,
        recompute="full",
        runtime="megatron-core",
    ),
    # latent attention + sigmoid routing with the balancing bias + shared experts + leading dense layers
    "deepseek-v3-ep64": lambda: _plan(
        "deepseek-v3",
        tp=2,
        pp=16,
        dp=64,
        ep=64,
        batch=4096,
        zero_stage=1,
        sequence_parallel=True,
        recompute="selective",
        recompute_modules=("mla_up_proj", "moe_act", "layernorm"),
        runtime="megatron-core",
    ),
    # sliding windows, attention sinks, biases on every linear layer
    "gpt-oss-20b-ep8": lambda: _plan(
        "gpt-oss-20b", dp=8, ep=8, batch=64, zero_stage=1, recompute="full", runtime="megatron-core"
    ),
    "gpt-oss-120b-ep16": lambda: _plan(
        "gpt-oss-120b",
        tp=2,
        pp=2,
        dp=16,
        ep=16,
        batch=256,
        zero_stage=1,
        sequence_parallel=True,
        recompute="full",
        runtime="megatron-core",
    ),
}


def matrix() -> dict[str, Plan]:
    """Every plan of the matrix, validated, by name."""
    return {name: build() for name, build in PLANS.items()}


__all__ = ["CUSTOM_DENSE", "PLANS", "QWEN3_06B", "matrix"]
