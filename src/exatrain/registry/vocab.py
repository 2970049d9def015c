"""The vocabularies of a plan: schedules, recomputation, precisions, engines and each run setting's choices, with
the engines that run each (names only, so that the rules can check them without the accounting)."""

from __future__ import annotations

from typing import Any

from exatrain.errors import UserError

# ---- vocabularies ---------------------------------------------------------------------------------
# Pipeline schedules, named as torch.distributed.pipelining implements them:
#   gpipe        all forwards, then all backwards (ScheduleGPipe)
#   1f1b         one-forward-one-backward (Schedule1F1B; Narayanan et al. 2021, Sec. 2.2.1)
#   interleaved  interleaved 1F1B over `interleave` virtual stages per rank (ScheduleInterleaved1F1B)
#   zero_bubble  interleaved zero bubble: backward split into input- and weight-gradient passes
#                (ScheduleInterleavedZeroBubble; Qi et al. 2023, "Zero Bubble Pipeline Parallelism")
#   zbh1         one-chunk zero bubble, ZB-H1 (Qi et al. Sec. 3.1): ScheduleInterleavedZeroBubble over one stage
#                per rank
#   zbv          zero bubble V, two stages per rank placed in a V (ScheduleZBVZeroBubble; Qi et al. Sec. 6)
#   dualpipev    DeepSeek's DualPipe folded into a V, two stages per rank (ScheduleDualPipeV; DeepSeek-V3 report)
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zero_bubble", "zbh1", "zbv", "dualpipev")
# Schedules that split the backward into input- and weight-gradient passes, and those placing a rank's two stages
# in a V (stage r and 2 pp - 1 - r on rank r: torch's generate_stage_to_rank_mapping style "v").
SPLIT_BACKWARD = ("zero_bubble", "zbh1", "zbv", "dualpipev")
V_SCHEDULES = ("zbv", "dualpipev")
# The pipeline schedules each runtime runs: Megatron-Core 1F1B and interleaved 1F1B
# (megatron/core/pipeline_parallel/schedules.py get_forward_backward_func); Megatron-DeepSpeed 1F1B, DeepSpeed's
# pipeline engine's TrainSchedule (deepspeed/runtime/pipe/schedule.py), no virtual stages; torchtitan and
# exatrain every schedule of torch.distributed.pipelining (torchtitan's pipeline_parallel_schedule).
SCHEDULE_RUNTIMES = {
    "gpipe": ("torchtitan", "exatrain"),
    "1f1b": ("megatron-core", "megatron-deepspeed", "torchtitan", "exatrain"),
    "interleaved": ("megatron-core", "torchtitan", "exatrain"),
    "zero_bubble": ("torchtitan", "exatrain"),
    # torchtitan runs a multi-stage schedule class only over >= 2 stages per rank (pipeline
    # module split asserts it), so one-chunk zero bubble is exatrain's alone
    "zbh1": ("exatrain",),
    "zbv": ("torchtitan", "exatrain"),
    "dualpipev": ("torchtitan", "exatrain"),
}
# Activation recomputation (Korthikanti et al. 2022): none, selective (attention core only), full.
RECOMPUTE = ("none", "selective", "full")
# Training precisions: float32, or mixed precision over fp32 master weights with 16-bit compute copies, in
# bfloat16 or float16; float16 also scales the loss (dynamic loss scaling: the gradients are unscaled, and a step
# whose gradients overflowed is skipped on every rank, after a found-inf all-reduce).
DTYPES = ("float32", "bfloat16", "float16")
HALF_DTYPES = ("bfloat16", "float16")  # 16-bit compute copies, fp32 master weights
# The runtimes that train in float16 (those not listed train in float32 and bfloat16 only): Megatron-LM --fp16
# (megatron/training/arguments.py) and Megatron-DeepSpeed with DeepSpeed's "fp16" block, both with dynamic loss
# scaling, and exatrain's trainer (torch.amp autocast with a gradient scaler); torchtitan's
# training.mixed_precision_param is bfloat16 or float32 (torchtitan/config/job_config.py) and it has no scaler;
# llm-foundry's profile prices Composer's bf16 and fp32 runs only (its amp_fp16 is not priced).
FLOAT16_RUNTIMES = ("megatron-core", "megatron-deepspeed", "exatrain")
FLOAT16_WHY_NOT = {
    "torchtitan": "trains in bfloat16 or float32, not float16 (it has no loss scaling)",
    "llm-foundry": "is planned in bfloat16 or float32 (Composer's amp_fp16 is not priced)",
}


