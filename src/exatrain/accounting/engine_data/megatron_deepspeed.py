"""The profile of Megatron-DeepSpeed with DeepSpeed's ZeRO: its memory rules, overlaps and the source of each number
(``accounting.engine_profile.EngineProfile``; its own value of each run setting: ``Setting.engines``)."""

from __future__ import annotations

from exatrain.accounting.context import CpExchange
from exatrain.accounting.engine_profile import ActivationRules, Overlap, engine_profile, rule

# ---- Megatron-DeepSpeed (DeepSpeed ZeRO) -------------------------------------------------------
_ZERO_PAPER = "Rajbhandari et al. 2020 (ZeRO), Sec. 3.1 and Fig. 1: 16-bit params 2, grads 2, K = 12"
_DS12 = "deepspeed/runtime/zero/stage_1_and_2.py"
# DeepSpeedZeroOptimizer keeps one reduce_bucket_size (5e8 elements) gradient buffer with
# contiguous_gradients (on by default), two with overlap_comm (stage_1_and_2.py setup_buckets);
# stage3.py keeps one. BF16_Optimizer (fp32 accumulation) keeps none. Bytes: elements x 2 (16-bit
# gradients) or x 4 (fp32 training).
_BUCKET = 5e8
_BF16_OPT = (
    "deepspeed/runtime/bf16_optimizer.py: bf16 params and gradients, a whole-stage accumulation buffer, "
    "fp32 master partition and Adam states over dp"
)
MEGATRON_DEEPSPEED = engine_profile(
    name="megatron-deepspeed",
    expert_gemms="per_expert",
    expert_gemms_source="deepspeed/moe/experts.py Experts.forward: a loop over its local experts' modules",
    cp_exchanges=(
        CpExchange(
            "a2a",
            "--ds-sequence-parallel-size",
            "DeepSpeed-Ulysses (deepspeed/sequence/layer.py DistributedAttention): all-to-all of Q, K and V before "
            "the local attention over the whole sequence for heads/cp heads, and of its output after; not overlapped",
            calls="one",
            overlapped=False,
        ),
    ),
    accum_pass_bytes=(("float32", 18.0),),
    accum_pass_source=(
        "deepspeed/runtime/pipe/engine.py _exec_backward_pass under BF16_Optimizer (fp32 gradient "
        "accumulation): clear_lp_grads() sets the bf16 gradients to None before each micro-batch's backward "
        "(set_to_none unless graph_harvesting; bf16+pipeline 56c5223 of 2022-04 to master), so autograd keeps the "
        "weight-gradient GEMM's output as .grad without a pass; update_hp_grads then runs "
        "hp_grad.add_(lp.grad.to(fp32)) (read 2, write 4; read 4 + 4, write 4): 18 bytes a parameter, every "
        "micro-batch (deepspeed/runtime/bf16_optimizer.py)"
    ),
    allreduce_grads_accum=("float32",),
    later_accum_bytes=(("bfloat16", 6.0), ("float16", 6.0)),
    later_accum_zero=(0, 1),
    later_accum_source=(
        "deepspeed/runtime/pipe/engine.py _exec_backward_pass: each micro-batch's backward runs into "
        "the parameters' bf16 .grad, kept until _exec_reduce_grads; from the second on autograd's "
        "AccumulateGrad adds into it (read 2 + 2, write 2). deepspeed/runtime/zero/stage_1_and_2.py "
        "process_gradients reduces in backward only with partition_gradients (ZeRO-2) or overlap_comm, "
        "and keeps a separate accumulator only for another accumulation dtype (BF16_Optimizer: "
        "accum_pass_source)"
    ),
    states=(
        # bf16 without ZeRO is DeepSpeed's BF16_Optimizer, which partitions the fp32 master weights and Adam's states
        # over dp (its own ZeRO-1) and keeps a whole-stage gradient buffer in the accumulation dtype beside the bf16
        # gradients: deepspeed/runtime/engine.py _do_optimizer_sanity_check returns BFLOAT16 for bf16 at stage 0
        # under the pipeline engine (Megatron-DeepSpeed's unless --no-pipeline-parallel; bf16 accumulation by
        # default since v0.17.6, 889f0ea); bf16_optimizer.py fp32_groups_gradients_flat (in grad_acc_dtype),
        # fp32_groups_flat_partition. Up to v0.17.5 get_data_types defaulted bf16 at stage 0 to fp32 accumulation
        # (v0.7.6, 21c2802): that run is the BF16_Optimizer row below, planned as ZeRO-1 with --grad-accum float32.
        (
            ("bfloat16", 0, "bfloat16"),
            rule(
                (2, 4),
                (2 + 2, 0),
                (0, 8),
                "stage 0: BF16_Optimizer, bf16 accumulation",
                _BF16_OPT + " (grad_acc_dtype bf16: 6 + 12/d)",
            ),
        ),
        (
            ("bfloat16", 1, "bfloat16"),
            rule((2, 4), (2, 0), (0, 8), "zero_optimization.stage 1", _ZERO_PAPER + ": P_os = 4 + 12/d", 2 * _BUCKET),
        ),
        (
            ("bfloat16", 2, "bfloat16"),
            rule((2, 4), (0, 2), (0, 8), "zero_optimization.stage 2", _ZERO_PAPER + ": P_os+g = 2 + 14/d", 2 * _BUCKET),
        ),
        (
            ("bfloat16", 3, "bfloat16"),
            rule(
                (0, 2 + 4), (0, 2), (0, 8), "zero_optimization.stage 3", _ZERO_PAPER + ": P_os+g+p = 16/d", 2 * _BUCKET
            ),
        ),
        # "fp16": {"enabled": true}: the same states in fp16 (FP16_Optimizer without ZeRO, deepspeed/runtime/fp16/
        # fused_optimizer.py; the ZeRO optimizers with fp16 partitions), the ZeRO paper's mixed-precision Adam
        (("float16", 0, "float16"), rule((2 + 4, 0), (2, 0), (8, 0), "fp16, no ZeRO", _ZERO_PAPER + ": baseline 16")),
        (
            ("float16", 1, "float16"),
            rule(
                (2, 4),
                (2, 0),
                (0, 8),
                "fp16, zero_optimization.stage 1",
                _ZERO_PAPER + ": P_os = 4 + 12/d",
                2 * _BUCKET,
            ),
        ),
        (
            ("float16", 2, "float16"),
            rule(
                (2, 4),
                (0, 2),
                (0, 8),
                "fp16, zero_optimization.stage 2",
                _ZERO_PAPER + ": P_os+g = 2 + 14/d",
                2 * _BUCKET,
            ),
        ),
        (
            ("float16", 3, "float16"),
            rule(
                (0, 2 + 4),
                (0, 2),
                (0, 8),
                "fp16, zero_optimization.stage 3",
                _ZERO_PAPER + ": P_os+g+p = 16/d",
                2 * _BUCKET,
            ),
        ),
        # BF16_Optimizer: bf16 params and their bf16 grads (zeroed, not freed), a full fp32
        # gradient-accumulation buffer, the fp32 master partition and Adam states: 8 + 12/d.
        (
            ("bfloat16", 1, "float32"),
            rule(
                (2, 4),
                (2 + 4, 0),
                (0, 8),
                "BF16_Optimizer (grad_accum_dtype fp32)",
                "deepspeed/runtime/bf16_optimizer.py fp32_groups_gradients_flat, fp32_groups_flat_partition",
            ),
        ),
        # float32: ZeRO-1/2 clone the fp32 partition as the optimizer's own copy; ZeRO-3 reuses it.
        (("float32", 0, "float32"), rule((4, 0), (4, 0), (8, 0), "no ZeRO", _ZERO_PAPER + " (fp32: 4 + 4 + 8)")),
        (
            ("float32", 1, "float32"),
            rule(
                (4, 4),
                (4, 0),
                (0, 8),
                "zero_optimization.stage 1",
                _DS12 + ": single_partition_of_fp32_groups is a clone (8 + 12/d)",
                4 * _BUCKET,
            ),
        ),
        (
            ("float32", 2, "float32"),
            rule(
                (4, 4),
                (0, 4),
                (0, 8),
                "zero_optimization.stage 2",
                _DS12 + ": clone of the partition, grads partitioned (4 + 16/d)",
                4 * _BUCKET,
            ),
        ),
        (
            ("float32", 3, "float32"),
            rule(
                (0, 4),
                (0, 4),
                (0, 8),
                "zero_optimization.stage 3",
                "deepspeed/runtime/zero/stage3.py reuses an fp32 partition (16/d)",
                4 * _BUCKET,
            ),
        ),
    ),
    zero3_gathered_layers=1,
    zero3_prefetch_elements=5e7,  # stage3_prefetch_bucket_size
    zero3_unsharded_grad_bytes=0.0,  # reduced through the bucket buffer (StateRule.buffer_bytes)
    buckets=(
        ("reduce_bucket_size (elements)", "5e8"),
        ("allgather_bucket_size (elements)", "5e8"),
        ("stage3_prefetch_bucket_size (elements)", "5e7"),
    ),
    bucket_source=(
        "deepspeed/runtime/zero/config.py reduce_bucket_size/allgather_bucket_size 5e8, overlap_comm "
        "default stage 3 only; " + _DS12 + " setup_buckets"
    ),
    allocator_allowance=0.05,
    activations=ActivationRules(
        dropout_masks=True,
        attention="math",
        selective="core_attention",
        recompute=(
            ("none", "(no recompute flag)"),
            ("selective", "--recompute-granularity selective"),
            ("full", "--checkpoint-activations --checkpoint-num-layers 1 (--deepspeed-activation-checkpointing)"),
        ),
        source=(
            "Megatron-DeepSpeed megatron/arguments.py: --attention-dropout/--hidden-dropout 0.1, flash only with "
            "--use-flash-attn(-v2), --recompute-granularity, --checkpoint-activations"
        ),
    ),
    overlaps=(
        Overlap(
            "dp_grad_reduce",
            "zero_optimization.overlap_comm",
            False,
            "deepspeed/runtime/zero/config.py overlap_comm (default true only for stage 3)",
        ),
        Overlap(
            "dp_param_gather",
            "zero_optimization.overlap_comm (stage 3 prefetch)",
            False,
            "deepspeed/runtime/zero/config.py prefetch_bucket_size",
        ),
    ),
    sp_head_input_source=(
        "megatron/core/tensor_parallel/layers.py (Megatron-LM's, in Megatron-DeepSpeed too) "
        "LinearWithGradAccumulationAndAsyncCommunication: under sequence parallelism it saves "
        "the input shard and all-gathers it again in backward"
    ),
    reduce_each_microbatch=True,
    reduce_each_microbatch_source=(
        'deepspeed/runtime/engine.py no_sync: "incompatible with gradient '
        'partitioning logic of ZeRO stage 2/3", whose gradients are reduced in every '
        "backward; its pipeline engine runs ZeRO-1 only"
    ),
    # DeepSpeedZeroOptimizer (16-bit gradients): the norm of the 16-bit partition (2), its copy to fp32 (read 2,
    # write 4), unscale_and_clip_grads' mul_ by the combined scale, always (read 4, write 4), the fp32 partition
    # copied into the 16-bit one (read 4, write 2); fp32 training: the norm (4), the mul_ (8), the copy (8).
    # BF16_Optimizer (fp32 accumulation): the norm (4), the copy into bf16 (6), and clear_hp_grads zeroing the
    # stage's whole fp32 gradient buffer (write 4)
    step_pass_bytes=(
        (("bfloat16", "bfloat16"), (0.0, 0.0, 2.0 + 6.0 + 8.0 + 6.0)),
        (("float16", "float16"), (0.0, 0.0, 2.0 + 2.0 + 6.0 + 8.0 + 6.0)),
        (("bfloat16", "float32"), (4.0, 0.0, 4.0 + 6.0)),
        (("float32", "float32"), (0.0, 0.0, 4.0 + 8.0 + 8.0)),
    ),
    fp16_grad_accum_dtype="float16",
    loss_scale_source=(
        "deepspeed/runtime/zero/stage_1_and_2.py step: has_overflow reads each 16-bit gradient of "
        "the partition for inf/nan (2 bytes) and all-reduces the flag (MAX) over the data-parallel "
        "group; unscale_and_clip_grads folds 1/loss_scale into the clip's one pass; an overflow skips "
        "the step (deepspeed/runtime/fp16/loss_scaler.py DynamicLossScaler)"
    ),
    step_pass_source=(
        "deepspeed/runtime/zero/stage_1_and_2.py step: scaled_global_norm over the 16-bit gradients, "
        "flat_grad_partition.to(fp32), unscale_and_clip_grads (grad.data.mul_(1. / combined_scale)), "
        "_optimizer_step, bit16_partitions[partition_id].data.copy_(fp32_partition.data); "
        "deepspeed/runtime/bf16_optimizer.py step: get_global_norm_of_tensors, optimizer.step, "
        "update_lp_params, clear_hp_grads (the same code for ZeRO-0 and 3 assumed)"
    ),
)
