"""The vocabularies of a plan and the one registry of its run settings.

A run setting is an engine option a plan carries beside its layout (``Plan.settings``, a
``RunSettings``): the engine that runs it (``runtime``), FP8 GEMMs, how MoE tokens travel, which
attention kernel, how the element-wise ops and the loss run, how gradients accumulate, which Adam
kernel, how context parallelism exchanges attention's operands, what recomputation reruns and whether
kernel launches wait for their kernels. Most
have an empty value that means "the runtime's own" (``accounting.engines.EngineProfile.resolve``
turns a plan's settings into what its runtime runs).

Each setting is one ``Setting`` record in ``SETTINGS``: its name (the Plan attribute, the plan-JSON
key and, with dashes, the CLI flag), type, default, choices, help, the rule
that refuses it (one line), the exatrain trainer's refusal, the label a plan's one-line description
gets and what each engine config (``engine_configs``) does with it. From the records come
``RunSettings``, the plan JSON's setting keys, the CLI's flags, the API's keyword arguments
(``takes_settings``), ``SpaceOptions``'s settings (``holds_settings``), the scalar rules
(``rules.extension_problem``), ``TrainConfig``'s refusals, ``Plan.settings_label`` and the export
notes. Torch-free; it imports no other layer of exatrain but the catalog's types.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

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


def dtype_problem(dtype: str, runtime: str) -> str | None:
    """Why ``runtime`` does not train in ``dtype``, or None (an unknown dtype or runtime is its own rule's)."""
    if dtype == "float16" and runtime in RUNTIMES and runtime not in FLOAT16_RUNTIMES:
        why = FLOAT16_WHY_NOT.get(runtime, "trains in bfloat16 or float32, not float16")
        return f"--runtime {runtime} {why}: use --dtype bfloat16, or --runtime {' or '.join(FLOAT16_RUNTIMES)}"
    return None


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
# class Triton kernel, flash_attn_triton.py, that llm-foundry's attn_impl "triton" runs). A plan that names none
# runs its runtime's own (accounting.engines ActivationRules.flash_kernel).
ATTENTION_KERNELS = ("fused", "fa2", "sdpa", "triton")
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


def offload_problem(offload: str, runtime: str, zero_stage, dp=None) -> str | None:
    """Why ``runtime`` cannot keep ``offload`` (OFFLOADS) in host memory at ``zero_stage`` (and ``dp``, its replicas
    dp x cp: exatrain's trainer applies FSDP2 only over more than one), or None."""
    if offload == "none":
        return None
    if offload not in OFFLOADS:
        return f"--offload must be one of {', '.join(OFFLOADS)}, got {offload!r}"
    stages = OFFLOAD_RUNTIMES[offload].get(runtime)
    if stages is None:
        names = list(OFFLOAD_RUNTIMES[offload])
        who = ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]
        also = [v for v, by in OFFLOAD_RUNTIMES.items() if runtime in by]
        return f"--offload {offload} is not run by {runtime}; it is run by {who}" + (
            f" ({runtime} offloads --offload {also[0]})" if also else ""
        )
    if isinstance(zero_stage, int) and zero_stage not in stages:
        return f"--offload {offload} under {runtime} needs --zero {' or '.join(map(str, stages))} (got {zero_stage})"
    if runtime == "exatrain" and isinstance(dp, int) and dp < 2:
        return "--offload params runs through FSDP2, which exatrain's trainer applies only with dp x cp > 1"
    return None


def listed(items) -> str:
    """ "a", "a and b", "a, b and c"."""
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def trainer_cannot_build(model: Any) -> str:
    """The line a plan for exatrain's own trainer (``--runtime exatrain``) gets when its model has what the trainer
    does not build yet (``ModelSpec.unbuilt_by_trainer``); "" when the trainer builds it."""
    missing = model.unbuilt_by_trainer
    if not missing:
        return ""
    return (
        f"exatrain's own trainer does not build {model.name} yet ({listed(missing)}): these figures are "
        f"for a run it cannot make; plan the engine that will run it (--runtime "
        f"{', '.join(r for r in RUNTIMES if r != 'exatrain')})"
    )


def default_runtime(model: Any) -> str:
    """The engine a plan is predicted for when none is named: exatrain's own trainer (the one `train` and `tune`
    run) where it builds the model, else Megatron-Core, which builds every architecture the catalog describes
    (latent attention, QK-norm, a head width of its own, sliding windows)."""
    return "megatron-core" if model.unbuilt_by_trainer else "exatrain"


def default_runtime_note(model: Any) -> str:
    """The line a plan gets whose runtime was chosen for it (``default_runtime``) as another than exatrain's own
    trainer; "" where the default is the trainer."""
    missing = model.unbuilt_by_trainer
    if not missing:
        return ""
    return (
        f"runtime megatron-core, the default for {model.name}: exatrain's own trainer does not build it yet "
        f"({listed(missing)}); name the engine that will run it with --runtime"
    )


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


def cp_comm_for(runtime: str, chosen: str = "", model: Any = None) -> str:
    """The context-parallel exchange ``runtime`` runs: ``chosen`` (a plan's --cp-comm) if it offers it, else its
    first that runs ``model`` (one with sliding windows or attention sinks needs an exchange that runs them), else
    its first. A one-line UserError for a way it does not offer."""
    offered = CP_COMM_RUNTIMES.get(runtime, ("p2p",))
    if chosen:
        if chosen not in CP_COMMS:
            raise UserError(f"--cp-comm must be one of {', '.join(CP_COMMS)}, got {chosen!r}")
        if chosen not in offered:
            raise UserError(
                f"--cp-comm {chosen}: {runtime} does not run context parallelism that way; it offers "
                f"{', '.join(offered)}"
            )
        return chosen
    unable = cp_comms_unable(runtime, model)
    return next((c for c in offered if c not in unable), offered[0])


def cp_comms_unable(runtime: str, model: Any) -> dict[str, str]:
    """The context-parallel exchanges of ``runtime`` that cannot run ``model``, each with what it lacks
    (sliding-window attention, attention sinks)."""
    lacks: dict[str, list[str]] = {}
    for table, attr, what in (
        (CP_COMMS_WITHOUT_WINDOWS, "sliding_window", "sliding-window attention"),
        (CP_COMMS_WITHOUT_SINKS, "attention_sinks", "attention sinks"),
    ):
        if getattr(model, attr, 0):
            for c in table.get(runtime, ()):
                lacks.setdefault(c, []).append(what)
    return {c: listed(whats) for c, whats in lacks.items()}


