"""The contract between planner, trainer, launchers and reports.

A ``Plan`` is one training layout for one model: the parallel degrees, batch sizes and execution
options. It is the unit of reproducibility: ``exatrain search``/``estimate`` write it as JSON,
``exatrain launch`` renders it, ``exatrain train`` executes it, and every run appends a
``RunRecord`` (the plan, what the cost model predicted, what was measured) that calibration and
tuning read back. JSON keys are exact: loading rejects unknown or missing keys.

This module imports neither torch nor the planner.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.models import ModelSpec
from exatrain.errors import PlanError, UserError

# Pipeline schedules, named as torch.distributed.pipelining implements them:
#   gpipe        all forwards, then all backwards (ScheduleGPipe)
#   1f1b         one-forward-one-backward (Schedule1F1B; Narayanan et al. 2021, Sec. 2.2.1)
#   interleaved  interleaved 1F1B over `interleave` virtual stages per rank (ScheduleInterleaved1F1B)
#   zero_bubble  interleaved zero bubble: backward split into input- and weight-gradient passes
#                (ScheduleInterleavedZeroBubble; Qi et al. 2023, "Zero Bubble Pipeline Parallelism")
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zero_bubble")
# The pipeline schedules each runtime runs: Megatron-Core 1F1B and interleaved 1F1B
# (megatron/core/pipeline_parallel/schedules.py get_forward_backward_func); Megatron-DeepSpeed 1F1B, DeepSpeed's
# pipeline engine's TrainSchedule (deepspeed/runtime/pipe/schedule.py), no virtual stages; torchtitan and
# exatrain every schedule of torch.distributed.pipelining (torchtitan's pipeline_parallel_schedule).
SCHEDULE_RUNTIMES = {"gpipe": ("torchtitan", "exatrain"),
                     "1f1b": ("megatron-core", "megatron-deepspeed", "torchtitan", "exatrain"),
                     "interleaved": ("megatron-core", "torchtitan", "exatrain"),
                     "zero_bubble": ("torchtitan", "exatrain")}
# Activation recomputation (Korthikanti et al. 2022): none, selective (attention core only), full.
RECOMPUTE = ("none", "selective", "full")
DTYPES = ("float32", "bfloat16")
# Engines a plan can be made for (accounting.engines holds each one's profile) and FP8 GEMM scaling
# recipes (accounting.fp8): names only here, so that the rules can check them without the accounting.
RUNTIMES = ("megatron-core", "megatron-deepspeed", "torchtitan", "exatrain", "llm-foundry")


def listed(items) -> str:
    """"a", "a and b", "a, b and c"."""
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def trainer_cannot_build(model: Any) -> str:
    """The line a plan for exatrain's own trainer (``--runtime exatrain``) gets when its model has what the trainer
    does not build yet (``ModelSpec.unbuilt_by_trainer``); "" when the trainer builds it."""
    missing = model.unbuilt_by_trainer
    if not missing:
        return ""
    return (f"exatrain's own trainer does not build {model.name} yet ({listed(missing)}): these figures are "
            f"for a run it cannot make; plan the engine that will run it (--runtime "
            f"{', '.join(r for r in RUNTIMES if r != 'exatrain')})")


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
    return (f"runtime megatron-core, the default for {model.name}: exatrain's own trainer does not build it yet "
            f"({listed(missing)}); name the engine that will run it with --runtime")
FP8_RECIPES = ("delayed", "current", "block", "mxfp8")
# What Megatron-Core's selective recomputation reruns (Plan.recompute_modules; its --recompute-modules, read only
# under --recompute-granularity selective; megatron/core/transformer/transformer_config.py recompute_modules, default
# ["core_attn"]): "core_attn" the attention core; "layernorm" the norms that stand alone (a MoE layer's pre-MLP norm,
# latent attention's input norm: Transformer Engine's layer spec fuses the others into the next GEMM, where there is
# nothing to rerun); "moe_act" the routed experts' activation; "mla_up_proj" latent attention's up-projections and
# rotary; "mlp" a dense layer's whole MLP (its fused norm included; not a MoE layer's); "shared_experts" the shared
# experts; "moe" the whole MoE layer (its router, all-to-alls and experts). The first three and "mla_up_proj"
# discard their outputs and rerun them before the backward needs them; the others keep only their inputs. Pricing:
# accounting.memory.layer_activation_bytes (what each drops), cost.experts.module_rerun_s (what each reruns).
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
        raise UserError(f"--recompute-modules: unknown module {unknown[0]!r}; choose among "
                        f"{', '.join(RECOMPUTE_MODULES)}")
    return tuple(n for n in RECOMPUTE_MODULES if n in names)
# How a MoE layer's tokens reach their experts (cost.experts.a2a_time_s): "alltoall" sends every routed
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
CP_COMM_RUNTIMES = {"megatron-core": ("p2p", "a2a", "all_gather"), "megatron-deepspeed": ("a2a",),
                    "torchtitan": ("all_gather", "p2p"), "exatrain": ("all_gather",)}
CP_COMMS_WITHOUT_WINDOWS = {"megatron-core": ("p2p",)}
# Those that do not run attention sinks (a learned softmax logit per head, ModelSpec.attention_sinks): Transformer
# Engine runs a softmax other than the vanilla one under context parallelism only through its fused attention with
# cp_comm_type "a2a" (dot_product_attention/utils.py get_attention_backend: flash attention takes no such softmax,
# the fused one only with a2a under CP, the unfused one no CP at all).
CP_COMMS_WITHOUT_SINKS = {"megatron-core": ("p2p", "all_gather")}


def cp_comm_for(runtime: str, chosen: str = "", model: Any = None) -> str:
    """The context-parallel exchange ``runtime`` runs: ``chosen`` (a plan's --cp-comm) if it offers it, else its
    first that runs ``model`` (one with sliding windows or attention sinks needs an exchange that runs them), else
    its first. A one-line UserError for a way it does not offer."""
    offered = CP_COMM_RUNTIMES.get(runtime, ("p2p",))
    if chosen:
        if chosen not in CP_COMMS:
            raise UserError(f"--cp-comm must be one of {', '.join(CP_COMMS)}, got {chosen!r}")
        if chosen not in offered:
            raise UserError(f"--cp-comm {chosen}: {runtime} does not run context parallelism that way; it offers "
                            f"{', '.join(offered)}")
        return chosen
    unable = cp_comms_unable(runtime, model)
    return next((c for c in offered if c not in unable), offered[0])


def cp_comms_unable(runtime: str, model: Any) -> dict[str, str]:
    """The context-parallel exchanges of ``runtime`` that cannot run ``model``, each with what it lacks
    (sliding-window attention, attention sinks)."""
    lacks: dict[str, list[str]] = {}
    for table, attr, what in ((CP_COMMS_WITHOUT_WINDOWS, "sliding_window", "sliding-window attention"),
                              (CP_COMMS_WITHOUT_SINKS, "attention_sinks", "attention sinks")):
        if getattr(model, attr, 0):
            for c in table.get(runtime, ()):
                lacks.setdefault(c, []).append(what)
    return {c: listed(whats) for c, whats in lacks.items()}
# How evenly a MoE layer's routed tokens land on the expert ranks (cost.experts.moe_load): dropless routing
# (the default) lets the busiest expert rank take more than the mean (cost.experts.LOAD_IMBALANCE, an
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
CROSS_ENTROPY_RUNTIMES = {"upcast": ("torchtitan", "exatrain", "llm-foundry"),
                          "inplace": ("megatron-core", "megatron-deepspeed"),
                          "fused": ("torchtitan", "llm-foundry")}  # the runtimes that run each
# The dtype a bfloat16 run accumulates and reduces its gradients in (EngineProfile.grad_accum_dtype,
# EngineProfile.with_grad_accum): "float32" (Megatron-Core's default; DeepSpeed's BF16_Optimizer,
# data_types.grad_accum_dtype "fp32"; torchtitan's and exatrain's only) or "bfloat16" (DeepSpeed's default;
# Megatron-Core --grad-reduce-in-bf16). Which an engine offers, and at which ZeRO stages, is its profile's state
# table; a plan that names none runs its runtime's own.
GRAD_ACCUM = ("float32", "bfloat16")
# the runtimes that offer each
GRAD_ACCUM_RUNTIMES = {"float32": ("megatron-core", "megatron-deepspeed", "torchtitan", "exatrain", "llm-foundry"),
                       "bfloat16": ("megatron-core", "megatron-deepspeed", "llm-foundry")}
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
PLAN_VERSION = 1


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of parallelism. Rank order is tp fastest, then dp, then pp (Megatron's order),
    so a tp group is ``tp`` consecutive ranks and a dp group strides by ``tp``.

    ``ep`` (expert parallelism) adds no ranks: the routed experts of a MoE layer are split over ep
    ranks, experts/ep whole experts each (expert-tensor-parallel size 1: experts are not split over
    tp), and replicated over the edp = tp*cp*dp/ep expert-data-parallel ranks that hold the same
    ones, which reduce their gradients and shard their states; everything else is replicated or
    sharded over dp (times cp) as in a dense model. Where the ep group lies:

    * ep divides dp (every runtime): ep consecutive dp ranks (dp rank = edp_rank' * ep + ep_rank),
      strided by tp*cp, each of them with its tp*cp ranks; the edp group is those tp*cp ranks of the
      dp/ep dp ranks ep*tp*cp apart. exatrain's trainer builds this mesh (trainer/parallel/mesh.py),
      and the cost model prices every ep | dp layout this way (Megatron-Core with etp 1 would place
      even these groups as below, on ranks no farther apart: the strided span is the wider one).
    * ep wider than dp (runtime megatron-core, ep any divisor of tp*cp*dp; torchtitan when tp*cp
      divides ep): Megatron-Core's "MoE parallel folding" (megatron/core/parallel_state.py
      initialize_model_parallel) lays the expert layers' ranks out as its own etp x ep x edp x pp grid
      of the same world, order tp-cp-ep-dp-pp with etp 1: within a pipeline stage's tp*cp*dp ranks
      (numbered tp fastest, then cp, then dp), rank = edp_rank * ep + ep_rank. The ep group is ep
      consecutive ranks, so it takes in the tp (and cp) ranks; the edp group is the tp*cp*dp/ep ranks
      ep apart. Each tp rank dispatches its own s/tp tokens, so this needs sequence parallelism when
      tp > 1 (as Megatron-LM requires for MoE). exatrain's trainer refuses it (rules, scope "trainer").

    ``cp`` (context parallelism) splits every sequence over ``cp`` ranks and does add ranks: the
    order is tp fastest, then cp, then dp, then pp (Megatron-Core's tp-cp-dp-pp), so a cp group is
    ``cp`` ranks strided by ``tp``. Weights are replicated over cp as over dp, and gradients are
    reduced over dp x cp."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    cp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp


@dataclass(frozen=True)
class TrainShape:
    """Batch sizes in sequences. ``global_batch`` = micro_batch * dp * num_microbatches."""

    micro_batch: int = 1
    global_batch: int = 1


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes held by one rank at its peak, by kind (see the accounting for the conventions)."""

    weights: float = 0.0
    gradients: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0
    other: float = 0.0

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.other

    def to_dict(self) -> dict[str, float]:
        d = dataclasses.asdict(self)
        d["total"] = self.total
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "MemoryBreakdown":
        return cls(**{k: float(data[k]) for k in ("weights", "gradients", "optimizer",
                                                   "activations", "other") if k in data})


@dataclass(frozen=True)
class TimeBreakdown:
    """Seconds per optimizer step. ``step`` is the total; the rest are its exposed parts, which add
    up to it: compute (busy time of the busiest rank), bubble (pipeline idle), exposed communication
    of each kind, the optimizer update, and other fixed per-step work (data, logging, launches)."""

    step: float
    compute: float
    bubble: float = 0.0
    tp_comm: float = 0.0
    pp_comm: float = 0.0
    dp_comm: float = 0.0
    optimizer: float = 0.0
    other: float = 0.0
    ep_comm: float = 0.0  # expert all-to-all (mixture of experts), exposed
    cp_comm: float = 0.0  # context-parallel K,V exchange, exposed

    def to_dict(self) -> dict[str, float]:
        d = dataclasses.asdict(self)
        for k in ("ep_comm", "cp_comm"):  # only where a plan has them, so dense plans' JSON stays as it was
            if not d[k]:
                del d[k]
        return d


@dataclass(frozen=True)
class StepEstimate:
    """What the planner predicts for a plan: memory per stage, and (when a cost model ran) time."""

    params: int  # whole model
    params_by_stage: tuple[int, ...]  # held by one rank of each pipeline stage (after TP)
    memory_bytes: MemoryBreakdown  # the worst stage
    memory_by_stage: tuple[MemoryBreakdown, ...]
    capacity_bytes: int
    fits: bool
    model_flops_per_step: float = 0.0  # whole job, one optimizer step (Korthikanti Eq. 7)
    hardware_flops_per_step: float = 0.0  # including recomputation
    comm_bytes: Mapping[str, float] = field(default_factory=dict)  # per rank per step: tp, pp, dp
    time_s: TimeBreakdown | None = None
    tokens_per_s: float | None = None
    model_tflops_per_gpu: float | None = None
    mfu: float | None = None
    hardware_tflops_per_gpu: float | None = None
    hfu: float | None = None
    traced_memory_bytes: MemoryBreakdown | None = None
    # What exatrain's own trainer keeps today (accounting.trainer_memory), worst stage and per stage;
    # memory_bytes above is the lean reference (Megatron-LM's tensors), which `fits` judges.
    trainer_memory_bytes: MemoryBreakdown | None = None
    trainer_memory_by_stage: tuple[MemoryBreakdown, ...] = ()
    notes: tuple[str, ...] = ()
    # Where the step is likely to land (planner/band.py): [low, high] seconds and tokens/s from the
    # out-of-sample error of published runs, and which cell of that table (engine, family, n) it is.
    step_range_s: tuple[float, float] | None = None
    tokens_per_s_range: tuple[float, float] | None = None
    band: Mapping[str, Any] | None = None
    # The whole run at a token budget (planner/time_to_train.py): steps, days, GPU-hours, energy and cost,
    # each with the band's low and high; None unless a token budget was given.
    time_to_train: Mapping[str, Any] | None = None
    # Whether the worst stage fits (planner/memory_band.py): "fits", "tight" (capacity inside the band of its
    # measured peak) or "does not fit" (capacity below the band), and that band; ``fits`` is "not does not fit".
    # Left "" (files written before the verdict existed, estimates without a band) it is taken from ``fits``
    # on construction, so a saved and reloaded estimate equals the one saved.
    memory_verdict: str = ""
    memory_band: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.memory_verdict:
            object.__setattr__(self, "memory_verdict", "fits" if self.fits else "does not fit")

    def replace(self, **changes: Any) -> "StepEstimate":
        return dataclasses.replace(self, **changes)

    @property
    def verdict(self) -> str:
        """"fits", "tight" or "does not fit" (an estimate without a band: "fits" or "does not fit" from ``fits``)."""
        return self.memory_verdict

    @property
    def trainer_fits(self) -> bool | None:
        if self.trainer_memory_bytes is None:
            return None
        return self.trainer_memory_bytes.total <= self.capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": self.params,
            "params_by_stage": list(self.params_by_stage),
            "memory_bytes": self.memory_bytes.to_dict(),
            "memory_by_stage": [m.to_dict() for m in self.memory_by_stage],
            "capacity_bytes": self.capacity_bytes,
            "fits": self.fits,
            "model_flops_per_step": self.model_flops_per_step,
            "hardware_flops_per_step": self.hardware_flops_per_step,
            "comm_bytes": dict(self.comm_bytes),
            "time_s": None if self.time_s is None else self.time_s.to_dict(),
            "tokens_per_s": self.tokens_per_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu,
            "hfu": self.hfu,
            "traced_memory_bytes": (None if self.traced_memory_bytes is None
                                    else self.traced_memory_bytes.to_dict()),
            "trainer_memory_bytes": (None if self.trainer_memory_bytes is None
                                     else self.trainer_memory_bytes.to_dict()),
            "trainer_memory_by_stage": [m.to_dict() for m in self.trainer_memory_by_stage],
            "trainer_fits": self.trainer_fits,
            "notes": list(self.notes),
            **({"step_range_s": list(self.step_range_s), "tokens_per_s_range": list(self.tokens_per_s_range or ()),
                "band": dict(self.band or {})} if self.step_range_s is not None else {}),
            **({"time_to_train": dict(self.time_to_train)} if self.time_to_train is not None else {}),
            "memory_verdict": self.verdict,
            **({"memory_band": dict(self.memory_band)} if self.memory_band is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StepEstimate":
        t = d.get("time_s")
        tm = d.get("traced_memory_bytes")
        trm = d.get("trainer_memory_bytes")
        return cls(
            params=int(d["params"]),
            params_by_stage=tuple(int(x) for x in d.get("params_by_stage", ())),
            memory_bytes=MemoryBreakdown.from_dict(d["memory_bytes"]),
            memory_by_stage=tuple(MemoryBreakdown.from_dict(m) for m in d.get("memory_by_stage", ())),
            capacity_bytes=int(d["capacity_bytes"]),
            fits=bool(d["fits"]),
            model_flops_per_step=float(d.get("model_flops_per_step", 0.0)),
            hardware_flops_per_step=float(d.get("hardware_flops_per_step", 0.0)),
            comm_bytes={k: float(v) for k, v in (d.get("comm_bytes") or {}).items()},
            time_s=None if t is None else TimeBreakdown(**{k: float(v) for k, v in t.items()}),
            tokens_per_s=d.get("tokens_per_s"),
            model_tflops_per_gpu=d.get("model_tflops_per_gpu"),
            mfu=d.get("mfu"),
            hardware_tflops_per_gpu=d.get("hardware_tflops_per_gpu"),
            hfu=d.get("hfu"),
            traced_memory_bytes=None if tm is None else MemoryBreakdown.from_dict(tm),
            trainer_memory_bytes=None if trm is None else MemoryBreakdown.from_dict(trm),
            trainer_memory_by_stage=tuple(MemoryBreakdown.from_dict(m) for m in d.get("trainer_memory_by_stage", ())),
            notes=tuple(d.get("notes", ())),
            step_range_s=_pair(d.get("step_range_s")),
            tokens_per_s_range=_pair(d.get("tokens_per_s_range")),
            band=dict(d["band"]) if isinstance(d.get("band"), Mapping) else None,
            time_to_train=dict(d["time_to_train"]) if isinstance(d.get("time_to_train"), Mapping) else None,
            memory_verdict=_verdict(d.get("memory_verdict")),
            memory_band=dict(d["memory_band"]) if isinstance(d.get("memory_band"), Mapping) else None,
        )


def _verdict(v: Any) -> str:
    """A stored memory verdict ("" when absent: files written before it existed)."""
    if v in (None, ""):
        return ""
    if v not in ("fits", "tight", "does not fit"):
        raise ValueError(f"memory_verdict must be fits, tight or does not fit, got {v!r}")
    return str(v)


def _pair(v: Any) -> tuple[float, float] | None:
    """A [low, high] pair from JSON (None when absent: plans written before ranges existed)."""
    return None if v is None else (float(v[0]), float(v[1]))


def balanced_split(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per (virtual) stage as even as possible. Leftover layers go to the middle stages
    first, because the first stage also holds the embedding and the last the head and the loss."""
    if stages <= 0 or layers < stages:
        raise PlanError(f"cannot split {layers} layers into {stages} pipeline stages: "
                        "every stage needs at least one layer; lower pp or interleave")
    base, extra = divmod(layers, stages)
    order = list(range(1, stages - 1)) + [0, stages - 1] if stages > 2 else list(range(stages))
    counts = [base] * stages
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)


@dataclass(frozen=True)
class Plan:
    """One layout for one model. Construct, then ``validate()``; or ``Plan.load(path)``."""

    model: ModelSpec
    dims: ParallelDims = ParallelDims()
    shape: TrainShape = TrainShape()
    zero_stage: int = 0  # 0 = plain data parallel (DDP), 1 = optimizer states sharded, 2 = + grads, 3 = + weights
    recompute: str = "none"
    sequence_parallel: bool = False
    schedule: str = "1f1b"
    interleave: int = 1  # virtual pipeline stages per rank
    stage_layers: tuple[int, ...] = ()  # layers per virtual stage in model order; () = balanced_split
    dtype: str = "bfloat16"
    flash_attention: bool = True
    cluster: str = ""  # name of the cluster the plan was made for ("" = unspecified)
    # The engine that will run the plan (RUNTIMES): what it keeps in memory
    # and what it overlaps. exatrain's own trainer unless the user names another.
    runtime: str = "exatrain"
    fp8: str = ""  # FP8 GEMM scaling recipe (FP8_RECIPES), "" = no FP8 GEMMs
    moe_dispatcher: str = "alltoall"  # MOE_DISPATCHERS: how a MoE layer's tokens travel to their experts
    moe_capacity_factor: float = 0.0  # token-drop capacity, padded (see above); 0 = dropless
    moe_force_balance: bool = False  # routing forced even (see above)
    fp8_param_gather: bool = False  # FP8 GEMM weights kept and gathered in FP8 (see FP8_PARAM_GATHER_RUNTIMES)
    attention_kernel: str = ""  # ATTENTION_KERNELS: flash attention's kernel, "" = the runtime's own
    elementwise: str = ""  # ELEMENTWISE: how the element-wise ops run, "" = the runtime's own
    cross_entropy: str = ""  # CROSS_ENTROPY: how the loss runs over the logits, "" = the runtime's own
    grad_accum: str = ""  # GRAD_ACCUM: the dtype bf16 gradients accumulate and reduce in, "" = the runtime's own
    grad_accum_fusion: str = ""  # GRAD_ACCUM_FUSION: accumulated inside the GEMMs or not, "" = the runtime's own
    adam_kernel: str = ""  # ADAM_KERNELS: the optimizer step's Adam kernel, "" = the runtime's own
    # How attention's operands travel under cp > 1 (plan.CP_COMMS: p2p ring, all_gather, a2a),
    # "" = the runtime's own for the model (EngineProfile.cp_exchange)
    cp_comm: str = ""
    # What selective recomputation reruns, by Megatron-Core module (RECOMPUTE_MODULES); () = the runtime's own
    # (the attention core; torchtitan's per-op policy)
    recompute_modules: tuple[str, ...] = ()
    # Layers of each (virtual) stage a full recomputation covers, the first ones (RECOMPUTE_LAYERS_RUNTIMES);
    # 0 = every layer
    recompute_layers: int = 0
    # Every Nth layer of a rank recomputed whole under full recomputation (RECOMPUTE_EVERY_RUNTIMES); 0 = every layer
    recompute_every: int = 0
    estimate: StepEstimate | None = None

    # ---- derived ---------------------------------------------------------------------------
    @property
    def tp(self) -> int:
        return self.dims.tp

    @property
    def pp(self) -> int:
        return self.dims.pp

    @property
    def dp(self) -> int:
        return self.dims.dp

    @property
    def ep(self) -> int:
        return self.dims.ep

    @property
    def cp(self) -> int:
        return self.dims.cp

    @property
    def gpus(self) -> int:
        return self.dims.world_size

    @property
    def micro_batch(self) -> int:
        return self.shape.micro_batch

    @property
    def global_batch(self) -> int:
        return self.shape.global_batch

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per pipeline per step (each dp replica runs this many)."""
        return self.shape.global_batch // (self.shape.micro_batch * self.dims.dp)

    @property
    def virtual_stages(self) -> int:
        return self.dims.pp * self.interleave

    @property
    def tokens_per_step(self) -> int:
        return self.shape.global_batch * self.model.seq_len

    @property
    def label(self) -> str:
        """The layout as every table, picture and log spells it: "tp4·pp16·dp2" ("·cp2", "·ep8"
        follow when those are used)."""
        extra = "".join(f"·{name}{n}" for name, n in (("cp", self.cp), ("ep", self.ep)) if n != 1)
        return f"tp{self.tp}·pp{self.pp}·dp{self.dp}{extra}"

    @property
    def schedule_label(self) -> str:
        """The pipeline schedule as it is spelled everywhere: "1f1b", "interleaved×2"; a single
        stage runs no schedule: "no pipeline"."""
        if self.pp == 1:
            return "no pipeline"
        return self.schedule + (f"×{self.interleave}" if self.interleave > 1 else "")

    @property
    def recompute_label(self) -> str:
        """The recomputation as a table spells it: "none", "selective", "full", or for a full one that covers
        some layers "full 3/stage" (the first 3 of each stage) or "full 1/2" (one layer in 2)."""
        if self.recompute == "full" and self.recompute_layers:
            return f"full {self.recompute_layers}/stage"
        if self.recompute == "full" and self.recompute_every:
            return f"full 1/{self.recompute_every}"
        return self.recompute

    @property
    def settings_label(self) -> str:
        """The run settings a plan was priced with that are not the defaults, as the one-line
        descriptions append them (", deepep dispatcher, force-balanced routing, attention fa2"); ""
        when all are defaults."""
        parts = (
            (self.moe_dispatcher != "alltoall", f"{self.moe_dispatcher} dispatcher"),
            (self.moe_capacity_factor, f"token drop at capacity {self.moe_capacity_factor:g}, padded"),
            (self.moe_force_balance and not self.moe_capacity_factor, "force-balanced routing"),
            (self.fp8_param_gather, "FP8 parameter gather"),
            (self.attention_kernel, f"attention {self.attention_kernel}"),
            (self.elementwise, f"element-wise {self.elementwise}"),
            (self.cross_entropy, f"cross-entropy {self.cross_entropy}"),
            (self.grad_accum, f"{self.grad_accum} gradients"),
            (self.grad_accum_fusion, f"gradient-accumulation fusion {self.grad_accum_fusion}"),
            (self.adam_kernel, f"{self.adam_kernel} Adam"),
            (self.cp_comm, f"cp {self.cp_comm}"),
            (self.recompute_modules, f"recompute modules {','.join(self.recompute_modules)}"),
            (self.recompute_layers, f"the first {self.recompute_layers} layers of each stage recomputed"),
            (self.recompute_every, f"one layer in {self.recompute_every} recomputed"),
        )
        return "".join(f", {text}" for on, text in parts if on)

    def recomputed_layers_of_rank(self, pp_rank: int) -> int:
        """Layers of pipeline rank ``pp_rank`` that recomputation reruns whole: under full recomputation all of them,
        or those ``recompute_layers`` / ``recompute_every`` pick (``full_rerun_layers``); else none."""
        if self.recompute != "full":
            return 0
        rerun = full_rerun_layers(self.layers_per_stage(), self.pp, self.recompute_layers, self.recompute_every)
        return int(sum(rerun[v] for v in self.stages_of_rank(pp_rank)))

    def layers_per_stage(self) -> tuple[int, ...]:
        """Layers of each virtual stage, in model order (length pp * interleave)."""
        return self.stage_layers or balanced_split(self.model.layers, self.virtual_stages)

    def stages_of_rank(self, pp_rank: int) -> tuple[int, ...]:
        """Virtual stages held by pipeline rank ``pp_rank``: looped placement, stage k on rank k % pp
        (the placement of interleaved 1F1B and interleaved zero bubble)."""
        return tuple(range(pp_rank, self.virtual_stages, self.dims.pp))

    def with_estimate(self, estimate: StepEstimate | None) -> "Plan":
        return dataclasses.replace(self, estimate=estimate)

    def replace(self, **changes: Any) -> "Plan":
        return dataclasses.replace(self, **changes)

    # ---- validation --------------------------------------------------------------------------
    def validate(self, cluster: ClusterSpec | None = None) -> "Plan":
        """Raise PlanError (``rules.RuleError``) naming the first rule the plan breaks and its fix
        (``exatrain.rules``, the one list the search and the trainer use too); return self when the
        plan can run."""
        from exatrain import rules

        rules.check(self, cluster)
        return self

    # ---- JSON --------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": PLAN_VERSION,
            "model": self.model.to_dict(),
            "cluster": self.cluster,
            "gpus": self.gpus,
            "tp": self.dims.tp,
            "pp": self.dims.pp,
            "dp": self.dims.dp,
            **({"ep": self.dims.ep} if self.dims.ep != 1 else {}),
            **({"cp": self.dims.cp} if self.dims.cp != 1 else {}),
            "micro_batch": self.shape.micro_batch,
            "global_batch": self.shape.global_batch,
            "num_microbatches": self.num_microbatches,
            "zero_stage": self.zero_stage,
            "recompute": self.recompute,
            "sequence_parallel": self.sequence_parallel,
            "schedule": self.schedule,
            "interleave": self.interleave,
            "stage_layers": list(self.layers_per_stage()),
            "dtype": self.dtype,
            "flash_attention": self.flash_attention,
            **({"runtime": self.runtime} if self.runtime != "exatrain" else {}),
            **({"fp8": self.fp8} if self.fp8 else {}),
            **({"moe_dispatcher": self.moe_dispatcher} if self.moe_dispatcher != "alltoall" else {}),
            **({"moe_capacity_factor": self.moe_capacity_factor} if self.moe_capacity_factor else {}),
            **({"moe_force_balance": True} if self.moe_force_balance else {}),
            **({"fp8_param_gather": True} if self.fp8_param_gather else {}),
            **({"attention_kernel": self.attention_kernel} if self.attention_kernel else {}),
            **({"elementwise": self.elementwise} if self.elementwise else {}),
            **({"cross_entropy": self.cross_entropy} if self.cross_entropy else {}),
            **({"grad_accum": self.grad_accum} if self.grad_accum else {}),
            **({"grad_accum_fusion": self.grad_accum_fusion} if self.grad_accum_fusion else {}),
            **({"adam_kernel": self.adam_kernel} if self.adam_kernel else {}),
            **({"cp_comm": self.cp_comm} if self.cp_comm else {}),
            **({"recompute_modules": list(self.recompute_modules)} if self.recompute_modules else {}),
            **({"recompute_layers": self.recompute_layers} if self.recompute_layers else {}),
            **({"recompute_every": self.recompute_every} if self.recompute_every else {}),
            "estimate": None if self.estimate is None else self.estimate.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "plan") -> "Plan":
        if not isinstance(d, Mapping):
            raise UserError(f"{source}: a plan must be a JSON object")
        if "plan" in d and isinstance(d["plan"], Mapping) and "model" not in d:
            d = d["plan"]  # accept `estimate --json` / `search --json` entries, whose plan is nested
        required = ("model", "tp", "pp", "dp", "micro_batch", "global_batch", "zero_stage",
                    "recompute", "sequence_parallel", "schedule", "interleave")
        optional = ("version", "cluster", "gpus", "num_microbatches", "stage_layers", "dtype",
                    "flash_attention", "estimate", "ep", "cp", "runtime", "fp8", "moe_dispatcher",
                    "moe_capacity_factor", "moe_force_balance", "fp8_param_gather", "attention_kernel",
                    "elementwise", "cross_entropy", "grad_accum", "grad_accum_fusion", "adam_kernel",
                    "cp_comm", "recompute_modules", "recompute_layers", "recompute_every")
        missing = [k for k in required if k not in d]
        if missing:
            raise UserError(f"{source}: missing plan key(s) {', '.join(missing)}")
        unknown = sorted(set(d) - set(required) - set(optional))
        if unknown:
            raise UserError(f"{source}: unknown plan key(s) {', '.join(unknown)}")
        if d.get("version", PLAN_VERSION) != PLAN_VERSION:
            raise UserError(f"{source}: plan version {d.get('version')!r} is not {PLAN_VERSION}")
        if not isinstance(d["model"], Mapping):
            raise UserError(f"{source}: `model` must be an object of model fields")
        try:
            plan = cls(
                model=ModelSpec.from_dict(d["model"], source=f"{source}: model"),
                dims=ParallelDims(tp=d["tp"], pp=d["pp"], dp=d["dp"], ep=d.get("ep", 1), cp=d.get("cp", 1)),
                shape=TrainShape(micro_batch=d["micro_batch"], global_batch=d["global_batch"]),
                zero_stage=d["zero_stage"],
                recompute=d["recompute"],
                sequence_parallel=bool(d["sequence_parallel"]),
                schedule=d["schedule"],
                interleave=d["interleave"],
                stage_layers=tuple(d.get("stage_layers") or ()),
                dtype=d.get("dtype", "bfloat16"),
                flash_attention=bool(d.get("flash_attention", True)),
                cluster=str(d.get("cluster") or ""),
                runtime=str(d.get("runtime", "exatrain")),
                fp8=str(d.get("fp8", "")),
                moe_dispatcher=str(d.get("moe_dispatcher", "alltoall")),
                moe_capacity_factor=d.get("moe_capacity_factor", 0.0),
                moe_force_balance=d.get("moe_force_balance", False),
                fp8_param_gather=d.get("fp8_param_gather", False),
                attention_kernel=str(d.get("attention_kernel", "")),
                elementwise=str(d.get("elementwise", "")),
                cross_entropy=str(d.get("cross_entropy", "")),
                grad_accum=str(d.get("grad_accum", "")),
                grad_accum_fusion=str(d.get("grad_accum_fusion", "")),
                adam_kernel=str(d.get("adam_kernel", "")),
                cp_comm=str(d.get("cp_comm", "")),
                recompute_modules=recompute_modules_of(d.get("recompute_modules")),
                recompute_layers=d.get("recompute_layers", 0),
                recompute_every=d.get("recompute_every", 0),
                estimate=None if d.get("estimate") is None else StepEstimate.from_dict(d["estimate"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{source}: malformed plan ({type(exc).__name__}: {exc})") from None
        plan.validate()
        if plan.stage_layers and plan.stage_layers == balanced_split(plan.model.layers, plan.virtual_stages):
            plan = plan.replace(stage_layers=())  # the default split is stored as "balanced"
        if "gpus" in d and d["gpus"] != plan.gpus:
            raise UserError(f"{source}: gpus {d['gpus']} != tp*cp*pp*dp = {plan.gpus}")
        if "num_microbatches" in d and d["num_microbatches"] != plan.num_microbatches:
            raise UserError(f"{source}: num_microbatches {d['num_microbatches']} != "
                            f"global_batch/(micro_batch*dp) = {plan.num_microbatches}")
        return plan

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def save(self, path: str | Path) -> None:
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        return cls.from_dict(read_json(path), source=str(path))


@dataclass(frozen=True)
class Measured:
    """What a run measured. Times are medians over the steps after warm-up."""

    steps: int
    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float | None = None
    mfu: float | None = None
    peak_memory_bytes: float | None = None  # max over ranks
    peak_memory_by_stage: tuple[float, ...] = ()  # max over the ranks of each pipeline stage
    first_loss: float | None = None
    last_loss: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["peak_memory_by_stage"] = list(self.peak_memory_by_stage)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Measured":
        known = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["peak_memory_by_stage"] = tuple(kw.get("peak_memory_by_stage") or ())
        for k, v in kw.items():  # numbers only (a bool is not one): a TypeError names the field
            values = v if k == "peak_memory_by_stage" else (v,)
            if any(x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))) for x in values):
                raise TypeError(f"measured {k} must be a number, got {v!r}")
        return cls(**kw)


@dataclass(frozen=True)
class RunRecord:
    """One training run: the plan, the prediction made for it, and what was measured.
    Appended as one JSON line to a runs file; read back by calibrate, validate and tune."""

    plan: Plan
    measured: Measured | None
    status: str = "ok"  # ok | failed | oom | timeout | interrupted (stopped by a signal: trainer/health.py)
    device: str = ""  # e.g. "cpu", "NVIDIA H200"
    env: Mapping[str, Any] = field(default_factory=dict)  # torch version, host, backend, date ...
    error: str = ""
    # A failed run: the rank that failed (or hung) first, and where. Keys: rank, tp, pp, dp, step (the step
    # it was running, 1-based), phase, kind (error | signal | hung | interrupted | ...), cause, exit_code, log;
    # a hang adds not_arrived (ranks) and ranks (each rank's last step and phase). None for a run that ended.
    failure: Mapping[str, Any] | None = None
    # Per-rank step times over the straggler windows (trainer/health.py): steps measured, then per rank (in
    # rank order) the mean compute_s and wait_s per step, and the stragglers named. None before one window.
    rank_times: Mapping[str, Any] | None = None

    @property
    def predicted(self) -> StepEstimate | None:
        return self.plan.estimate

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "run_record",
            "plan": self.plan.to_dict(),
            "predicted": None if self.predicted is None else self.predicted.to_dict(),
            "measured": None if self.measured is None else self.measured.to_dict(),
            "status": self.status,
            "device": self.device,
            "env": dict(self.env),
            "error": self.error,
            "failure": None if self.failure is None else dict(self.failure),
            "rank_times": None if self.rank_times is None else dict(self.rank_times),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "run record") -> "RunRecord":
        try:
            plan_d = dict(d["plan"])
            if d.get("predicted") is not None:
                plan_d["estimate"] = d["predicted"]
            return cls(
                plan=Plan.from_dict(plan_d, source=source),
                measured=None if d.get("measured") is None else Measured.from_dict(d["measured"]),
                status=str(d.get("status", "ok")),
                device=str(d.get("device", "")),
                env=dict(d.get("env") or {}),
                error=str(d.get("error", "")),
                failure=_optional_mapping(d.get("failure"), "failure"),
                rank_times=_optional_mapping(d.get("rank_times"), "rank_times"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{source}: malformed run record ({type(exc).__name__}: {exc})") from None


def _optional_mapping(value: Any, key: str) -> dict[str, Any] | None:
    """An optional object field of a record (absent in records written before it existed)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"{key} must be an object or null, got {type(value).__name__}")
    return dict(value)


def append_run_record(path: str | Path, record: RunRecord) -> None:
    """Append one record as a JSON line (one write call, so concurrent appenders do not interleave)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record.to_dict()) + "\n")


def read_run_records(path: str | Path) -> list[RunRecord]:
    """Every RunRecord line of a JSON-lines file (other kinds of lines, e.g. per-step metrics, are
    skipped). Malformed lines are a UserError naming the line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such runs file")
    records = []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read ({exc})") from None
    for lineno, obj in iter_json_lines(path, text):
        if isinstance(obj, dict) and obj.get("kind") == "run_record":
            records.append(RunRecord.from_dict(obj, source=f"{path}:{lineno}"))
    return records


def iter_json_lines(path: Path, text: str, hint: str = ""):
    """(line number, parsed object) of every non-blank line of a JSON-lines text; a line that is
    not JSON is a UserError naming it (``hint`` is added to the message)."""
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except ValueError:
            raise UserError(f"{path}:{lineno}: not a JSON line{hint}") from None


def read_json(path: str | Path) -> Any:
    """The JSON value in ``path``; one UserError line when it is missing, a directory, unreadable or
    not JSON (nesting too deep for the parser included). Callers type-check what it holds."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: is a directory; give a JSON file")
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({str(exc).splitlines()[0][:200]})") from None
    except RecursionError:
        raise UserError(f"{path}: not valid JSON (nested too deeply)") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None


