"""The profile of exatrain's own trainer: its memory rules, overlaps and the source of each number
(``accounting.engine_profile.EngineProfile``; its own value of each run setting: ``Setting.engines``)."""

from __future__ import annotations

from exatrain.accounting.context import CpExchange
from exatrain.accounting.engine_profile import ActivationRules, Overlap, engine_profile, rule

# ---- exatrain's own trainer -------------------------------------------------------------------
_EXA = (
    "exatrain accounting/memory.py state_bytes_per_param (trainer/parallel/data.py: DDP, "
    "ZeroRedundancyOptimizer, FSDP2)"
)
EXATRAIN = engine_profile(
    name="exatrain",
    cp_exchanges=(
        CpExchange(
            "all_gather",
            "--cp",
            "trainer/parallel/context.py GatherSequence: K and V all-gathered before one masked attention call over "
            "the whole sequence, kept for the backward, whose dK, dV are reduce-scattered; not overlapped",
            calls="one",
            overlapped=False,
            regather=False,
        ),
    ),
    autocast_casts=True,
    autograd_accum=True,
    param_pass_zero=(0, 1),
    fsdp_pass_zero=(2, 3),
    param_pass_source=(
        "trainer/train.py runs each micro-batch under torch.autocast over the fp32 parameters: "
        "DDP (ZeRO-0/1): aten._to_copy fp32 -> bf16 of every weight a linear (and grouped_mm, "
        "trainer/moe.py) reads, again in a full recomputation's rerun (non-reentrant checkpoint), and "
        "bf16 -> fp32 of its gradient; AccumulateGrad add_ into .grad from the second micro-batch. "
        "FSDP2 (ZeRO-2/3, set_requires_gradient_sync(False) until the last micro-batch): each gather's "
        "all_gather_copy_in of the shard and split_with_sizes_copy of the gathered weights (ZeRO-3 "
        "gathers again for the backward), the unsharded gradient cast to fp32 after the first backward "
        "and added into after each later one (fsdp/_fully_shard/_fsdp_param.py "
        "to_accumulated_grad_if_needed), the last backward's chunk_cat into the reduce-scatter and its "
        "output copied into the shard's .grad. Counted on the trainer's own model by "
        "tests/planner/test_parameter_passes.py; float32 training under FSDP2 is not priced"
    ),
    expert_gemms_source="trainer/moe.py: torch.nn.functional.grouped_mm over the local experts (grouped_ok)",
    states=(
        (("bfloat16", 0, "float32"), rule((4 + 2, 0), (4, 0), (8, 0), "DDP", _EXA)),
        (("bfloat16", 1, "float32"), rule((4 + 2, 0), (4, 0), (0, 8), "DDP + ZeroRedundancyOptimizer", _EXA)),
        (("bfloat16", 2, "float32"), rule((2, 4), (0, 4), (0, 8), "FSDP2 reshard_after_forward=False", _EXA)),
        (("bfloat16", 3, "float32"), rule((0, 4), (0, 4), (0, 8), "FSDP2 reshard_after_forward=True", _EXA)),
        # float16: autocast's fp16 copies in place of the bf16 ones, the same fp32 parameters and gradients
        (("float16", 0, "float32"), rule((4 + 2, 0), (4, 0), (8, 0), "DDP", _EXA)),
        (("float16", 1, "float32"), rule((4 + 2, 0), (4, 0), (0, 8), "DDP + ZeroRedundancyOptimizer", _EXA)),
        (("float16", 2, "float32"), rule((2, 4), (0, 4), (0, 8), "FSDP2 reshard_after_forward=False", _EXA)),
        (("float16", 3, "float32"), rule((0, 4), (0, 4), (0, 8), "FSDP2 reshard_after_forward=True", _EXA)),
        (("float32", 0, "float32"), rule((4, 0), (4, 0), (8, 0), "DDP", _EXA)),
        (("float32", 1, "float32"), rule((4, 0), (4, 0), (0, 8), "DDP + ZeroRedundancyOptimizer", _EXA)),
        (("float32", 2, "float32"), rule((4, 4), (0, 4), (0, 8), "FSDP2 reshard_after_forward=False", _EXA)),
        (("float32", 3, "float32"), rule((0, 4), (0, 4), (0, 8), "FSDP2 reshard_after_forward=True", _EXA)),
    ),
    zero3_gathered_layers=2,
    zero3_prefetch_elements=0.0,
    zero3_unsharded_grad_bytes=4.0,
    buckets=(("DDP bucket_cap_mb", "25 (torch default)"),),
    bucket_source="not counted (accounting/trainer_memory.py: DDP's gradient buckets are a measured runtime overhead)",
    allocator_allowance=0.05,
    activations=ActivationRules(
        dropout_masks=True,
        attention="flash",
        selective="core_attention",
        recompute=(("none", "--recompute none"), ("selective", "--recompute selective"), ("full", "--recompute full")),
        source="exatrain accounting/memory.py layer_activation_bytes (Korthikanti et al. 2022, Table 2)",
    ),
    overlaps=(
        Overlap(
            "dp_grad_reduce",
            "DDP bucketed all-reduce during backward (ZeRO-0/1 without pipeline)",
            True,
            "trainer/parallel/data.py",
        ),
        Overlap("dp_param_gather", "FSDP2 implicit prefetch (ZeRO-2/3)", True, "trainer/parallel/data.py"),
    ),
    sp_gathered_head_input=True,
    sp_head_input_source="trainer/parallel/tensor.py: the head is ColwiseParallel from the sequence-sharded stream",
    # the norm over the rank's gradients as it holds them: one read of each fp32 gradient
    step_pass_bytes=(
        (("bfloat16", "float32"), (0.0, 4.0, 0.0)),
        (("float16", "float32"), (0.0, 4.0 + 8.0, 0.0)),
        (("float32", "float32"), (0.0, 4.0, 0.0)),
    ),
    loss_scale_source=(
        "trainer/train.py: autocast in float16 and torch's ShardedGradScaler over the world group: "
        "unscale_ runs torch._amp_foreach_non_finite_check_and_unscale_ over each rank's fp32 "
        "gradients (read 4, write 4) and all-reduces found_inf (MAX), so every rank skips an "
        "overflowed step"
    ),
    step_pass_source=(
        "trainer/parallel/grads.py clip_grad_norm: torch.nn.utils.get_total_norm (foreach norms) over "
        "the local gradients; the mul_ only when the norm exceeds --grad-clip. Counted by "
        "tests/planner/test_optimizer_step.py"
    ),
    adam_fused_only_plain=True,
)