# ---- the rules of the settings (one line each; ``rules.extension_problem`` runs them in SETTINGS order) -------
def heads_not_split(model: Any, tp, cp):
    """Where cp does not divide the heads or the K,V heads a rank holds at tp (scalars or arrays)."""
    tp, cp = np.maximum(np.asarray(tp), 1), np.maximum(np.asarray(cp), 1)
    return ((model.heads // tp) % cp != 0) | ((model.kv_heads // tp) % cp != 0)


def cp_comm_problem(comm: str, runtime: str, model: Any, tp: int | None = None, cp: int | None = None) -> str | None:
    """Why ``runtime`` cannot run context parallelism by ``comm`` (Plan.cp_comm; "" = its own for the model)
    for ``model`` (and, given tp and cp, that layout), or None: a way it does not offer, a way that does not run
    the model's sliding windows (Transformer Engine's p2p ring) or attention sinks (its ring and all-gather),
    or an all-to-all whose cp does not divide the heads and K,V heads a rank holds (each rank attends over the
    whole sequence for heads/cp of them)."""
    if runtime not in RUNTIMES:
        return None  # the runtime's own rule reports it
    try:
        chosen = cp_comm_for(runtime, comm, model)
    except UserError as e:
        return str(e)
    unable = cp_comms_unable(runtime, model)
    if chosen in unable:
        others = [c for c in CP_COMM_RUNTIMES[runtime] if c not in unable]
        return f"{runtime}'s {chosen} context parallelism does not run {unable[chosen]}, which {model.name} has" + (
            f": use --cp-comm {' or '.join(others)}" if others else ""
        )
    if chosen == "a2a" and tp and cp and cp > 1 and bool(heads_not_split(model, tp, cp)):
        return (
            f"--cp {cp} by all-to-all splits the {model.heads // tp} heads and {model.kv_heads // tp} K,V heads a "
            f"rank holds at tp {tp} into cp groups: cp must divide both (or use another --cp-comm)"
        )
    return None


def recompute_modules_problem(modules, recompute, runtime: str) -> str | None:
    """Why a plan cannot recompute ``modules`` (RECOMPUTE_MODULES) under ``recompute`` on ``runtime``, or None:
    only Megatron-Core recomputes by module, and only under selective granularity (it ignores the list otherwise;
    transformer_layer.py reads recompute_modules under recompute_granularity == "selective")."""
    if not modules:
        return None
    if not isinstance(modules, tuple) or any(m not in RECOMPUTE_MODULES for m in modules):
        return f"recompute_modules must be a list of {', '.join(RECOMPUTE_MODULES)}, got {modules!r}"
    if runtime not in RECOMPUTE_MODULES_RUNTIMES:
        return (
            f"--recompute-modules is Megatron-Core's choice of what selective recomputation reruns; runtime "
            f"{runtime} reruns its own (exatrain and Megatron-DeepSpeed the attention core, torchtitan its per-op "
            "policy): use --runtime megatron-core, or drop it"
        )
    if recompute != "selective":
        return (
            f"--recompute-modules chooses what selective recomputation reruns; with --recompute {recompute} "
            "Megatron-Core ignores it: use --recompute selective, or drop it"
        )
    return None


def recompute_layers_problem(n, recompute, runtime: str, every: bool = False) -> str | None:
    """Why a plan cannot fully recompute only the first ``n`` layers of each stage (RECOMPUTE_LAYERS_RUNTIMES;
    ``every``: only one layer in ``n``, RECOMPUTE_EVERY_RUNTIMES), or None: a whole number, under full
    recomputation, on an engine that does it."""
    flag = "--recompute-every" if every else "--recompute-layers"
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        return f"{flag} must be a whole number of layers >= 1 (0: every layer), got {n!r}"
    if not n:
        return None
    if every and runtime not in RECOMPUTE_EVERY_RUNTIMES:
        return (
            f"--recompute-every is torchtitan's layer-level selective checkpointing (selective_ac_option N; "
            f"FSDP1's every-Nth-block check_fn under llm-foundry); runtime {runtime} does not pick layers that "
            f"way: use --runtime {' or '.join(RECOMPUTE_EVERY_RUNTIMES)}, or drop it"
            + (" (Megatron-Core: --recompute-layers, the first N of each stage)" if runtime == "megatron-core" else "")
        )
    if not every and runtime not in RECOMPUTE_LAYERS_RUNTIMES:
        return (
            f"--recompute-layers is Megatron-Core's --recompute-method block --recompute-num-layers; runtime "
            f"{runtime} does not pick layers that way: use --runtime megatron-core, or drop it"
            + (" (torchtitan: --recompute-every, one layer in N)" if runtime == "torchtitan" else "")
        )
    what = "one layer in N" if every else "the first N layers of each stage"
    if recompute != "full":
        return (
            f"{flag} N recomputes {what} whole; with --recompute {recompute} there is no whole-layer "
            "recomputation: use --recompute full, or drop it"
        )
    return None


def adam_kernel_problem(kernel: str, runtime: str) -> str | None:
    """Why a plan (or a search) cannot run Adam's ``kernel`` (ADAM_KERNELS; "" is the runtime's own) under
    ``runtime``, or None."""
    if not kernel:
        return None
    if kernel not in ADAM_KERNELS:
        return f"--adam-kernel must be one of {', '.join(ADAM_KERNELS)}, got {kernel!r}"
    if runtime not in ADAM_KERNEL_RUNTIMES:
        own = (
            "picks its own (fused over plain tensors on a GPU, foreach over DTensors and on the CPU)"
            if runtime == "exatrain"
            else "runs its fused Adam"
        )
        return (
            f"--adam-kernel is torchtitan's switch (--optimizer.implementation); {runtime} {own}: use "
            f"--runtime {' or '.join(ADAM_KERNEL_RUNTIMES)}, or drop it"
        )
    return None


def grad_accum_fusion_problem(fusion: str, runtime: str) -> str | None:
    """Why a plan (or a search) cannot say ``fusion`` (GRAD_ACCUM_FUSION; "" is the runtime's own) for
    whether its gradients accumulate inside the weight-gradient GEMMs under ``runtime``, or None."""
    if not fusion:
        return None
    if fusion not in GRAD_ACCUM_FUSION:
        return f"--grad-accum-fusion must be one of {', '.join(GRAD_ACCUM_FUSION)}, got {fusion!r}"
    if runtime not in GRAD_ACCUM_FUSION_RUNTIMES:
        return (
            f"--grad-accum-fusion is Megatron-Core's switch (--no-gradient-accumulation-fusion); {runtime} "
            f"accumulates its gradients its own way: use --runtime {' or '.join(GRAD_ACCUM_FUSION_RUNTIMES)}, "
            "or drop it"
        )
    return None


def grad_accum_problem(accum: str, dtype: str, runtime: str) -> str | None:
    """Why a plan (or a search) cannot accumulate its gradients in ``accum`` (GRAD_ACCUM; "" is the
    runtime's own) training in ``dtype`` under ``runtime``, or None."""
    if not accum:
        return None
    if accum not in GRAD_ACCUM:
        return f"--grad-accum must be one of {', '.join(GRAD_ACCUM)}, got {accum!r}"
    if dtype != "bfloat16":
        return f"--grad-accum sets how bfloat16 training accumulates its gradients; this one trains in {dtype}: drop it"
    if runtime not in GRAD_ACCUM_RUNTIMES[accum]:
        return (
            f"{runtime} accumulates bfloat16 gradients in float32 only (--grad-accum {accum} is offered by "
            f"{' and '.join(GRAD_ACCUM_RUNTIMES[accum])}): drop it"
        )
    return None


def _runtime_problem(v, p) -> str | None:
    if v not in RUNTIMES:
        return f"--runtime must be one of {', '.join(RUNTIMES)}, got {v!r}"
    return dtype_problem(p.dtype, v)


def _fp8_problem(v, p) -> str | None:
    if v and v not in FP8_RECIPES:
        return f"--fp8 must be one of {', '.join(FP8_RECIPES)}, got {v!r}"
    if v and p.dtype != "bfloat16":
        return "--fp8 runs its GEMMs in FP8 inside bfloat16 training: use --dtype bfloat16"
    return None


def _dispatcher_problem(v, p) -> str | None:
    if v not in MOE_DISPATCHERS:
        return f"--moe-dispatcher must be one of {', '.join(MOE_DISPATCHERS)}, got {v!r}"
    if v != "alltoall" and not p.model.is_moe:
        return f"--moe-dispatcher {v} dispatches a mixture-of-experts layer's tokens; {p.model.name} has no experts"
    return None


def _not_moe(flag: str, p) -> str:
    return f"{flag} sets how a mixture-of-experts layer's tokens are routed; {p.model.name} has no experts"


def _capacity_problem(v, p) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
        return f"--moe-capacity-factor must be a number >= 0 (0: dropless), got {v!r}"
    if v and not p.model.is_moe:
        return _not_moe("--moe-capacity-factor", p)
    if v and p.moe_dispatcher != "alltoall":
        # Megatron-Core refuses it too (transformer_config.py: "moe_expert_capacity_factor only works with
        # alltoall token dispatcher")
        return (
            f"--moe-capacity-factor drops and pads tokens in the alltoall dispatcher only; drop it or use "
            f"--moe-dispatcher alltoall (not {p.moe_dispatcher})"
        )
    return None


def _balance_problem(v, p) -> str | None:
    return _not_moe("--moe-force-balance", p) if v and not p.model.is_moe else None


def _gather_problem(v, p) -> str | None:
    if not v:
        return None
    need = FP8_PARAM_GATHER_RUNTIMES.get(p.runtime)
    if not p.fp8:
        return "--fp8-param-gather gathers the FP8 GEMMs' weights in FP8: it needs --fp8 (a scaling recipe)"
    if need is None:
        return (
            f"--fp8-param-gather is Megatron-Core's --fp8-param-gather or torchtitan's "
            f"enable_fsdp_float8_all_gather; runtime {p.runtime} has no such switch: "
            "use --runtime megatron-core or torchtitan, or drop it"
        )
    if p.runtime == "torchtitan" and p.fp8 != "current":
        return (
            f"torchtitan gathers FP8 weights with tensorwise scaling only: use --fp8 current (not {p.fp8}), "
            "or drop --fp8-param-gather"
        )
    if isinstance(p.zero_stage, int) and p.zero_stage < need:
        what = "the distributed optimizer" if p.runtime == "megatron-core" else "FSDP"
        return (
            f"--fp8-param-gather needs {what} (ZeRO-{need} or higher) under {p.runtime}, which gathers the "
            f"weights it sends: use --zero {need}, or drop it"
        )
    return None


def _kernel_problem(v, p) -> str | None:
    if v and v not in ATTENTION_KERNELS:
        return f"--attention-kernel must be one of {', '.join(ATTENTION_KERNELS)}, got {v!r}"
    if v and not p.flash_attention:
        return (
            f"--attention-kernel {v} names flash attention's kernel; this plan has flash attention off "
            "(--no-flash-attention): drop one of them"
        )
    return None


def _elementwise_problem(v, p) -> str | None:
    if v and v not in ELEMENTWISE:
        return f"--elementwise must be one of {', '.join(ELEMENTWISE)}, got {v!r}"
    return None


def _loss_problem(v, p) -> str | None:
    if v and v not in CROSS_ENTROPY:
        return f"--cross-entropy must be one of {', '.join(CROSS_ENTROPY)}, got {v!r}"
    if v and p.runtime not in CROSS_ENTROPY_RUNTIMES[v]:
        what = {
            "upcast": "torch's cross_entropy over an fp32 copy",
            "inplace": "Megatron's vocab-parallel loss",
            "fused": "one kernel over the 16-bit logits (a compiled loss, flash-attn's xentropy)",
        }[v]
        return (
            f"--cross-entropy {v} is {what}, which {p.runtime} does not run: use "
            f"--runtime {' or '.join(CROSS_ENTROPY_RUNTIMES[v])}, or drop it"
        )
    return None


def _cp_comm_problem(v, p) -> str | None:
    if not isinstance(v, str):
        return f"cp_comm must be a string, got {v!r}"
    tp = p.dims.tp if isinstance(p.dims.tp, int) and not isinstance(p.dims.tp, bool) else None
    return cp_comm_problem(v, p.runtime, p.model, tp, p.dims.cp) if (p.dims.cp > 1 or v) else None


# ---- the exatrain trainer's refusals (TrainConfig.check): what it does not run, one line each -------------
def _trainer_routes(flag: str) -> str:
    # Its routing is dropless and follows the router (trainer.moe): a plan priced with token drop or
    # forced-even routing is another run's.
    return (
        f"the exatrain trainer routes MoE tokens dropless, as its router says; plan {flag} for Megatron-Core "
        "(--runtime megatron-core) or train a plan made without it"
    )


def _trainer_layers(flag: str, n: int) -> str:
    # Its full recomputation wraps every block (parallel/activation.py).
    return (
        f"the exatrain trainer's full recomputation reruns every layer; plan {flag} {n} for the runtime that "
        "picks layers (Megatron-Core, torchtitan), or train a plan made without it"
    )


def _trainer_elementwise(v, compile: bool) -> str | None:
    # The plan was priced with its element-wise ops as it names them: fused ones are what --compile runs;
    # eager ones what the trainer runs without it.
    if v == "fused" and not compile:
        return (
            "this plan was priced with fused element-wise ops (--elementwise fused): train it with --compile, "
            "or plan it with --elementwise eager"
        )
    if v in ("eager", "eager-composite") and compile:
        return (
            f"this plan was priced with eager element-wise ops (--elementwise {v}): train it without "
            "--compile, or plan it with --elementwise fused"
        )
    return None


# ---- labels (Plan.settings_label) ----------------------------------------------------------------------
def _label(text: str) -> Callable[[Any, Any], str]:
    """A label that is ``text`` formatted with the value (``{v}``) where the value is not the default."""
    return lambda v, s: text.format(v=v)


# ---- the records ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """One run setting. ``name``: the Plan / RunSettings attribute, the plan-JSON key and (dashed) the CLI flag;
    ``default``: the value that means "not set" (for most, the runtime's own); ``arg``: how the CLI reads it
    ("choice" among ``choices``, "switch" on/off, "number" >= 0, "count" > 0, "count_or_auto", "list" of
    ``choices``, "engine"); ``metavar``: the word the CLI shows for its value (None: argparse's);
    ``problem(value, plan)``: the one line a plan with
    this value breaks beyond its type (``check``, which ``rules.extension_problem`` runs in SETTINGS order), or
    None; ``trainer(value, compile)``: the exatrain trainer's refusal (``TrainConfig.check``), or None;
    ``label(value, settings)``: the plan's one-line description's part ("" none; only asked for a value other
    than the default); ``exports``: per engine config (``engine_configs``), the option that writes the setting
    there, and ``notes``: per engine config, the note its export carries where it cannot write the value
    (``setting_notes``); ``own``: the runtime's own value (its default per runtime, and per model where that
    matters) where a plan names none."""

    name: str
    type: Any
    default: Any
    help: str
    arg: str = "choice"
    choices: tuple = ()
    metavar: str | None = None
    problem: Callable[[Any, Any], str | None] = lambda v, p: None
    trainer: Callable[[Any, bool], str | None] = lambda v, compile: None
    label: Callable[[Any, Any], str] = lambda v, s: ""
    exports: Mapping[str, str] = field(default_factory=dict)
    notes: Mapping[str, Callable[[Any], str]] = field(default_factory=dict)
    # (engine profile, settings, model) -> the runtime's own value where the setting names none (its default), read
    # by EngineProfile.resolve; None: the value is what it is (or the profile's variant carries it)
    own: Callable[[Any, Any, Any], Any] | None = None
    load: Callable[[Any], Any] = lambda v: v  # plan JSON -> value
    dump: Callable[[Any], Any] = lambda v: v  # value -> plan JSON

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value, plan) -> str | None:
        """The one line a plan with ``value`` breaks: a switch that is not true or false, else ``problem``'s."""
        if self.type is bool and not isinstance(value, bool):
            return f"{self.name} must be true or false, got {value!r}"
        return self.problem(value, plan)


def _kernel_note(engine: str, switches: tuple[str, ...], runs: str) -> Callable[[Any], str]:
    """A note for a flash-attention plan priced with an --attention-kernel that ``engine`` has no switch for
    (``switches``: those it has), saying what the config ``runs`` instead. A note, not a refusal: the estimate is
    the what-if the user asked for, and the config says what it runs."""

    def note(plan) -> str:
        if not plan.flash_attention or not plan.attention_kernel or plan.attention_kernel in switches:
            return ""
        return (
            f"the plan was priced with the {plan.attention_kernel} attention kernel; {engine} has no switch "
            f"for it: {runs}"
        )

    return note


def _titan03_cp_note(plan) -> str:
    """torchtitan 0.3 all-gathers K and V (context_parallel/api.py: flex_cp_allgather, or SDPA's dispatcher)."""
    comm = cp_comm_for("torchtitan", plan.cp_comm, plan.model) if plan.cp > 1 else "all_gather"
    return (
        ""
        if comm == "all_gather"
        else (
            f"the plan was priced with the {comm} K,V exchange; torchtitan 0.3 has no "
            "switch for it and all-gathers K and V"
        )
    )


def _elementwise_note(engine: str) -> Callable[[Any], str]:
    """Megatron fuses the element-wise ops (its bias-activation, RoPE and norm kernels): a plan priced eager
    gets a note."""

    def note(plan) -> str:
        if plan.elementwise not in ("eager", "eager-composite"):
            return ""
        return (
            f"the plan was priced with {plan.elementwise} element-wise ops; {engine} runs its fused kernels "
            "(plan it without --elementwise, or with fused, to price them)"
        )

    return note


def _fusion_note(target: str) -> Callable[[Any], str]:
    def note(plan) -> str:
        if not plan.grad_accum_fusion:
            return ""
        where = (
            "inside the weight-gradient GEMMs" if plan.grad_accum_fusion == "on" else "by a pass after each backward"
        )
        return (
            f"the plan was priced with Megatron-Core's gradients accumulated {where} (--grad-accum-fusion "
            f"{plan.grad_accum_fusion}); {target} accumulates them its own way, which this config does not set"
        )

    return note


def _adam_note(target: str) -> Callable[[Any], str]:
    def note(plan) -> str:
        if not plan.adam_kernel:
            return ""
        return (
            f"the plan was priced with {plan.adam_kernel} Adam (--adam-kernel, torchtitan's switch); {target} "
            "runs its FusedAdam, which this config does not change"
        )

    return note


def _blocking_note(plan) -> str:
    """An engine config cannot set the environment: a plan priced with synchronous launches says so."""
    return (
        ""
        if not plan.launch_blocking
        else "the plan was priced with synchronous kernel launches: set "
        "CUDA_LAUNCH_BLOCKING=1 in the job's environment (this config cannot)"
    )


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "runtime",
        str,
        "exatrain",
        arg="engine",
        choices=RUNTIMES,
        metavar="ENGINE",
        problem=_runtime_problem,
        help=(
            "the engine that runs the plan: megatron-core, megatron-deepspeed, torchtitan, llm-foundry (Composer's "
            "PyTorch FSDP1, data parallelism alone; priced, not exported) or exatrain (this project's trainer); its "
            "memory decides what fits and its overlaps and collectives the step time; "
            "default exatrain, or megatron-core for a model exatrain's trainer does not build (said in the "
            "output)"
        ),
        load=str,
    ),
    Setting(
        "fp8",
        str,
        "",
        choices=FP8_RECIPES,
        problem=_fp8_problem,
        load=str,
        help="run the linear layers' GEMMs in FP8 with this scaling recipe (default: none)",
        exports={"megatron": "--fp8-recipe", "torchtitan": "quantize.linear.float8"},
    ),
    Setting(
        "moe_dispatcher",
        str,
        "alltoall",
        choices=MOE_DISPATCHERS,
        problem=_dispatcher_problem,
        load=str,
        help=(
            "how MoE tokens reach their experts: alltoall (every routed copy; default) or Megatron-Core's flex "
            "dispatcher with DeepEP / HybridEP (once per destination rank and node)"
        ),
        trainer=lambda v, c: (
            None
            if v == "alltoall"
            else (
                f"the exatrain trainer dispatches MoE tokens with its own all-to-all; plan --moe-dispatcher {v} for "
                "Megatron-Core (--runtime megatron-core) or train this plan with --moe-dispatcher alltoall"
            )
        ),
        label=_label("{v} dispatcher"),
        exports={"megatron": "--moe-flex-dispatcher-backend"},
        notes={
            "torchtitan": lambda p: (
                ""
                if p.moe_dispatcher == "alltoall" or not p.model.is_moe
                else (
                    f"the plan was priced with the {p.moe_dispatcher} dispatcher (one copy per destination rank and "
                    "node); this config sets no dispatcher: torchtitan's own all-to-all sends every routed copy"
                )
            )
        },
    ),
    Setting(
        "moe_capacity_factor",
        float,
        0.0,
        arg="number",
        metavar="C",
        problem=_capacity_problem,
        help=(
            "drop a MoE layer's tokens beyond C times an expert's mean load and pad every expert's input to it "
            "(Megatron-Core --moe-expert-capacity-factor C --moe-pad-expert-input-to-capacity; alltoall "
            "dispatcher); default 0: dropless, the busiest expert rank taking 1.25x the mean"
        ),
        trainer=lambda v, c: _trainer_routes("--moe-capacity-factor") if v else None,
        label=_label("token drop at capacity {v:g}, padded"),
        exports={"megatron": "--moe-expert-capacity-factor"},
        notes={
            "torchtitan": lambda p: (
                ""
                if not p.moe_capacity_factor or not p.model.is_moe
                else (
                    f"the plan was priced with token drop at capacity factor {p.moe_capacity_factor:g}, every expert "
                    "padded to it; torchtitan's MoE is dropless and this config cannot set it"
                )
            )
        },
    ),
    Setting(
        "moe_force_balance",
        bool,
        False,
        arg="switch",
        problem=_balance_problem,
        help=(
            "route MoE tokens evenly whatever the router says (Megatron-Core --moe-router-force-load-balancing, "
            "a benchmarking switch): the busiest expert rank takes the mean; default off"
        ),
        trainer=lambda v, c: _trainer_routes("--moe-force-balance") if v else None,
        label=lambda v, s: "" if s.moe_capacity_factor else "force-balanced routing",
        exports={
            "megatron": "--moe-router-force-load-balancing",
            "torchtitan": "moe_force_load_balance",
            "torchtitan-0.3": "--debug.moe-force-load-balance",
        },
    ),
    Setting(
        "fp8_param_gather",
        bool,
        False,
        arg="switch",
        problem=_gather_problem,
        help=(
            "gather the FP8 GEMMs' weights in FP8 over the data-parallel group and keep no 16-bit copy of them "
            "(Megatron-Core --fp8-param-gather, with the distributed optimizer: ZeRO-1+; torchtitan "
            "enable_fsdp_float8_all_gather, with FSDP: ZeRO-2/3 and --fp8 current); needs --fp8; default off"
        ),
        # Its FP8 linears (trainer/fp8.py) keep 16-bit weights and FSDP gathers them in 16 bits.
        trainer=lambda v, c: (
            None
            if not v
            else (
                "the exatrain trainer gathers and keeps its weights in 16 bits; plan --fp8-param-gather for "
                "Megatron-Core or torchtitan (--runtime megatron-core / torchtitan) or train a plan made without it"
            )
        ),
        label=_label("FP8 parameter gather"),
        exports={"megatron": "--fp8-param-gather", "torchtitan": "enable_fsdp_float8_all_gather"},
    ),
    Setting(
        "attention_kernel",
        str,
        "",
        choices=ATTENTION_KERNELS,
        problem=_kernel_problem,
        load=str,
        help=(
            "which kernel the run's flash attention is: fused (cuDNN / Transformer Engine), fa2 "
            "(FlashAttention-2: Megatron-DeepSpeed, and torch SDPA on Hopper before torch 2.11), sdpa (torch "
            "SDPA's own choice), triton (llm-foundry's Triton FlashAttention); default: the runtime's"
        ),
        # Its attention is torch SDPA with SDPA's own kernel choice (model.py); forcing one would also have to
        # hold for cp's masks, the keyed dropout core and the CPU.
        trainer=lambda v, c: (
            None
            if v in ("", "sdpa")
            else (
                f"the exatrain trainer runs torch SDPA's own attention kernel choice; plan --attention-kernel {v} for "
                "another runtime, or train a plan made without --attention-kernel (or with sdpa)"
            )
        ),
        label=_label("attention {v}"),
        own=lambda engine, s, model: engine.activations.flash_kernel,
        exports={"megatron": "--attention-backend", "deepspeed": "--use-flash-attn-v2"},
        notes={
            "megatron": _kernel_note("Megatron-Core", ("fused", "fa2"), "this config runs --attention-backend fused"),
            "deepspeed": _kernel_note(
                "Megatron-DeepSpeed", ("fa2",), "this config runs FlashAttention-2 (--use-flash-attn-v2)"
            ),
            "torchtitan": _kernel_note(
                "torchtitan",
                ("sdpa",),
                "torch SDPA picks its kernel by torch version and "
                "device (cuDNN's on Hopper from torch 2.11, FlashAttention-2's before)",
            ),
        },
    ),
    Setting(
        "elementwise",
        str,
        "",
        choices=ELEMENTWISE,
        problem=_elementwise_problem,
        load=str,
        help=(
            "how the layers' element-wise ops run: fused (torch.compile, Megatron's fused kernels), eager (a "
            "kernel per PyTorch op), eager-composite (also each RMSNorm as its composite ops: a hand-written "
            "norm, or torch before 2.9); default: the runtime's (Megatron fused; torchtitan and exatrain eager)"
        ),
        trainer=_trainer_elementwise,
        label=_label("element-wise {v}"),
        own=lambda engine, s, model: engine.elementwise_default,
        exports={"torchtitan": "[compile]", "torchtitan-0.3": "--compile."},
        notes={
            "megatron": _elementwise_note("Megatron-Core"),
            "deepspeed": _elementwise_note("Megatron-DeepSpeed"),
            "torchtitan": lambda p: (
                ""
                if p.elementwise != "eager-composite"
                else (
                    "the plan was priced with each RMSNorm as composite ops (--elementwise eager-composite); "
                    "torchtitan's nn.RMSNorm runs one fused kernel from torch 2.9"
                )
            ),
        },
    ),
    Setting(
        "cross_entropy",
        str,
        "",
        choices=CROSS_ENTROPY,
        problem=_loss_problem,
        load=str,
        help=(
            "how the loss runs over the logits: upcast (torch's cross_entropy(logits.float()): 12 bytes a logit "
            "at its peak; torchtitan, exatrain), inplace (Megatron's vocab-parallel loss, one fp32 copy worked in "
            "place: e + 4 bytes) or fused (one compiled kernel over the 16-bit logits, 2e bytes: torchtitan's "
            'compiled loss, [compile] components "loss"); default: the runtime\'s (Megatron inplace; torchtitan '
            "fused when its element-wise ops are, else upcast; exatrain upcast)"
        ),
        # Its loss is cross_entropy(logits.float()) uncompiled, even under --compile (train.py).
        trainer=lambda v, c: (
            None
            if v in ("", "upcast")
            else (
                f"the exatrain trainer runs its loss upcast to fp32, uncompiled; plan --cross-entropy {v} for the "
                "runtime that runs it, or train a plan made without it (or with upcast)"
            )
        ),
        label=_label("cross-entropy {v}"),
        own=lambda engine, s, model: engine.cross_entropy("", s.elementwise),
        exports={"torchtitan": "[compile]", "torchtitan-0.3": "--compile."},
    ),
    Setting(
        "grad_accum",
        str,
        "",
        choices=GRAD_ACCUM,
        load=str,
        problem=lambda v, p: grad_accum_problem(v, p.dtype, p.runtime),
        help=(
            "the dtype bfloat16 training accumulates and reduces its gradients in: float32 (Megatron-Core's "
            "default; DeepSpeed's BF16_Optimizer, data_types.grad_accum_dtype fp32, ZeRO-1: 26 bytes a parameter "
            "every micro-batch to accumulate them, all-reduced in fp32) or bfloat16 (DeepSpeed's default; "
            "Megatron-Core --grad-reduce-in-bf16); default: the runtime's (torchtitan and exatrain: float32 only)"
        ),
        # Its parameters and their gradients are fp32 under autocast (trainer/parallel/data.py).
        trainer=lambda v, c: (
            None
            if v != "bfloat16"
            else (
                "the exatrain trainer accumulates and reduces its gradients in float32; plan --grad-accum bfloat16 for "
                "Megatron-Core or DeepSpeed, or train a plan made without it"
            )
        ),
        label=_label("{v} gradients"),
        # DeepSpeed's own is bfloat16; float32 it writes as data_types.grad_accum_dtype (ZeRO-0/1), else notes
        exports={"megatron": "--grad-reduce-in-bf16"},
        notes={
            "deepspeed": lambda p: (
                ""
                if not (p.grad_accum == "float32" and p.zero_stage > 1)
                else (
                    f"the plan was priced with float32 gradient accumulation; DeepSpeed accumulates in float32 only "
                    f"through its BF16_Optimizer (ZeRO-0/1), so this config at ZeRO-{p.zero_stage} keeps its "
                    "bfloat16 default"
                )
            ),
            "torchtitan": lambda p: (
                ""
                if p.grad_accum != "bfloat16"
                else (
                    "the plan was priced with its gradients accumulated and reduced in bfloat16; torchtitan reduces "
                    "them in float32 (mixed_precision_reduce), as this config sets"
                )
            ),
        },
    ),
    Setting(
        "grad_accum_fusion",
        str,
        "",
        choices=GRAD_ACCUM_FUSION,
        load=str,
        problem=lambda v, p: grad_accum_fusion_problem(v, p.runtime),
        help=(
            "whether each micro-batch's weight gradients are added to the accumulated ones inside the "
            "weight-gradient GEMMs (on: Megatron-Core's default) or by a pass over the stage's gradients after "
            "each backward (off: Megatron-Core's --no-gradient-accumulation-fusion, 10 bytes a parameter every "
            "micro-batch into fp32 main gradients); Megatron-Core only"
        ),
        trainer=lambda v, c: (
            None
            if not v
            else (
                f"--grad-accum-fusion {v} is Megatron-Core's switch; the exatrain trainer accumulates its gradients "
                "through autograd: train a plan made without it"
            )
        ),
        label=_label("gradient-accumulation fusion {v}"),
        exports={"megatron": "--no-gradient-accumulation-fusion"},
        notes={"deepspeed": _fusion_note("Megatron-DeepSpeed"), "torchtitan": _fusion_note("torchtitan")},
    ),
    Setting(
        "adam_kernel",
        str,
        "",
        choices=ADAM_KERNELS,
        load=str,
        problem=lambda v, p: adam_kernel_problem(v, p.runtime),
        help=(
            "the kernel the optimizer step runs Adam with: fused (one kernel, 28 bytes a parameter; torchtitan's "
            "default since 2025-02) or foreach (torch's chain of multi-tensor kernels, 84 bytes a parameter; "
            "torchtitan's --optimizer.implementation foreach, its default before); torchtitan only"
        ),
        # The trainer picks its own (train.fused_adamw_ok).
        trainer=lambda v, c: (
            None
            if not v
            else (
                f"--adam-kernel {v} is torchtitan's switch; the exatrain trainer runs fused Adam over plain tensors on "
                "a GPU and foreach elsewhere: train a plan made without it"
            )
        ),
        label=_label("{v} Adam"),
        exports={"torchtitan": "implementation", "torchtitan-0.3": "--optimizer.implementation"},
        notes={"megatron": _adam_note("Megatron-Core"), "deepspeed": _adam_note("Megatron-DeepSpeed")},
    ),
    Setting(
        "cp_comm",
        str,
        "",
        choices=CP_COMMS,
        problem=_cp_comm_problem,
        load=str,
        help=(
            "how attention's operands travel under --cp: p2p (a ring of K,V blocks, each behind a block's "
            "attention), all_gather (K,V gathered; exposed in Transformer Engine and exatrain, behind the local "
            "block in torchtitan) or a2a (all-to-all of Q,K,V and the output: DeepSpeed-Ulysses, Megatron-Core "
            "--cp-comm-type a2a; cp must divide the heads a rank holds); default: the runtime's (Megatron-Core "
            "p2p, a2a for sliding-window models; Megatron-DeepSpeed a2a; torchtitan and exatrain all_gather)"
        ),
        # Its context parallelism all-gathers K,V (parallel/context.py).
        trainer=lambda v, c: (
            None
            if v in ("", "all_gather")
            else (
                f"the exatrain trainer runs context parallelism by all-gathering K,V; plan --cp-comm {v} for the "
                "runtime that runs it, or train a plan made without it (or with all_gather)"
            )
        ),
        label=_label("cp {v}"),
        own=lambda engine, s, model: cp_comm_for(engine.name, "", model),
        exports={"megatron": "--cp-comm-type", "torchtitan": "context_parallel_rotate_method"},
        notes={"torchtitan-0.3": _titan03_cp_note},
    ),
    Setting(
        "recompute_modules",
        tuple,
        (),
        arg="list",
        choices=RECOMPUTE_MODULES,
        problem=lambda v, p: recompute_modules_problem(v, p.recompute, p.runtime),
        help=(
            "what --recompute selective reruns, Megatron-Core's modules, comma-separated: core_attn (its default), "
            "layernorm, moe_act, mla_up_proj, mlp (a dense layer's), shared_experts, moe; --runtime megatron-core "
            "only (its --recompute-modules); a search with it tries selective recomputation only"
        ),
        # Its selective recomputation reruns the attention core (parallel/activation.py).
        trainer=lambda v, c: (
            None
            if not v
            else (
                f"the exatrain trainer's selective recomputation reruns the attention core; plan --recompute-modules "
                f"{','.join(v)} for Megatron-Core (--runtime megatron-core), or train a plan made without it"
            )
        ),
        label=lambda v, s: f"recompute modules {','.join(v)}",
        exports={"megatron": "--recompute-modules"},
        load=recompute_modules_of,
        dump=list,
    ),
    Setting(
        "recompute_layers",
        int,
        0,
        arg="count_or_auto",
        problem=lambda v, p: recompute_layers_problem(v, p.recompute, p.runtime),
        help=(
            "with --recompute full: recompute only the first N layers of each (virtual) pipeline stage, the "
            "others keeping all they keep without recomputation (Megatron-Core --recompute-method block "
            "--recompute-num-layers N); --runtime megatron-core only; default: every layer; a search with a "
            "number tries full recomputation only, with 'auto' (search and scaling) each full-recomputation "
            "layout recomputes the fewest layers a stage with which it fits"
        ),
        trainer=lambda v, c: _trainer_layers("--recompute-layers", v) if v else None,
        label=_label("the first {v} layers of each stage recomputed"),
        exports={"megatron": "--recompute-num-layers"},
    ),
    Setting(
        "recompute_every",
        int,
        0,
        arg="count",
        problem=lambda v, p: recompute_layers_problem(v, p.recompute, p.runtime, every=True),
        help=(
            "with --recompute full: recompute one layer in N of each rank (counted over its stages in order), the "
            "others keeping all they keep without recomputation (torchtitan's layer-level selective "
            "checkpointing: activation_checkpoint.mode selective, selective_ac_option N); --runtime torchtitan "
            "or llm-foundry; default: every layer; a search with it tries full recomputation only"
        ),
        trainer=lambda v, c: _trainer_layers("--recompute-every", v) if v else None,
        label=_label("one layer in {v} recomputed"),
        exports={"torchtitan": "selective_ac_option"},
        notes={
            "torchtitan-0.3": lambda p: (
                ""
                if not (p.recompute == "full" and p.recompute_every)
                else (
                    f"torchtitan 0.3 checkpoints every block or none (FullAC): the plan checkpoints one block in "
                    f"{p.recompute_every}, and this command line every block"
                )
            )
        },
    ),
    Setting(
        "offload",
        str,
        "none",
        choices=OFFLOADS,
        load=str,
        problem=lambda v, p: offload_problem(v, p.runtime, p.zero_stage, p.dp * p.cp),
        help=(
            "keep model states in host memory: optimizer (Adam states, fp32 master weights and gradient partition "
            "on the host, Adam on the CPU: DeepSpeed offload_optimizer at ZeRO-1/2/3, Megatron-Core "
            "--optimizer-cpu-offload at ZeRO-1) or params (the sharded parameters too: DeepSpeed offload_param at "
            "ZeRO-3; FSDP2's CPUOffloadPolicy at ZeRO-2/3 under torchtitan and exatrain); priced with the node's "
            "host memory, the host link's copies and the CPU's Adam; default none (a search offers it when no "
            "layout fits without it)"
        ),
        # Its FSDP2 runs CPUOffloadPolicy (parallel/data.py); nothing else offloads there.
        trainer=lambda v, c: (
            None
            if v in ("none", "params")
            else (
                f"the exatrain trainer offloads through FSDP2's CPUOffloadPolicy (--offload params, ZeRO-2/3); plan "
                f"--offload {v} for DeepSpeed or Megatron-Core, or train a plan made with --offload params"
            )
        ),
        label=_label("{v} offloaded to host memory"),
        exports={"deepspeed": "offload_", "megatron": "--optimizer-cpu-offload"},
        notes={
            "megatron": lambda p: (
                ""
                if p.offload != "params"
                else (
                    "the plan was priced with the parameters in host memory; Megatron-Core offloads the optimizer only "
                    "(--optimizer-cpu-offload), which this command line sets: its parameters stay on the GPU"
                )
            ),
            "torchtitan": lambda p: (
                ""
                if p.offload != "optimizer"
                else (
                    "the plan was priced with the optimizer alone in host memory; torchtitan's FSDP CPU offload "
                    "(training.enable_cpu_offload) moves the parameters and gradients too: plan --offload params for "
                    "it; this config does not offload"
                )
            ),
        },
    ),
    Setting(
        "launch_blocking",
        bool,
        False,
        arg="switch",
        help=(
            "price the run with synchronous kernel launches (CUDA_LAUNCH_BLOCKING=1 in the job's environment, as "
            "BLOOM-176B's training set it against NCCL hangs): each launch returns once its kernel has run, so "
            "the host's dispatch of every GEMM, element-wise kernel and collective (the cost model's "
            "blocking_launch_s) adds to the step and no communication overlaps compute; default off"
        ),
        trainer=lambda v, c: (
            None
            if not v
            else (
                "--launch-blocking prices an environment variable (CUDA_LAUNCH_BLOCKING=1) that the exatrain trainer "
                "does not set; export it in the job's environment and train a plan made without the switch"
            )
        ),
        label=_label("synchronous launches"),
        notes={t: _blocking_note for t in ("megatron", "deepspeed", "torchtitan")},
    ),
)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
NAMES: tuple[str, ...] = tuple(BY_NAME)
# The settings a planner command takes as flags (--runtime is each command's own: its default and help differ)
FLAG_SETTINGS: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.arg != "engine")