def write_json_atomic(path: str | Path, obj: Any, *, durable: bool = False, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON to ``path`` so that a reader sees the old file or the whole new one.

    The text goes to a temporary file of a unique name in the target's own directory (the same
    filesystem, so the final ``os.replace`` is atomic; POSIX rename(2)), which is removed again if
    anything fails. A directory target is refused (UserError), as is a value JSON cannot hold
    (before any file exists). ``durable`` fsyncs the file and its directory before returning.
    The new file gets the old one's permissions, or the umask's."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: is a directory; give a file name")
    text = json.dumps(obj, indent=indent) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise UserError(f"{path}: cannot write there ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise UserError(f"{path}: cannot write ({exc.strerror or exc})") from None
        raise
    if durable:
        _fsync_dir(path.parent)


def _mode_for(path: Path) -> int:
    """Permission bits for a new ``path``: the existing file's, else 0666 less the umask (mkstemp
    creates its files private)."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (a no-op where directories cannot be opened or synced)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = [
    "DTYPES", "RECOMPUTE", "RECOMPUTE_MODULES", "RECOMPUTE_MODULES_RUNTIMES", "SCHEDULES", "Measured",
    "MemoryBreakdown",
    "ParallelDims", "Plan", "RECOMPUTE_EVERY_RUNTIMES", "RECOMPUTE_LAYERS_RUNTIMES", "full_rerun_layers",
    "recompute_modules_of",
    "RunRecord", "StepEstimate", "TimeBreakdown", "TrainShape", "append_run_record",
    "balanced_split", "read_json", "read_run_records", "write_json_atomic",
]
