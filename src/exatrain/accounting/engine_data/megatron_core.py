"""The profile of Megatron-Core (Megatron-LM's megatron/core, with Transformer Engine): its memory rules, overlaps
and the source of each number (``accounting.engine_profile.EngineProfile``; its own value of each run setting:
``Setting.engines``)."""

from __future__ import annotations

from exatrain.accounting.context import CpExchange
from exatrain.accounting.engine_profile import ActivationRules, Overlap, engine_profile, rule

# ---- Context parallelism, as each engine runs it (accounting.context.CpExchange) ----------------
_TE_CP = "transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py"
_TE_P2P = CpExchange(
    "p2p",
    "--cp-comm-type p2p, the default",
    _TE_CP + " AttnFuncWithCPAndKVP2P: cp steps, each block's send behind the previous step's attention; "
    "attn_forward_func_with_cp asserts a sliding window runs only with a2a or all_gather",
    calls="ring",
    overlapped=True,
)
_TE_ALL_GATHER = CpExchange(
    "all_gather",
    "--cp-comm-type allgather",
    _TE_CP + " AttnFuncWithCPAndKVAllGather ('KV all-gather between CP ranks is exposed'): K and V gathered "
    "before two attention calls, one per local chunk; the backward gathers them again and reduce-scatters dK, dV",
    calls="chunks",
    overlapped=False,
    regather=True,
)
_TE_A2A = CpExchange(
    "a2a",
    "--cp-comm-type a2a",
    _TE_CP + " AttnFuncWithCPAndQKVOA2A: all-to-all of Q, K, V before one attention call over the whole "
    "sequence for heads/cp heads, and of the output after it; heads must divide by cp",
    calls="one",
    overlapped=False,
)