def _settings_methods() -> dict[str, Any]:
    def replace(self, **changes: Any):
        """The same settings with ``changes`` (setting names)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The settings that are not their defaults, as plan JSON writes them (its flat keys, SETTINGS order)."""
        return {s.name: s.dump(getattr(self, s.name)) for s in SETTINGS if getattr(self, s.name) != s.default}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]):
        """The settings among plan-JSON keys ``d`` (a key not there: the default)."""
        return cls(**{s.name: s.load(d[s.name]) for s in SETTINGS if s.name in d})

    @classmethod
    def of(cls, values: Mapping[str, Any], base=None):
        """Settings from keyword values (the API's and the CLI's): a value given (not None) wins, then
        ``base``'s (a plan's settings), then the default. recompute_modules may be "a,b" or a list."""
        out = base if base is not None else cls()
        given = {k: v for k, v in values.items() if k in BY_NAME and v is not None}
        if "recompute_modules" in given:
            given["recompute_modules"] = recompute_modules_of(given["recompute_modules"])
        return dataclasses.replace(out, **given)

    @property
    def label(self) -> str:
        """The settings that are not the defaults, as the one-line descriptions append them
        (", deepep dispatcher, force-balanced routing, attention fa2"); "" when all are defaults."""
        parts = (s.label(getattr(self, s.name), self) for s in SETTINGS if getattr(self, s.name) != s.default)
        return "".join(f", {text}" for text in parts if text)

    return {
        "replace": replace,
        "to_dict": to_dict,
        "from_dict": from_dict,
        "of": of,
        "label": label,
        "__doc__": "A plan's run settings (SETTINGS: one field per record, each its default unless set).",
    }


