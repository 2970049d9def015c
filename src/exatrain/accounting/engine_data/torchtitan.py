"""The profile of torchtitan (FSDP2): its memory rules, overlaps and the source of each number
(``accounting.engine_profile.EngineProfile``; its own value of each run setting: ``Setting.engines``)."""

from __future__ import annotations

from exatrain.accounting.context import CpExchange
from exatrain.accounting.engine_profile import ActivationRules, Overlap, engine_profile, rule

# ---- torchtitan (FSDP2) -----------------------------------------------------------------------
_TT_MP = (
    "torchtitan/distributed/fsdp.py MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) over fp32 "
    "sharded params; docs/fsdp.md: reshard_after_forward True = ZeRO-3, False = ZeRO-2"
)
TORCHTITAN = engine_profile(
    name="torchtitan",
    cp_exchanges=(
        CpExchange(
            "all_gather",
            "parallelism.context_parallel_rotate_method = 'allgather', the default",
            "torch/distributed/tensor/experimental/_attention.py _AllGatherRotater: one all-gather of K,V "
            "issued before the local block's attention, the other blocks' calls after it; the backward "
            "gathers again and passes dK,dV round the ring (_templated_ring_attention_backward, all-to-all "
            "rotater), each behind the next block's backward",
            calls="ring",
            overlapped=True,
            regather=True,
            dkv_ring=True,
        ),
        CpExchange(
            "p2p",
            "parallelism.context_parallel_rotate_method = 'alltoall'",
            "torch/distributed/tensor/experimental/_attention.py _AllToAllRotater: K,V passed round the "
            "ring (permute_tensor), each block's behind the previous block's attention",
            calls="ring",
            overlapped=True,
        ),
    ),
    states=(
        (
            ("bfloat16", 0, "float32"),
            rule(
                (4 + 2, 0),
                (4, 0),
                (8, 0),
                "DDP (data_parallel_replicate_degree), autocast",
                "torchtitan training.mixed_precision_param: torch.autocast under DDP",
            ),
        ),
        (
            ("bfloat16", 2, "float32"),
            rule(
                (2, 4),
                (0, 4),
                (0, 8),
                "FSDP2 reshard_after_forward=False",
                _TT_MP + " (PP default, torchtitan get_fsdp_reshard_after_forward_policy)",
            ),
        ),
        (("bfloat16", 3, "float32"), rule((0, 4), (0, 4), (0, 8), "FSDP2 reshard_after_forward=True", _TT_MP)),
        (("float32", 0, "float32"), rule((4, 0), (4, 0), (8, 0), "DDP, mixed_precision_param float32", _TT_MP)),
        (("float32", 2, "float32"), rule((4, 4), (0, 4), (0, 8), "FSDP2 reshard_after_forward=False", _TT_MP)),
        (("float32", 3, "float32"), rule((0, 4), (0, 4), (0, 8), "FSDP2 reshard_after_forward=True", _TT_MP)),
    ),
    zero3_gathered_layers=2,  # the current layer and the prefetched next one
    zero3_prefetch_elements=0.0,
    zero3_unsharded_grad_bytes=4.0,
    buckets=(("FSDP2", "one all-gather / reduce-scatter per fully_shard unit (transformer block)"),),
    bucket_source="torch.distributed.fsdp.fully_shard: per-module communication, no persistent bucket",
    allocator_allowance=0.05,
    activations=ActivationRules(
        dropout_masks=False,
        attention="flash",
        selective="per_op",
        recompute=(
            ("none", "activation_checkpoint.mode = 'none'"),
            ("selective", "activation_checkpoint.mode = 'selective', selective_ac_option = 'op'"),
            ("full", "activation_checkpoint.mode = 'full'"),
        ),
        source=(
            "torchtitan/distributed/activation_checkpoint.py (op policy: save matmul, attention and "
            "reduce-scatter outputs except every second matmul); its models have no dropout; SDPA"
        ),
    ),
    overlaps=(
        Overlap(
            "dp_param_gather",
            "FSDP2 implicit prefetch of the next layer's all-gather",
            True,
            "torch.distributed.fsdp.fully_shard (torchtitan docs/fsdp.md)",
        ),
        Overlap("dp_grad_reduce", "FSDP2 reduce-scatter during backward", True, "torch.distributed.fsdp.fully_shard"),
        Overlap(
            "tp",
            "enable_async_tensor_parallel (async TP, needs torch.compile)",
            False,
            "torchtitan config [experimental] (2024-12), [compile] (2026) enable_async_tensor_parallel",
            passes="forward",
            passes_source=(
                "the async-TP announcement (PyTorch dev-discuss 209487, 2024-09): up to ~29% / ~20% "
                "forward-pass speed-up and ~8% end to end on Llama 3 8B / 70B, i.e. the "
                "forward's collectives hidden and the backward's not; a full recomputation's "
                "rerun forward is hidden as the forward is: inductor's post-grad passes, "
                "micro_pipeline_tp among them, run on the backward graph too, which holds the "
                "recomputed forward (torch/_inductor/fx_passes/post_grad.py post_grad_passes)"
            ),
        ),
    ),
    pp_unsharded_grad_bytes=4.0,
    pp_unsharded_grad_source=(
        "torch/distributed/pipelining/stage.py backward_maybe_with_nosync: an FSDP stage runs every backward "
        "with set_requires_gradient_sync(False) and set_reshard_after_backward(False), and the schedule "
        "reduce-scatters once after the last (perform_reduce_grad); fsdp/_fully_shard/_fsdp_param.py "
        "to_accumulated_grad_if_needed keeps the unsharded gradient in the reduce dtype (fp32) meanwhile"
    ),
    reduce_each_microbatch=True,
    reduce_each_microbatch_source=(
        "torchtitan/trainer.py train_step: each gradient-accumulation micro-batch's forward_backward_step runs "
        "with FSDP2's gradient sync on (no set_requires_gradient_sync(False)), so each backward reduce-scatters; "
        "under a pipeline schedule the schedule holds it to the last micro-batch (pp_unsharded_grad_source)"
    ),
    collectives_per_unit=True,
    collectives_per_unit_source=(
        "torchtitan's parallelize apply_fsdp: fully_shard on each TransformerBlock, then on the whole model (the "
        "root unit: embeddings, final norm, output); FSDP2's FSDPParamGroup sends one all-gather and one "
        "reduce-scatter per unit (fsdp/_fully_shard/_fsdp_collectives.py)"
    ),
    compiles_loss=True,
    sp_gathered_head_input=True,
    sp_head_input_source=(
        'torchtitan\'s llama parallelize plan: "output": ColwiseParallel(input_layouts=Shard(1)) '
        "redistributes the final norm's output to Replicate, and the matmul saves that gathered "
        'input; its blocks\' "attention" and "feed_forward" PrepareModuleInput('
        "desired_input_layouts=Replicate()) do the same for wq/wk/wv and w1/w3"
    ),
    sp_gathered_layer_inputs=True,
    expert_gemms_source="torchtitan's MoE GroupedExperts: torch._grouped_mm over all local experts",
    fp8_tp_gather=("current",),
    fp8_tp_gather_source=(
        "torchtitan apply_tp with float8 tensorwise: torchao's Float8ColwiseParallel / "
        "PrepareFloat8ModuleInput cast the sequence-sharded input to float8 before the all-gather "
        "(not under rowwise scaling)"
    ),
    # clip_grad_norm_ over the gradients as held (FSDP2's shards): torch.nn.utils.get_total_norm (read 4), then
    # clip_grads_with_norm_, whose mul_ by the clamped coefficient runs whatever the norm (read 4, write 4)
    step_pass_bytes=((("bfloat16", "float32"), (0.0, 12.0, 0.0)), (("float32", "float32"), (0.0, 12.0, 0.0))),
    step_pass_source=(
        "torchtitan/distributed/utils.py clip_grad_norm_: get_total_norm, then "
        "torch.nn.utils.clip_grads_with_norm_ (torch/nn/utils/clip_grad.py: _foreach_mul_ by "
        "clip_coef_clamped, unconditionally); the sharded fp32 parameters are the master weights"
    ),
    adam_switch="--optimizer.implementation",
)
