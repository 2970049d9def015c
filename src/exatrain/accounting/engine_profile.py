"""The engine profile type: what a training engine keeps in memory on a rank, and what it can overlap.

Four engines run the layouts the planner proposes, and each keeps different copies of the model
states, different activation tensors and different communication buffers. A profile states, as
data with a one-line source each (the engine's own docs or code, or the ZeRO paper), for bf16
(mixed-precision) and float32 training with Adam:

* the bytes per parameter of weights, gradients and optimizer states for each ZeRO stage the
  engine offers, each as ``full + sharded / dp`` (``StateRule``);
* the dtype gradients are accumulated in, communication bucket sizes and the persistent bucket
  buffers they allocate, the ZeRO-3 working set of gathered layers, and an allocator allowance;
* activation rules: dropout masks kept or not, the engine's default attention kernel, what its
  selective recomputation keeps, and its switch for each of exatrain's ``none|selective|full``;
* the communications it can overlap with compute and the switches that turn that on (data for the
  cost model; nothing here reads them yet).

``engines.resolve`` turns a plan's run settings into what the engine runs (``Resolved``: the profile as the
settings vary it, each "the runtime's own" made concrete), which ``accounting.memory.rank_memory`` turns into bytes
per rank and the planner's cost model into seconds. The
``exatrain`` profile is the convention of ``accounting.memory``'s default path: its model states
are the trainer's (fp32 parameters as master weights, ``state_bytes_per_param``, which
``trainer_memory`` also uses), its activations the lean per-layer count; the per-tensor model of
the trainer as it runs today stays in ``accounting.trainer_memory``.

Each engine's numbers are one data module under ``accounting/engine_data/`` (``engine_profile(...)``); its own value
of a run setting, with its source, is the setting's record's (``settings.Setting.engines``), which
``engine_profile`` copies into the fields the accounting reads (``Setting.profile``).

Versions checked: Megatron-LM main (megatron/core, 2026-08), DeepSpeed master (2026-08), Megatron-DeepSpeed
(deepspeedai, 2025-07), torchtitan main (2026-08) and its 2024-12 benchmark commit 9dec370.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from exatrain.layout_arrays import among
from exatrain.accounting.context import CpExchange
from exatrain.accounting.dtypes import COMPUTE_BYTES
from exatrain.errors import UserError
from exatrain.settings import ADAM_BYTES, HALF_DTYPES, SETTINGS, cp_comm_for

COMMS = ("dp_grad_reduce", "dp_param_gather", "tp", "pp_p2p", "ep_a2a")


@dataclass(frozen=True)
class StateRule:
    """Bytes per parameter of one (dtype, ZeRO stage, gradient-accumulation dtype): each kind is
    ``full + sharded / dp`` (``full`` replicated over data parallelism, ``sharded`` split over it)."""

    weights: tuple[float, float]
    gradients: tuple[float, float]
    optimizer: tuple[float, float]
    mode: str  # the engine's name for this configuration
    source: str
    buffer_bytes: float = 0.0  # persistent communication-bucket buffers per rank (bytes, not per parameter)

    def bytes_per_param(self, dp):
        """(weights, gradients, optimizer) bytes per parameter; ``dp`` may be a numpy array."""
        return tuple(full + sharded / dp for full, sharded in (self.weights, self.gradients, self.optimizer))

    def total(self, dp):
        return sum(self.bytes_per_param(dp))


@dataclass(frozen=True)
class ActivationRules:
    """What the engine keeps for backward beyond the layer's tensors (see memory.py)."""

    dropout_masks: bool  # keeps a 1-byte mask per dropout element when the model has dropout
    attention: str  # the engine's default attention kernel: "flash" (no s x s scores) or "math"
    selective: str  # what `selective` keeps: "core_attention" (Korthikanti) or "per_op" (torchtitan)
    recompute: tuple[tuple[str, str], ...]  # exatrain's mode -> the engine's switch
    source: str
    # The fused attention kernel a flash run gets (cost.compute.with_attention_kernel): "fused" (the
    # device's fastest, which its prior describes: cuDNN's on Hopper), "fa2" (FlashAttention-2), or "sdpa"
    # (whatever torch's scaled_dot_product_attention picks: cuDNN on Hopper from torch 2.11, whose bundled
    # cuDNN passes the check_prefer_cudnn_attention gate, aten/src/ATen/native/transformers/cuda/sdp_utils.cpp)
    flash_kernel: str = "sdpa"
    flash_kernel_source: str = ""
    # What a dense layer's SwiGLU keeps for its backward: "eager" (gate, silu(gate), up and their product, 4f a
    # token: the separate ops autograd saves for) or "fused" (one function saving its input, the fc1 output 2f,
    # recomputing silu in its backward, and fc2's input: 3f; accounting.memory.layer_activation_bytes)
    glu: str = "eager"
    glu_source: str = ""


