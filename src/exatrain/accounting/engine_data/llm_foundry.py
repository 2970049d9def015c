"""The profile of llm-foundry (Composer with PyTorch FSDP1): its memory rules, overlaps and the source of each number
(``accounting.engine_profile.EngineProfile``; its own value of each run setting: ``Setting.engines``)."""

from __future__ import annotations

from exatrain.accounting.engine_profile import ActivationRules, Overlap, engine_profile, rule

# ---- llm-foundry (Composer with PyTorch FSDP1) --------------------------------------------------------
# MosaicML's llm-foundry trains its MPT models through Composer, which wraps each transformer block in a PyTorch
# FSDP1 unit (torch.distributed.fsdp.FullyShardedDataParallel: one FlatParameter a block) and the rest in the root
# unit. Versions read: Composer v0.15.0 (composer/trainer/dist_strategy.py, mosaic_fsdp.py, optim/
# decoupled_weight_decay.py), llm-foundry of 2023-07 to 2024-01 (ef350d9e6, b2a43a147, 5e85bd62d: llmfoundry/models/
# mpt, scripts/train/yamls/pretrain, scripts/train/benchmarking), torch 1.13 to 2.1 FSDP1 (torch/distributed/fsdp/
# flat_param.py, _runtime_utils.py).
_COMPOSER = "composer/trainer/dist_strategy.py (v0.15.0) set_fsdp_default and prepare_fsdp_module"
_FSDP1_MP = (
    "composer/trainer/mosaic_fsdp.py get_mixed_precision: DEFAULT = MixedPrecision(param_dtype=bf16, "
    "buffer_dtype=bf16, reduce_dtype=None), PURE adds reduce_dtype=bf16; torch FSDP1 flat_param.py "
    "FlatParamHandle._init_param_reduce_dtypes: a param_dtype without a reduce_dtype reduces in the param "
    "dtype; the sharded gradient is cast back to the fp32 parameters' dtype after the reduce-scatter "
    "(_runtime_utils.py _cast_grad_to_param_dtype) and accumulated there"
)
LLM_FOUNDRY = engine_profile(
    name="llm-foundry",
    states=tuple(
        ((dtype, zero, accum), state)
        for accum in ("bfloat16", "float32")
        for dtype, zero, state in (
            # NO_SHARD: the fp32 parameters, their bf16 copy kept from the forward to the end of the backward
            # (flat_param.py post_reshard: _mp_shard freed at the reshard), fp32 gradients after the cast, Adam.
            ("bfloat16", 0, rule((4 + 2, 0), (4, 0), (8, 0), "sharding_strategy NO_SHARD", _FSDP1_MP)),
            # SHARD_GRAD_OP keeps each unit's unsharded bf16 parameters from its forward to its backward
            ("bfloat16", 2, rule((2, 4), (0, 4), (0, 8), "sharding_strategy SHARD_GRAD_OP", _FSDP1_MP)),
            ("bfloat16", 3, rule((0, 4), (0, 4), (0, 8), "sharding_strategy FULL_SHARD", _FSDP1_MP)),
        )
    )
    + (
        (("float32", 0, "float32"), rule((4, 0), (4, 0), (8, 0), "NO_SHARD, mixed_precision FULL", _FSDP1_MP)),
        (("float32", 2, "float32"), rule((4, 4), (0, 4), (0, 8), "SHARD_GRAD_OP, mixed_precision FULL", _FSDP1_MP)),
        (("float32", 3, "float32"), rule((0, 4), (0, 4), (0, 8), "FULL_SHARD, mixed_precision FULL", _FSDP1_MP)),
    ),
    # limit_all_gathers (every llm-foundry pretraining YAML sets it): the CPU waits before a third unit's all-gather
    # until the unit two before it is freed (_runtime_utils.py _unshard, _free_event_queue), so two units at a time
    zero3_gathered_layers=2,
    zero3_prefetch_elements=0.0,
    zero3_unsharded_grad_bytes=2.0,  # a unit's bf16 flat gradient until its reduce-scatter
    buckets=(("FSDP1", "one all-gather / reduce-scatter per wrapped unit (an MPT block; the root unit)"),),
    bucket_source="torch FSDP1: one FlatParameter per unit, gathered into _full_param_padded; no persistent bucket",
    allocator_allowance=0.05,
    activations=ActivationRules(
        dropout_masks=False,
        attention="flash",
        selective="core_attention",
        recompute=(
            ("none", "fsdp_config.activation_checkpointing false"),
            ("selective", "(no attention-core-only policy: activation_checkpointing checkpoints whole blocks)"),
            ("full", "fsdp_config.activation_checkpointing true, activation_checkpointing_reentrant false"),
        ),
        source=(
            "llm-foundry MPT: resid_pdrop/attn_pdrop 0 in its pretraining YAMLs; Composer applies "
            "checkpoint_wrapper to each block (non-reentrant where activation_checkpointing_reentrant is false)"
        ),
    ),
    overlaps=(
        Overlap(
            "dp_param_gather",
            "FSDP1 prefetch: backward_prefetch (BACKWARD_POST by default), limit_all_gathers",
            True,
            _COMPOSER + "; torch FSDP1 _runtime_utils.py _prefetch_handle (the next unit's all-gather on "
            "the unshard stream)",
        ),
        Overlap(
            "dp_grad_reduce",
            "FSDP1 reduce-scatter on its post-backward stream",
            True,
            "torch FSDP1 _runtime_utils.py _post_backward_hook (state._post_backward_stream)",
        ),
    ),
    reduce_each_microbatch=True,
    reduce_each_microbatch_source=(
        "composer/trainer/trainer.py _train_microbatch: no no_sync context unless the "
        "model is a DistributedDataParallel, so an FSDP model reduce-scatters after every "
        "micro-batch's backward"
    ),
    collectives_per_unit=True,
    collectives_per_unit_source=(
        "Composer's FSDP auto-wrap (each MPTBlock its own FSDP unit, the root one holding wte/wpe and the final "
        "norm); torch FSDP1 _runtime_utils.py _unshard / _reduce_grad: one all_gather_into_tensor and one "
        "reduce_scatter_tensor per unit's FlatParameter"
    ),
    flat_param_grad_copy=True,
    flat_param_source=(
        "torch FSDP1 flat_param.py _use_unsharded_views: each parameter is a view of the unit's "
        "FlatParameter made by torch.split, whose backward concatenates the views' gradients into "
        "the flat gradient; _runtime_utils.py _post_backward_hook then, on the post-backward stream, "
        "casts it to the reduce dtype where it differs and _reduce_grad pre-divides it in place "
        "(_div_if_needed by the gradient predivide factor) before reduce_scatter_tensor"
    ),
    # FSDP1 clip_grad_norm_ (Composer's gradient_clipping, norm, in every pretraining YAML) over the sharded fp32
    # gradients: the local norms (read 4), then grad.mul_(clip_coef_clamped) whatever the norm (read 4, write 4)
    step_pass_bytes=(
        (("bfloat16", "bfloat16"), (0.0, 12.0, 0.0)),
        (("bfloat16", "float32"), (0.0, 12.0, 0.0)),
        (("float32", "float32"), (0.0, 12.0, 0.0)),
    ),
    step_pass_source=(
        "torch FSDP1 FullyShardedDataParallel.clip_grad_norm_: _get_grad_norm, then "
        "grad.detach().mul_(clip_coef_clamped) for every gradient"
    ),
    expert_gemms_source=(
        "llm-foundry's MPT blocks are dense; a MoE plan under this profile is priced as one grouped "
        "GEMM over the local experts, which no llm-foundry run validates"
    ),
    version_assumed=(
        "llm-foundry of 2023-07 to 2024-01 (Composer 0.15-0.16, torch 1.13-2.1): PyTorch FSDP1, "
        "attn_impl triton, the fused cross-entropy, eager; runs with attn_impl flash plan "
        "--attention-kernel fa2-varlen; later llm-foundry (FSDP2, tensor parallelism, torch.compile) is not "
        "this profile"
    ),
)