# Engines a plan can be made for (accounting.engines holds each one's profile) and FP8 GEMM scaling
# recipes (accounting.fp8): names only here, so that the rules can check them without the accounting.
RUNTIMES = ("megatron-core", "megatron-deepspeed", "torchtitan", "exatrain", "llm-foundry")
FP8_RECIPES = ("delayed", "current", "block", "mxfp8")
# What Megatron-Core's selective recomputation reruns (Plan.recompute_modules; its --recompute-modules, read only
# under --recompute-granularity selective; megatron/core/transformer/transformer_config.py recompute_modules, default
# ["core_attn"]): "core_attn" the attention core; "layernorm" the norms that stand alone (a MoE layer's pre-MLP norm,
# latent attention's input norm: Transformer Engine's layer spec fuses the others into the next GEMM, where there is
# nothing to rerun); "moe_act" the routed experts' activation; "mla_up_proj" latent attention's up-projections and
# rotary; "mlp" a dense layer's whole MLP (its fused norm included; not a MoE layer's); "shared_experts" the shared
# experts; "moe" the whole MoE layer (its router, all-to-alls and experts). The first three and "mla_up_proj"
# discard their outputs and rerun them before the backward needs them; the others keep only their inputs. Pricing:
# accounting.memory.layer_activation_bytes (what each drops), cost.recompute.module_rerun_s (what each reruns).
RECOMPUTE_MODULES = ("core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp", "shared_experts", "moe")
RECOMPUTE_MODULES_RUNTIMES = ("megatron-core",)
# ``recompute_layers`` N > 0 (with recompute "full"): only the first N layers of each (virtual) pipeline stage are
# recomputed, the others keep everything (Megatron-Core --recompute-method block --recompute-num-layers N,
# megatron/core/transformer/transformer_block.py _checkpointed_forward: per model chunk); 0 = every layer
# (--recompute-method uniform --recompute-num-layers 1). Fewer layers recomputed: less rerun, more memory.
RECOMPUTE_LAYERS_RUNTIMES = ("megatron-core",)
# ``recompute_every`` N > 0 (with recompute "full"): every Nth layer a rank builds is recomputed whole, counted over
# its model parts in order, the others keep everything (torchtitan's layer-level selective checkpointing:
# activation_checkpoint.mode "selective" with selective_ac_option "N", torchtitan/distributed/
# activation_checkpoint.py: a process-wide count of the blocks it wraps, each whose count N divides checkpointed);
# 0 = every layer (its mode "full"). Under PyTorch FSDP1 (llm-foundry) the same choice is torch's
# apply_activation_checkpointing with a check_fn that wraps every Nth block (fms-fsdp's selective_checkpointing).
RECOMPUTE_EVERY_RUNTIMES = ("torchtitan", "llm-foundry")
# ``distribute_saved_activations`` (with recompute "full", tp > 1, no sequence parallelism): each full-recomputation
# checkpoint (a layer's input, whole on every tp rank without sequence parallelism) is kept as 1/tp of it per tp rank
# and all-gathered over the tp group before its layer's rerun. Megatron-Core --distribute-saved-activations
# (megatron/core/tensor_parallel/random.py CheckpointFunction: split_tensor_into_1d_equal_chunks; TransformerConfig
# refuses it with sequence parallelism), Megatron-DeepSpeed --partition-activations (DeepSpeed's activation
# checkpointing, partition_activations), metaseq --distribute-checkpointed-activations (OPT-175B).
DISTRIBUTE_SAVED_RUNTIMES = ("megatron-core", "megatron-deepspeed")
# How a MoE layer's tokens reach their experts (cost.moe.a2a_time_s): "alltoall" sends every routed
# copy to its expert's rank (Megatron-Core's alltoall dispatcher, torchtitan's and exatrain's all-to-all);
# "deepep" and "hybridep" (Megatron-Core's flex dispatcher backends) send a token once per destination
# node over the network and once per destination rank over the node's links.
MOE_DISPATCHERS = ("alltoall", "deepep", "hybridep")
# ``fp8_param_gather``: the FP8 GEMMs' weights are gathered in FP8 over the data-parallel group, one byte a
# parameter instead of the compute dtype's two, and their gathered copy is the FP8 one (no 16-bit copy
# of them). Megatron-Core --fp8-param-gather (with the distributed optimizer: ZeRO-1 and up;
# Transformer Engine fp8_model_init); torchtitan enable_fsdp_float8_all_gather (with FSDP: ZeRO-2/3, and
# tensorwise scaling: "current"). accounting.fp8 Fp8Recipe.fp8_params; cost.overlap.engine_collectives.
FP8_PARAM_GATHER_RUNTIMES = {"megatron-core": 1, "torchtitan": 2}  # runtime -> the lowest ZeRO stage it needs
# How attention's operands travel under context parallelism (Plan.cp_comm; accounting.context): a ring of K,V
# blocks ("p2p"), K,V all-gathered ("all_gather"), or Q,K,V and the output traded by all-to-all ("a2a",
# DeepSpeed-Ulysses). The ways each runtime offers, its default first (accounting.engines EngineProfile.cp_exchanges
# cites and prices each, in this order), and those that do not run sliding-window attention (Transformer Engine's
# attn_forward_func_with_cp asserts a window runs only with a2a or all_gather).
CP_COMMS = ("p2p", "all_gather", "a2a")
CP_COMM_RUNTIMES = {
    "megatron-core": ("p2p", "a2a", "all_gather"),
    "megatron-deepspeed": ("a2a",),
    "torchtitan": ("all_gather", "p2p"),
    "exatrain": ("all_gather",),
}
CP_COMMS_WITHOUT_WINDOWS = {"megatron-core": ("p2p",)}
# Those that do not run attention sinks (a learned softmax logit per head, ModelSpec.attention_sinks): Transformer
# Engine runs a softmax other than the vanilla one under context parallelism only through its fused attention with
# cp_comm_type "a2a" (dot_product_attention/utils.py get_attention_backend: flash attention takes no such softmax,
# the fused one only with a2a under CP, the unfused one no CP at all).
CP_COMMS_WITHOUT_SINKS = {"megatron-core": ("p2p", "all_gather")}
# How evenly a MoE layer's routed tokens land on the expert ranks (accounting.moe.moe_load): dropless routing
# (the default) lets the busiest expert rank take more than the mean (accounting.moe.LOAD_IMBALANCE, an
# assumption); ``moe_capacity_factor`` C > 0 drops tokens beyond C times the mean per expert and pads every
# expert's input to that capacity (Megatron-Core --moe-expert-capacity-factor C
# --moe-pad-expert-input-to-capacity), so each expert computes and receives exactly C times the mean;
# ``moe_force_balance`` routes tokens evenly regardless of the router (Megatron-Core
# --moe-router-force-load-balancing, a benchmarking switch): the mean.
# Which kernel a flash-attention run's attention is (cost.compute.with_attention_kernel): "fused" (cuDNN's
# fused attention, Transformer Engine's FusedAttention: the device's fastest, which its prior describes),
# "fa2" (FlashAttention-2: Megatron-DeepSpeed's --use-flash-attn-v2, and torch SDPA on Hopper before
# torch 2.11), "sdpa" (whatever torch's scaled_dot_product_attention picks) or "triton" (the FlashAttention-1
# class Triton kernel, flash_attn_triton.py, that llm-foundry's attn_impl "triton" runs) or "fa2-varlen"
# (FlashAttention-2's varlen call on unpadded tokens: q, k and v gathered out of the batch and the output scattered
# back, flash-attn's bert_padding, as llm-foundry's attn_impl "flash" ran it to 2024-01). A plan that names none
# runs its runtime's own (accounting.engines ActivationRules.flash_kernel).
ATTENTION_KERNELS = ("fused", "fa2", "sdpa", "triton", "fa2-varlen")
# How a layer's element-wise work (norms, rotary, the gated activation) runs (cost.compute.unfused_extra):
# "fused" (a kernel per fused group: torch.compile'd blocks, Megatron's and Transformer Engine's fused
# kernels), "eager" (plain PyTorch, a kernel per op; each norm one kernel, as torch's layer_norm and, where
# torch has aten._fused_rms_norm, rms_norm run) or "eager-composite" (also each RMSNorm as its composite
# ops: fp32 upcast, square, mean, rsqrt, two products, cast back: a hand-written norm, torch before 2.9
# (aten._fused_rms_norm, pytorch#153666), or nn.RMSNorm with fp32 weights under autocast, which does not
# dispatch to the fused kernel, pytorch#167308). A plan that names none runs its runtime's own
# (accounting.engines EngineProfile.elementwise).
ELEMENTWISE = ("fused", "eager", "eager-composite")
# How the loss's cross-entropy over the logits runs (accounting.memory.logits_bytes_per_element,
# cost.compute.head_times): "upcast" (eager PyTorch, cross_entropy(logits.float()): an fp32 copy, its
# log-softmax saved for backward, whose backward holds it, the incoming fp32 gradient and the outgoing one:
# torchtitan uncompiled, exatrain's trainer), "inplace" (Megatron's vocab-parallel cross-entropy: one fp32
# copy turned into the softmax in place, saved, and turned into the gradient in place:
# megatron/core/tensor_parallel/cross_entropy.py) or "fused" (one kernel over the 16-bit logits: only they and their
# 16-bit gradient; torchtitan's compiled loss, [compile] components "loss"; llm-foundry's fused_crossentropy,
# flash-attn's xentropy kernel). A plan
# that names none runs its runtime's own (accounting.engines EngineProfile.cross_entropy).
CROSS_ENTROPY = ("upcast", "inplace", "fused")
CROSS_ENTROPY_RUNTIMES = {
    "upcast": ("torchtitan", "exatrain", "llm-foundry"),
    "inplace": ("megatron-core", "megatron-deepspeed"),
    "fused": ("torchtitan", "llm-foundry"),
}  # the runtimes that run each
# The dtype a bfloat16 run accumulates and reduces its gradients in (EngineProfile.grad_accum_dtype,
# EngineProfile.with_grad_accum): "float32" (Megatron-Core's default; DeepSpeed's BF16_Optimizer,
# data_types.grad_accum_dtype "fp32"; torchtitan's and exatrain's only) or "bfloat16" (DeepSpeed's default;
# Megatron-Core --grad-reduce-in-bf16). Which an engine offers, and at which ZeRO stages, is its profile's state
# table; a plan that names none runs its runtime's own.
GRAD_ACCUM = ("float32", "bfloat16")
# the runtimes that offer each
GRAD_ACCUM_RUNTIMES = {
    "float32": ("megatron-core", "megatron-deepspeed", "torchtitan", "exatrain", "llm-foundry"),
    "bfloat16": ("megatron-core", "megatron-deepspeed", "llm-foundry"),
}
# Whether each micro-batch's weight gradients are added to the accumulated ones inside the weight-gradient
# GEMMs ("on": Megatron-Core's gradient_accumulation_fusion, its default) or by a separate pass over the
# stage's gradients after each backward ("off": --no-gradient-accumulation-fusion, what Megatron-LM ran before
# the fusion landed in 2022-02 and what a build without the fused kernel runs; EngineProfile.accum_pass).
# Only Megatron-Core offers the choice; a plan that names none runs its runtime's own.
GRAD_ACCUM_FUSION = ("on", "off")
GRAD_ACCUM_FUSION_RUNTIMES = ("megatron-core",)
# The kernel the optimizer step runs Adam with: "fused", one kernel over all of a rank's parameters
# (torch's fused AdamW, apex's, Transformer Engine's and DeepSpeed's FusedAdam), or "foreach", torch's chain of
# multi-tensor kernels (accounting.engines.ADAM_BYTES: 28 against 84 bytes a parameter). Only torchtitan offers
# the choice (--optimizer.implementation; foreach was its default until 2025-02); a plan that names none runs
# its runtime's own.
ADAM_KERNELS = ("fused", "foreach")
ADAM_KERNEL_RUNTIMES = ("torchtitan",)
# Model states kept in host memory (accounting.offload, cost.offload): "optimizer" (the Adam states, the fp32 master
# weights and the optimizer's gradient partition on the host, Adam run by the CPU: DeepSpeed ZeRO-Offload,
# zero_optimization.offload_optimizer, ZeRO-1/2/3; Megatron-Core --optimizer-cpu-offload with the distributed
# optimizer, megatron/core/optimizer/cpu_offloading) or "params" (the sharded parameters too, copied in before
# each gather: DeepSpeed offload_param, ZeRO-3 only; FSDP2's CPUOffloadPolicy, which keeps the sharded parameters,
# their gradients and so the optimizer states on the host and steps on the CPU: torchtitan's
# training.enable_cpu_offload, exatrain's trainer). For each value, the runtimes that run it and the ZeRO stages.
OFFLOADS = ("none", "optimizer", "params")
OFFLOAD_RUNTIMES = {
    "optimizer": {"megatron-deepspeed": (1, 2, 3), "megatron-core": (1,)},
    "params": {"megatron-deepspeed": (3,), "torchtitan": (2, 3), "exatrain": (2, 3)},
}