RunSettings = dataclasses.make_dataclass(
    "RunSettings",
    [(s.name, s.type, field(default=s.default)) for s in SETTINGS],
    frozen=True,
    namespace=_settings_methods(),
)
RunSettings.__module__ = __name__


def holds_settings(cls):
    """Decorate a frozen dataclass with a ``settings: RunSettings`` field: each setting reads as an attribute
    (``plan.fp8`` is ``plan.settings.fp8``), and the constructor (so ``dataclasses.replace`` too) takes settings
    by name, folded into ``settings`` (``Plan(model=m, runtime="torchtitan")``)."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args: Any, **kw: Any) -> None:
        named = {k: kw.pop(k) for k in NAMES if k in kw}
        if named:
            kw["settings"] = kw.get("settings", RunSettings()).replace(**named)
        init(self, *args, **kw)

    cls.__init__ = __init__
    for s in SETTINGS:
        setattr(cls, s.name, property(lambda self, n=s.name: getattr(self.settings, n), doc=s.help))
    return cls


def takes_settings(fn):
    """Give ``fn`` (which ends in ``**settings``) one keyword argument per run setting it does not name itself,
    default None (not given): its signature (``inspect.signature``, which the CLI reads to pass its flags) lists
    them, and a keyword that is neither its own nor a setting is a TypeError, as for any function."""
    sig = inspect.signature(fn)
    own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    names = {p.name for p in own}
    extra = [
        inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY, default=None) for s in SETTINGS if s.name not in names
    ]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kw: Any) -> Any:
        for k in kw:
            if k not in names and k not in BY_NAME:
                raise TypeError(f"{fn.__name__}() got an unexpected keyword argument {k!r}")
        return fn(*args, **kw)

    wrapper.__signature__ = sig.replace(parameters=own + extra)  # type: ignore[attr-defined]
    return wrapper


# Export targets whose notes include another's: torchtitan 0.3 runs the settings v0.2.2 runs, less two switches
NOTES_ALSO = {"torchtitan-0.3": "torchtitan"}


def setting_notes(plan: Any, target: str) -> list[str]:
    """The notes an export for ``target`` carries for the plan's settings it cannot write (``Setting.notes``, and
    those of the target ``NOTES_ALSO`` names), in SETTINGS order."""
    targets = (NOTES_ALSO.get(target), target)
    out = (s.notes[t](plan) for s in SETTINGS for t in targets if t in s.notes)
    return [n for n in out if n]


__all__ = [
    "ADAM_KERNELS",
    "ATTENTION_KERNELS",
    "BY_NAME",
    "CP_COMMS",
    "CROSS_ENTROPY",
    "DTYPES",
    "ELEMENTWISE",
    "FLAG_SETTINGS",
    "FLOAT16_RUNTIMES",
    "FP8_RECIPES",
    "GRAD_ACCUM",
    "GRAD_ACCUM_FUSION",
    "HALF_DTYPES",
    "MOE_DISPATCHERS",
    "NAMES",
    "NOTES_ALSO",
    "OFFLOADS",
    "OFFLOAD_RUNTIMES",
    "RECOMPUTE",
    "RECOMPUTE_MODULES",
    "RUNTIMES",
    "RunSettings",
    "SCHEDULES",
    "SETTINGS",
    "SPLIT_BACKWARD",
    "V_SCHEDULES",
    "Setting",
    "cp_comm_for",
    "default_runtime",
    "dtype_problem",
    "full_rerun_layers",
    "holds_settings",
    "listed",
    "offload_problem",
    "recompute_modules_of",
    "setting_notes",
    "takes_settings",
]