# ---- Megatron-Core ---------------------------------------------------------------------------
# ZeRO-1 is the distributed optimizer (grads are reduce-scattered but the full grad buffer stays).
# ZeRO-2/3 are Megatron-FSDP (--use-megatron-fsdp with --data-parallel-sharding-strategy optim_grads /
# optim_grads_params): the main grads, then the 16-bit params too, sharded with the fp32 main params and
# Adam states; with --fsdp-double-buffer the current and the next layer are held gathered.
_MCORE_DOC = "Megatron-Core docs, 'Distributed Optimizer' (developer-guide api-guide/dist_optimizer): bytes/param table"
_MFSDP = "--use-megatron-fsdp --data-parallel-sharding-strategy"
_MFSDP_DOC = (
    "Megatron-LM docs/discussions/megatron-fsdp-user-guide and megatron/core/distributed/fsdp/src/README.md: "
    "optim_grads / optim_grads_params shard the main grads / and the params over dp, with the fp32 main "
    "params and optimizer states"
)
MEGATRON_CORE = engine_profile(
    name="megatron-core",
    accum_fusion_switch="--no-gradient-accumulation-fusion",
    unfused_accum_source=(
        "--no-gradient-accumulation-fusion: the weight-gradient GEMMs return a fresh gradient and "
        "the backward hook adds it to the main gradient, param.main_grad.add_(param.grad) "
        "(megatron/core/distributed/distributed_data_parallel.py _make_backward_post_hook); "
        "fused, the GEMM accumulates into main_grad itself (TE fuse_wgrad_accumulation)"
    ),
    expert_gemms="per_expert",
    expert_gemms_source=(
        "megatron/core/transformer/moe/experts.py TEGroupedMLP runs Transformer Engine's "
        "GroupedLinear, whose general_grouped_gemm (transformer_engine/pytorch/cpp_extensions/"
        "gemm.py) calls nvte_multi_stream_cublas_gemm: one cuBLAS GEMM per local expert"
    ),
    # megatron/training/arguments.py --cp-comm-type {p2p, a2a, allgather, a2a+p2p} (a2a+p2p is not priced)
    cp_exchanges=(_TE_P2P, _TE_A2A, _TE_ALL_GATHER),
    states=(
        # bf16 params, fp32 main grads: 18 without, 6 + 12/d with the distributed optimizer.
        (
            ("bfloat16", 0, "float32"),
            rule(
                (2 + 4, 0),
                (4, 0),
                (8, 0),
                "DDP + Float16OptimizerWithFloat16Params",
                _MCORE_DOC + ": bf16 params, fp32 grads = 18",
            ),
        ),
        (
            ("bfloat16", 1, "float32"),
            rule(
                (2, 4),
                (4, 0),
                (0, 8),
                "--use-distributed-optimizer",
                _MCORE_DOC + ": bf16 params, fp32 grads = 6 + 12/d",
            ),
        ),
        # 16-bit params and grads: 20 without (fp32 main params and an fp32 copy of the grads in the
        # optimizer), 4 + 16/d with the distributed optimizer.
        (
            ("bfloat16", 0, "bfloat16"),
            rule(
                (2 + 4, 0),
                (2 + 4, 0),
                (8, 0),
                "--grad-reduce-in-bf16",
                _MCORE_DOC + ": 16-bit params, 16-bit grads = 20",
            ),
        ),
        (
            ("bfloat16", 1, "bfloat16"),
            rule(
                (2, 4),
                (2, 4),
                (0, 8),
                "--use-distributed-optimizer --grad-reduce-in-bf16",
                _MCORE_DOC + ": 16-bit params, 16-bit grads = 4 + 16/d",
            ),
        ),
        # Megatron-FSDP: optim_grads keeps the 16-bit params whole; optim_grads_params shards them too.
        (("bfloat16", 2, "float32"), rule((2, 4), (0, 4), (0, 8), _MFSDP + " optim_grads", _MFSDP_DOC)),
        (("bfloat16", 3, "float32"), rule((0, 2 + 4), (0, 4), (0, 8), _MFSDP + " optim_grads_params", _MFSDP_DOC)),
        (
            ("bfloat16", 2, "bfloat16"),
            rule((2, 4), (0, 2), (0, 8), _MFSDP + " optim_grads --grad-reduce-in-bf16", _MFSDP_DOC),
        ),
        (
            ("bfloat16", 3, "bfloat16"),
            rule((0, 2 + 4), (0, 2), (0, 8), _MFSDP + " optim_grads_params --grad-reduce-in-bf16", _MFSDP_DOC),
        ),
        # --fp16: fp16 params and main grads (megatron/training/arguments.py sets accumulate_allreduce_grads_in_fp32
        # only for --bf16), fp32 main params and an fp32 copy of the grads in the optimizer: the 16-bit rows above
        (
            ("float16", 0, "float16"),
            rule((2 + 4, 0), (2 + 4, 0), (8, 0), "--fp16", _MCORE_DOC + ": 16-bit params, 16-bit grads = 20"),
        ),
        (
            ("float16", 1, "float16"),
            rule(
                (2, 4),
                (2, 4),
                (0, 8),
                "--fp16 --use-distributed-optimizer",
                _MCORE_DOC + ": 16-bit params, 16-bit grads = 4 + 16/d",
            ),
        ),
        (
            ("float32", 0, "float32"),
            rule((4, 0), (4, 0), (8, 0), "fp32 params", _MCORE_DOC + ": fp32 params, fp32 grads = 16"),
        ),
        (
            ("float32", 1, "float32"),
            rule(
                (4, 0),
                (4, 0),
                (0, 8),
                "--use-distributed-optimizer",
                _MCORE_DOC + ": fp32 params, fp32 grads = 8 + 8/d",
            ),
        ),
    ),
    zero3_gathered_layers=2,  # Megatron-FSDP: the layer computing and the next one (--fsdp-double-buffer)
    zero3_prefetch_elements=0.0,
    zero3_unsharded_grad_bytes=4.0,  # a layer's fp32 main grad before its reduce-scatter
    buckets=(("bucket_size (params)", "max(40000000, 1000000 * dp) unless --ddp-bucket-size"),),
    bucket_source=(
        "megatron/core/distributed/distributed_data_parallel_config.py bucket_size; buckets are views "
        "into the contiguous param/grad buffers (param_and_grad_buffer.py)"
    ),
    allocator_allowance=0.05,
    activations=ActivationRules(
        dropout_masks=True,
        attention="flash",
        selective="core_attention",
        recompute=(
            ("none", "(no recompute flag)"),
            ("selective", "--recompute-granularity selective (--recompute-modules core_attn)"),
            ("full", "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"),
        ),
        source=(
            "megatron/core/transformer/transformer_config.py: hidden_dropout/attention_dropout 0.1, "
            "attention_backend auto (Transformer Engine fused/flash), recompute_granularity/method/num_layers"
        ),
        glu="fused",
        glu_source=(
            "megatron/core/transformer/mlp.py: bias_activation_fusion (megatron/training/arguments.py "
            "--no-bias-swiglu-fusion, on by default; Megatron-Bridge's Llama bridge sets it) runs "
            "bias_swiglu_impl, whose SwiGLUFunction saves only its input (megatron/core/fusions/"
            "fused_bias_swiglu.py)"
        ),
    ),
    overlaps=(
        Overlap(
            "dp_grad_reduce",
            "--overlap-grad-reduce",
            False,
            "megatron/core/distributed/distributed_data_parallel_config.py overlap_grad_reduce",
        ),
        Overlap(
            "dp_param_gather",
            "--overlap-param-gather (distributed optimizer)",
            False,
            "megatron/core/distributed/distributed_data_parallel_config.py overlap_param_gather",
        ),
        Overlap(
            "tp",
            "--tp-comm-overlap (Transformer Engine userbuffers)",
            False,
            "megatron/core/model_parallel_config.py tp_comm_overlap",
        ),
        Overlap(
            "pp_p2p",
            "interleaved schedule P2P overlap (off with --no-overlap-p2p-communication)",
            True,
            "megatron/training/arguments.py --no-overlap-p2p-communication (dest overlap_p2p_comm)",
        ),
        Overlap(
            "ep_a2a",
            "--overlap-moe-expert-parallel-comm (with --delay-wgrad-compute)",
            False,
            "megatron/core/transformer/transformer_config.py overlap_moe_expert_parallel_comm: the expert "
            "all-to-alls of one micro-batch run beside the compute of another (combined 1F1B)",
        ),
    ),
    sp_head_input_source=(
        "megatron/core/tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication: "
        "under sequence parallelism it saves the input shard and all-gathers it again in backward"
    ),
    # the norm reads the shard's fp32 main grads (4); the updated fp32 shard is copied into the 16-bit
    # parameters (read 4, write 2); 16-bit main grads are first copied to fp32 (read 2, write 4)
    step_pass_bytes=(
        (("bfloat16", "float32"), (0.0, 0.0, 4.0 + 6.0)),
        (("bfloat16", "bfloat16"), (0.0, 0.0, 6.0 + 4.0 + 6.0)),
        (("float16", "float16"), (0.0, 0.0, 6.0 + 8.0 + 4.0 + 6.0)),
        (("float32", "float32"), (0.0, 0.0, 4.0)),
    ),
    fp16_grad_accum_dtype="float16",
    loss_scale_source=(
        "megatron/core/optimizer/optimizer.py MixedPrecisionOptimizer: "
        "_unscale_main_grads_and_check_for_nan runs torch._amp_foreach_non_finite_check_and_unscale_ "
        "over the fp32 main grads (read 4, write 4) and all-reduces found_inf (MAX) before the step, "
        "which it skips on an overflow (DynamicGradScaler, megatron/core/optimizer/grad_scaler.py)"
    ),
    step_pass_source=(
        "megatron/core/optimizer/optimizer.py MixedPrecisionOptimizer.step: "
        "_copy_model_grads_to_main_grads (main_param.grad = model_param.main_grad.float(), a copy only "
        "of 16-bit main grads), clip_grad_norm (get_grad_norm_fp32, multi_tensor_l2norm; "
        "clip_grads.py scales only where clip_coeff < 1), the optimizer, "
        "_copy_main_params_to_model_params (_multi_tensor_copy_this_to_that); FP32Optimizer: the norm"
    ),
    version_assumed=(
        "Megatron-Core of 2024-26: gradient accumulation inside the weight-gradient GEMMs, fp32 main "
        "gradients, its overlaps as --overlap states them (not stated: its defaults, only the "
        "interleaved schedule's P2P overlap; Megatron-Bridge's recipes turn every one on, --overlap all), "
        "Transformer Engine's fused attention. Megatron-LM of 2021-22 overlapped only torch DDP's "
        "all-reduce (none under its local DDP or a pipeline), accumulated gradients outside the GEMMs "
        "before 2022-02 and kept fp16 gradients in 16 bits (as --dtype float16 plans them): plan such a "
        "run with --overlap dp_grad_reduce (or none) and --grad-accum-fusion off (on Narayanan 2021 and "
        "Korthikanti 2022, fp16, those settings read 1.9% off at the median, today's defaults 6.5%, the "
        "sequence-parallel runs up to 16% too fast; benchmarks/engine_version_gap.py)"
    ),
)