@dataclass(frozen=True)
class Overlap:
    """One communication the engine can overlap with compute (data for the cost model)."""

    comm: str  # one of COMMS
    switch: str
    default_on: bool
    source: str
    # the passes whose collectives it hides (the TP overlap: "both", or "forward" where the backward's stay
    # exposed; a full recomputation's rerun forward is a forward, hidden either way)
    passes: str = "both"
    passes_source: str = ""


@dataclass(frozen=True)
class EngineProfile:
    name: str
    grad_accum_dtype: str  # main-gradient dtype in bf16 training: "float32" | "bfloat16"
    grad_accum_source: str
    states: tuple[tuple[tuple[str, int, str], StateRule], ...]  # ((dtype, zero stage, accum dtype), rule)
    # ZeRO-3 working set: unsharded layers held at once (current + prefetched), extra gathered
    # elements (a prefetch bucket), and bytes per parameter of one layer's unsharded gradient.
    zero3_gathered_layers: int
    zero3_prefetch_elements: float
    zero3_unsharded_grad_bytes: float
    buckets: tuple[tuple[str, str], ...]  # communication bucket sizes, as the engine states them
    bucket_source: str  # where the buckets live (their persistent buffers are StateRule.buffer_bytes)
    allocator_allowance: float  # fraction of the rest (PyTorch's caching allocator in all four)
    activations: ActivationRules
    overlaps: tuple[Overlap, ...]
    # Bytes per parameter of the rank's whole stage held as an unsharded gradient under a pipeline
    # schedule with FSDP (ZeRO-2/3): the gradients accumulate across the micro-batches and are
    # reduce-scattered once, after the last backward (0: the engine reduces as it goes).
    pp_unsharded_grad_bytes: float = 0.0
    pp_unsharded_grad_source: str = ""
    # Whether its sharded-gradient stages (ZeRO-2/3) reduce-scatter after every micro-batch's backward
    # when no pipeline schedule defers it (False: once a step, after the last micro-batch)
    reduce_each_microbatch: bool = False
    reduce_each_microbatch_source: str = ""
    # Whether its sharded stages (ZeRO-2/3) send each gather and reduce-scatter as one collective per wrapped unit
    # (FSDP: every transformer block, plus the root unit holding the embeddings, final norm and head), each call
    # paying the library's fixed and ring latency (cost.dp.engine_dp_collectives); False: one call per step
    collectives_per_unit: bool = False
    collectives_per_unit_source: str = ""
    # How its layers' element-wise ops run unless a plan says (settings.ELEMENTWISE; cost.compute.unfused_extra)
    elementwise_default: str = "fused"
    elementwise_source: str = ""
    # How its loss runs over the logits (settings.CROSS_ENTROPY), and whether compiling the model compiles the
    # loss too ("fused" where its element-wise ops are "fused")
    cross_entropy_default: str = "upcast"
    compiles_loss: bool = False
    cross_entropy_source: str = ""
    # Under sequence parallelism, whether its output layer keeps its input all-gathered over tp for the
    # backward (DTensor's ColwiseParallel from Shard(1)) or only this rank's sequence shard (gathered again
    # in the backward)
    sp_gathered_head_input: bool = False
    sp_head_input_source: str = ""
    # Under sequence parallelism, whether its layers keep the attention's and the MLP's input all-gathered
    # over tp for their weight gradients (DTensor's PrepareModuleInput to Replicate) or their shards
    # (accounting.memory.layer_activation_bytes ``gathered_inputs``)
    sp_gathered_layer_inputs: bool = False
    # The FP8 recipes (settings.FP8_RECIPES) under which its sequence-parallel all-gathers carry the GEMM inputs
    # already cast to FP8, one byte an element (cost.step.stage_times ``fp8_tp_gather``)
    fp8_tp_gather: tuple[str, ...] = ()
    fp8_tp_gather_source: str = ""
    # How a MoE layer runs its local experts' GEMMs: "grouped", one kernel over all of them (torch's
    # grouped_mm), or "per_expert", one GEMM launch per local expert (cost.layer.layer_times): the
    # fixed cost per GEMM call (CostParams.gemm_overhead_s) is paid experts/ep times a layer
    expert_gemms: str = "grouped"
    expert_gemms_source: str = ""
    # How it exchanges attention's operands under context parallelism (accounting.context.CpExchange), the
    # first its default, in the order of settings.CP_COMM_RUNTIMES (which the rules read)
    cp_exchanges: tuple[CpExchange, ...] = ()
    # Bytes moved per parameter of a rank's stage, every micro-batch, to accumulate that micro-batch's
    # gradients outside the weight-gradient GEMMs, by gradient-accumulation dtype of bfloat16 training
    # (cost.step.step_times: a pass over the stage's gradients after each backward); a dtype not listed
    # accumulates inside the GEMMs (Megatron-Core's gradient_accumulation_fusion) or is not priced
    accum_pass_bytes: tuple[tuple[str, float], ...] = ()
    accum_pass_source: str = ""
    # The gradient-accumulation dtypes under which its ZeRO-1 all-reduces the gradients (then all-gathers the
    # updated 16-bit parameters) instead of reduce-scattering them (cost.overlap.engine_collectives)
    allreduce_grads_accum: tuple[str, ...] = ()
    # Where the engine lets a user take the accumulation out of the weight-gradient GEMMs (settings.GRAD_ACCUM_FUSION;
    # "" where it offers no such choice), and whether this variant does (``with_grad_accum_fusion``): then every
    # micro-batch's backward ends in a pass over the stage's gradients that reads each fresh 16-bit weight
    # gradient and reads and writes its accumulator (``accum_pass``)
    accum_fusion_switch: str = ""
    unfused_accum: bool = False
    unfused_accum_source: str = ""
    # Parameter passes of an engine that keeps fp32 parameters and computes under autocast, at the ZeRO stages
    # that keep them whole on the rank (``param_pass_zero``; cost.step.with_parameter_passes): every
    # micro-batch's forward casts each weight a GEMM reads to bf16 (read 4, write 2), a full recomputation's
    # rerun forward casts its blocks' weights again, and the backward casts each weight gradient back to fp32
    # (read 2, write 4) under bfloat16 training; autograd adds each micro-batch's gradient after the first into
    # the fp32 .grad (read 4 + 4, write 4), under either dtype
    autocast_casts: bool = False
    autograd_accum: bool = False
    param_pass_zero: tuple[int, ...] = ()
    param_pass_source: str = ""
    # Under FSDP2 mixed precision (bf16 gathers, fp32 reduction) at the ZeRO stages that shard (``fsdp_pass_zero``):
    # each gather's copies into and out of its buffer, the unsharded bf16 gradients a micro-batch without gradient
    # sync leaves kept in fp32 (the first cast, each later one added in), the reduce-scatter's copies in and out
    fsdp_pass_zero: tuple[int, ...] = ()
    # Bytes per parameter autograd moves adding a micro-batch's gradient into the one kept in .grad, from the second
    # micro-batch on, by gradient-accumulation dtype of bfloat16 training, at the ZeRO stages that keep .grad whole
    # between micro-batches (``later_accum_zero``; cost.step.with_parameter_passes)
    later_accum_bytes: tuple[tuple[str, float], ...] = ()
    later_accum_zero: tuple[int, ...] = ()
    later_accum_source: str = ""
    # The optimizer step's passes around Adam (cost.step.optimizer_seconds), bytes per parameter by (training
    # dtype, gradient-accumulation dtype), as (over the rank's whole stage, over its gradients as it holds them:
    # sharded at ZeRO-2/3, over its optimizer shard): the gradient norm, a clipping that always scales, the
    # gradients' copy into fp32 and the parameters' copy out of the fp32 master weights. A clipping that scales
    # only when the norm exceeds the limit is not priced (it depends on the data); float16's unscaling of the
    # gradients is (its rows), every step.
    step_pass_bytes: tuple[tuple[tuple[str, str], tuple[float, float, float]], ...] = ()
    step_pass_source: str = ""
    # The dtype its gradients accumulate and reduce in under float16 training ("float16": the parameters' own,
    # "float32"), and where its dynamic loss scaling lives: the unscale of the gradients (in step_pass_bytes'
    # float16 rows) and the found-inf all-reduce before the update (cost.step.loss_scaling_s)
    fp16_grad_accum_dtype: str = "float32"
    loss_scale_source: str = ""
    # Its Adam kernel (ADAM_BYTES) unless a plan says (settings.ADAM_KERNELS), the switch a user sets it with ("" where
    # the engine offers none), and whether it runs the fused kernel only over plain tensors on a GPU and the foreach
    # one elsewhere (exatrain: DTensor parameters, ZeRO-1's ZeroRedundancyOptimizer, the CPU)
    adam_default: str = "fused"
    adam_switch: str = ""
    adam_source: str = ""
    adam_fused_only_plain: bool = False
    # FSDP1's FlatParameter (torch.distributed.fsdp, ``flat_param_grad_copy``): every micro-batch's backward builds
    # each wrapped unit's flat gradient from its parameters' views (autograd's split backward concatenates them: read
    # and write the compute dtype, on the compute stream), and the gradient's reduce-scatter is preceded, on FSDP's
    # post-backward stream, by the pre-divide in place (read and write in the reduce dtype) and, where the reduce
    # dtype is not the compute dtype, a cast into it (``reduce_prep``: they lengthen the reduction they feed)
    flat_param_grad_copy: bool = False
    flat_param_source: str = ""
    # The versions of the engine whose defaults this profile prices, and how to plan a run of an older one (an
    # estimate's notes say it: a user of another version changes the settings it names)
    version_assumed: str = ""

    def flat_grad_copy_bytes(self, dtype: str) -> float:
        """Bytes a parameter autograd moves on the compute stream every backward to build an FSDP1 flat gradient from
        its views (read and write in ``dtype``); 0 for an engine without FlatParameters."""
        return 2.0 * COMPUTE_BYTES[dtype] if self.flat_param_grad_copy else 0.0

    def reduce_prep_bytes(self, dtype: str) -> float:
        """Bytes a parameter FSDP1 moves on its post-backward stream before each gradient reduce-scatter when
        training in ``dtype``: the cast into the reduce dtype where it differs (read ``dtype``, write the reduce
        dtype), then the in-place pre-divide (read and write the reduce dtype); 0 for an engine without them."""
        if not self.flat_param_grad_copy:
            return 0.0
        e, r = COMPUTE_BYTES[dtype], COMPUTE_BYTES[self.accum_dtype(dtype)]
        return (e + r if r != e else 0.0) + 2.0 * r

    def later_accum(self, dtype: str, zero):
        """Bytes a parameter autograd moves adding each micro-batch's gradient after the first into .grad when
        training in ``dtype`` at ZeRO stage(s) ``zero`` (a numpy array broadcasts): ``later_accum_bytes`` at the
        stages that keep .grad (``later_accum_zero``), 0 elsewhere or where none is listed."""
        listed = dict(self.later_accum_bytes).get(self.accum_dtype(dtype), 0.0) if dtype in HALF_DTYPES else 0.0
        return np.where(among(zero, self.later_accum_zero), float(listed), 0.0)

    def step_passes(self, dtype: str) -> tuple[float, float, float]:
        """Bytes per parameter of the optimizer step's passes around Adam when training in ``dtype``
        (``step_pass_bytes``): (over the whole stage, over the gradients as held, over the optimizer shard)."""
        return dict(self.step_pass_bytes).get((dtype, self.accum_dtype(dtype)), (0.0, 0.0, 0.0))

    def adam_kernel(self, *, tp=1, ep=1, zero=0, shard=1, on_host: bool = False):
        """The Adam kernel a layout runs (numpy arrays broadcast): ``adam_default``, except where the engine runs
        the fused one only over plain tensors on a GPU (``adam_fused_only_plain``): there tp 1, ep 1 and either
        ZeRO-0 or ZeRO-1 with nothing to shard over, else foreach."""
        tp, ep, zero, shard = np.broadcast_arrays(*(np.asarray(x) for x in (tp, ep, zero, shard)))
        if not self.adam_fused_only_plain:
            return np.full(tp.shape, self.adam_default)
        plain = (tp == 1) & (ep == 1) & ((zero == 0) | ((zero == 1) & (shard == 1)))
        return np.where(plain & (not on_host), "fused", "foreach")

    def with_adam(self, kernel: str) -> "EngineProfile":
        """The same engine running Adam's ``kernel`` (settings.ADAM_KERNELS; torchtitan's
        --optimizer.implementation); "" keeps its own."""
        if not kernel:
            return self
        if kernel not in ADAM_BYTES:
            raise UserError(f"the Adam kernel must be one of {', '.join(ADAM_BYTES)}, got {kernel!r}")
        if not self.adam_switch:
            raise UserError(f"engine {self.name!r} offers no choice of Adam kernel")
        return dataclasses.replace(self, adam_default=kernel)

    def elementwise(self, chosen: str = "") -> str:
        """How a plan of this engine runs its element-wise ops: ``chosen`` (a plan's --elementwise,
        settings.ELEMENTWISE) if given, else the engine's own (``elementwise_default``)."""
        return chosen or self.elementwise_default

    def cross_entropy(self, chosen: str = "", elementwise: str = "") -> str:
        """How a plan of this engine runs its loss over the logits (settings.CROSS_ENTROPY): ``chosen`` (a plan's
        --cross-entropy) if given, else "fused" where the engine compiles its loss with its model and the
        plan's element-wise ops are compiled (``elementwise``, as ``elementwise()`` reads it), else its own
        (``cross_entropy_default``)."""
        if chosen:
            return chosen
        if self.compiles_loss and self.elementwise(elementwise) == "fused":
            return "fused"
        return self.cross_entropy_default

    def gathers_tp_in_fp8(self, fp8: str) -> bool:
        """Whether a plan with FP8 recipe ``fp8`` ("" = none) sends its forward's sequence-parallel
        all-gathers in FP8 under this engine (``fp8_tp_gather``)."""
        return bool(fp8) and fp8 in self.fp8_tp_gather

    def reruns_tp_gathers(self, recompute: str, moe: bool) -> bool:
        """Whether this engine's ``recompute`` reruns the forward's TP all-gathers (all-reduces without SP) in
        the backward without their reduce-scatters: torchtitan's per-op selective policy saves the
        reduce-scatters' outputs, not the all-gathers' (dense layers; cost.step.recomputed)."""
        return recompute == "selective" and self.activations.selective == "per_op" and not moe

    def cp_exchange(self, chosen: str = "", model=None) -> CpExchange | None:
        """How this engine runs context parallelism: the exchange ``settings.cp_comm_for`` picks (``chosen``, a
        plan's --cp-comm, if the engine offers it; else its first that runs ``model``'s sliding windows). A
        one-line UserError where it offers no ``chosen``."""
        if not self.cp_exchanges:  # an engine without context parallelism (the rules refuse cp > 1 for it)
            return None
        comm = cp_comm_for(self.name, chosen, model)
        return next(x for x in self.cp_exchanges if x.comm == comm)

    def attention_kernel(self, chosen: str = "") -> str:
        """The flash-attention kernel a plan of this engine runs: ``chosen`` (a plan's --attention-kernel,
        settings.ATTENTION_KERNELS) if given, else the engine's own (``ActivationRules.flash_kernel``)."""
        return chosen or self.activations.flash_kernel

    def accum_dtype(self, dtype: str) -> str:
        """The dtype its gradients accumulate in when training in ``dtype``: ``grad_accum_dtype`` for
        bfloat16 training, ``fp16_grad_accum_dtype`` for float16, float32 otherwise."""
        return {"bfloat16": self.grad_accum_dtype, "float16": self.fp16_grad_accum_dtype}.get(dtype, "float32")

    def zero_stages(self, dtype: str = "bfloat16") -> tuple[int, ...]:
        accum = self.accum_dtype(dtype)
        return tuple(sorted({z for (d, z, a), _ in self.states if d == dtype and a == accum}))

    def state_rule(self, dtype: str, zero_stage: int) -> StateRule:
        """The rule for ``dtype`` and ``zero_stage`` under this profile's gradient dtype."""
        accum = self.accum_dtype(dtype)
        for key, rule in self.states:
            if key == (dtype, int(zero_stage), accum):
                return rule
        offered = ", ".join(str(z) for z in self.zero_stages(dtype)) or "none"
        raise UserError(
            f"engine {self.name!r} has no ZeRO stage {zero_stage} for {dtype} training with "
            f"{accum} gradients (it offers ZeRO stages {offered})"
        )

    def state_bytes(self, dtype: str, zero_stage: int, dp):
        """(weights, gradients, optimizer) bytes per parameter; ``dp`` may be a numpy array."""
        return self.state_rule(dtype, zero_stage).bytes_per_param(dp)

    def buffer_bytes(self, dtype: str, zero_stage: int) -> float:
        """Persistent communication-bucket bytes per rank."""
        return self.state_rule(dtype, zero_stage).buffer_bytes

    def overlap(self, comm: str) -> Overlap | None:
        return next((o for o in self.overlaps if o.comm == comm), None)

    def recompute_switch(self, mode: str) -> str | None:
        return dict(self.activations.recompute).get(mode)

    def accum_pass(self, dtype: str) -> float:
        """Bytes a parameter of a rank's stage costs every micro-batch to accumulate its gradient outside
        the GEMMs when training in ``dtype``: unfused (``unfused_accum``), the fresh gradient read in ``dtype``
        plus the accumulator read and written in its dtype (``accum_dtype``): 2 + 2 x 4 = 10 bytes into fp32
        main gradients of bf16 training; else the engine's own pass (``accum_pass_bytes``); 0 where none is
        listed."""
        if self.unfused_accum:
            return float(COMPUTE_BYTES[dtype] + 2 * COMPUTE_BYTES[self.accum_dtype(dtype)])
        return float(dict(self.accum_pass_bytes).get(self.accum_dtype(dtype), 0.0)) if dtype in HALF_DTYPES else 0.0

    def accum_pass_why(self) -> str:
        """Where the bytes of ``accum_pass`` come from, for an estimate's notes."""
        return self.unfused_accum_source if self.unfused_accum else self.accum_pass_source

    def with_grad_accum_fusion(self, fusion: str) -> "EngineProfile":
        """The same engine with its gradient accumulation inside the weight-gradient GEMMs ("on") or outside
        them ("off"; Megatron-Core's --no-gradient-accumulation-fusion); "" keeps its own."""
        if not fusion:
            return self
        if fusion not in ("on", "off"):
            raise UserError(f"gradient-accumulation fusion must be on or off, got {fusion!r}")
        if not self.accum_fusion_switch:
            raise UserError(f"engine {self.name!r} offers no choice of gradient-accumulation fusion")
        return dataclasses.replace(self, unfused_accum=fusion == "off")

    def with_grad_accum(self, dtype: str) -> "EngineProfile":
        """The same engine accumulating bf16-training gradients in ``dtype`` (e.g. Megatron-Core's
        --grad-reduce-in-bf16, DeepSpeed's data_types.grad_accum_dtype)."""
        if not dtype:
            return self
        if dtype not in ("float32", "bfloat16"):
            raise UserError(f"gradient accumulation dtype must be float32 or bfloat16, got {dtype!r}")
        return dataclasses.replace(self, grad_accum_dtype=dtype)


def rule(w, g, o, mode, source, buffer_bytes=0.0) -> StateRule:
    """A StateRule from (full, sharded) pairs of weights, gradients and optimizer bytes per parameter."""
    return StateRule(
        tuple(map(float, w)), tuple(map(float, g)), tuple(map(float, o)), mode, source, float(buffer_bytes)
    )


def engine_profile(**data) -> EngineProfile:
    """An engine's profile from its data module's fields, with each run setting's own value and source copied
    from the setting's record (``Setting.engines``) into the fields it names (``Setting.profile``; "a.b": field b
    of part a)."""
    name, parts = data["name"], {}
    for s in SETTINGS:
        if not s.profile or name not in s.engines:
            continue
        for path, value in zip(s.profile, s.engines[name]):
            head, _, tail = path.rpartition(".")
            (parts.setdefault(head, {}) if head else data)[tail] = value
    for head, values in parts.items():
        data[head] = dataclasses.replace(data[head], **values)
    return EngineProfile(**data)


__all__ = ["ADAM_BYTES", "COMMS", "ActivationRules", "EngineProfile", "Overlap", "StateRule", "engine_profile", "rule"]