# Bytes one AdamW update moves per parameter, by kernel (ADAM_KERNELS). "fused" reads the fp32 parameter,
# gradient, exp_avg and exp_avg_sq and writes the parameter and both moments in one kernel (torch's
# _fused_adamw_; apex's, Transformer Engine's and DeepSpeed's FusedAdam): 7 x 4. "foreach"
# (torch.optim.AdamW(foreach=True), torch/optim/adamw.py _multi_tensor_adamw) runs the update as a chain of
# multi-tensor kernels, each reading and writing fp32 tensors: the weight decay's mul (8), the lerp into exp_avg
# (12), exp_avg_sq's mul (8) and addcmul (16), the denominator's sqrt, div and add (8 each), the addcdiv into the
# parameter (16): 84. Counted on torch by tests/planner/test_optimizer_step.py.
ADAM_BYTES = {"fused": 28.0, "foreach": 84.0}


def listed(items) -> str:
    """ "a", "a and b", "a, b and c"."""
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def full_rerun_layers(stage_layers, pp: int, first: int = 0, every: int = 0) -> tuple[int, ...]:
    """Layers of each virtual stage (``stage_layers``, model order; stage k on rank k % pp) a full recomputation
    reruns: all of them; the first ``first`` of each (Plan.recompute_layers); or those whose place among their
    rank's layers, counted over its stages in order from 1, ``every`` divides (Plan.recompute_every)."""
    stages = [int(n) for n in stage_layers]
    if first:
        return tuple(min(n, first) for n in stages)
    if not every:
        return tuple(stages)
    out, before = [], [0] * pp  # a rank's layers in its earlier stages
    for k, n in enumerate(stages):
        r = k % pp
        out.append((before[r] + n) // every - before[r] // every)
        before[r] += n
    return tuple(out)


def recompute_modules_of(value: Any) -> tuple[str, ...]:
    """A plan's recompute modules from "a,b" or a list: known names (RECOMPUTE_MODULES), each once, in that
    order; () for none. A one-line UserError names an unknown one."""
    if value is None or value == "":
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(x).strip() for x in items if str(x).strip()]
    unknown = [n for n in names if n not in RECOMPUTE_MODULES]
    if unknown:
        raise UserError(
            f"--recompute-modules: unknown module {unknown[0]!r}; choose among {', '.join(RECOMPUTE_MODULES)}"
        )
    return tuple(n for n in RECOMPUTE_MODULES if n in names)
