"""Engine profiles: what each training engine keeps in memory on a rank, and what it can overlap.

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

``EngineProfile.resolve`` turns a plan's run settings into what the engine runs (``Resolved``: the profile as the
settings vary it, each "the runtime's own" made concrete), which ``accounting.memory.rank_memory`` turns into bytes
per rank and the planner's cost model into seconds. The
``exatrain`` profile is the convention of ``accounting.memory``'s default path: its model states
are the trainer's (fp32 parameters as master weights, ``state_bytes_per_param``, which
``trainer_memory`` also uses), its activations the lean per-layer count; the per-tensor model of
the trainer as it runs today stays in ``accounting.trainer_memory``.

Versions checked: Megatron-LM main (megatron/core, 2026-08), DeepSpeed master (2026-08),
Megatron-DeepSpeed (deepspeedai, 2025-07), torchtitan main (2026-08) and its 2024-12 benchmark
commit 9dec370.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from exatrain.accounting.context import CpExchange
from exatrain.accounting.dtypes import COMPUTE_BYTES
from exatrain.errors import UserError
from exatrain.accounting.fp8 import Fp8Recipe
from exatrain.accounting.moe import moe_load
from exatrain.settings import HALF_DTYPES, RUNTIMES, SETTINGS, RunSettings, cp_comm_for

# Bytes one AdamW update moves per parameter, by kernel (settings.ADAM_KERNELS). "fused" reads the fp32 parameter,
# gradient, exp_avg and exp_avg_sq and writes the parameter and both moments in one kernel (torch's
# _fused_adamw_; apex's, Transformer Engine's and DeepSpeed's FusedAdam): 7 x 4. "foreach"
# (torch.optim.AdamW(foreach=True), torch/optim/adamw.py _multi_tensor_adamw) runs the update as a chain of
# multi-tensor kernels, each reading and writing fp32 tensors: the weight decay's mul (8), the lerp into exp_avg
# (12), exp_avg_sq's mul (8) and addcmul (16), the denominator's sqrt, div and add (8 each), the addcdiv into the
# parameter (16): 84. Counted on torch by tests/planner/test_optimizer_step.py.
ADAM_BYTES = {"fused": 28.0, "foreach": 84.0}
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
        return np.where(np.isin(zero, self.later_accum_zero), float(listed), 0.0)

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

    def resolve(self, settings: RunSettings, model=None, *, dtype: str = "bfloat16", flash: bool = True) -> "Resolved":
        """What this engine runs for ``settings`` (its runtime's) on ``model``: itself with their gradient
        accumulation, its fusion and Adam kernel (``with_grad_accum``, ``with_grad_accum_fusion``, ``with_adam``), and
        each setting that names nothing made its own (``settings.Setting.own``: element-wise ops, loss, attention
        kernel, cp exchange)."""
        given = settings
        s = given.replace(
            **{
                x.name: x.own(self, given, model)
                for x in SETTINGS
                if x.own is not None and getattr(given, x.name) == x.default
            }
        )
        return Resolved(
            dtype=dtype,
            flash=flash,
            runtime=self.name,
            engine=self.with_grad_accum(s.grad_accum)
            .with_grad_accum_fusion(s.grad_accum_fusion)
            .with_adam(s.adam_kernel),
            elementwise=s.elementwise,
            cross_entropy=s.cross_entropy,
            attention_kernel=s.attention_kernel,
            cp_comm=s.cp_comm,
            cp_exchange=self.cp_exchange(given.cp_comm, model),
            moe_dispatcher=s.moe_dispatcher,
            moe_load=moe_load(s.moe_capacity_factor, s.moe_force_balance),
            fp8=s.fp8,
            fp8_recipe=Fp8Recipe(scaling=s.fp8, fp8_params=s.fp8_param_gather) if s.fp8 else None,
            fp8_param_gather=s.fp8_param_gather,
            fp8_tp_gather=self.gathers_tp_in_fp8(s.fp8),
            selective=self.activations.selective,
            expert_gemms=self.expert_gemms,
            recompute_modules=tuple(s.recompute_modules),
            recompute_every=s.recompute_every,
            settings=s,
        )

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


def _rule(w, g, o, mode, source, buffer_bytes=0.0):
    return StateRule(
        tuple(map(float, w)), tuple(map(float, g)), tuple(map(float, o)), mode, source, float(buffer_bytes)
    )


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
_MCORE_FP32_GRAD = (
    "megatron/training/arguments.py: --bf16 sets accumulate_allreduce_grads_in_fp32 unless --grad-reduce-in-bf16"
)
_MFSDP = "--use-megatron-fsdp --data-parallel-sharding-strategy"
_MFSDP_DOC = (
    "Megatron-LM docs/discussions/megatron-fsdp-user-guide and megatron/core/distributed/fsdp/src/README.md: "
    "optim_grads / optim_grads_params shard the main grads / and the params over dp, with the fp32 main "
    "params and optimizer states"
)
MEGATRON_CORE = EngineProfile(
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
    grad_accum_dtype="float32",
    grad_accum_source=_MCORE_FP32_GRAD,
    states=(
        # bf16 params, fp32 main grads: 18 without, 6 + 12/d with the distributed optimizer.
        (
            ("bfloat16", 0, "float32"),
            _rule(
                (2 + 4, 0),
                (4, 0),
                (8, 0),
                "DDP + Float16OptimizerWithFloat16Params",
                _MCORE_DOC + ": bf16 params, fp32 grads = 18",
            ),
        ),
        (
            ("bfloat16", 1, "float32"),
            _rule(
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
            _rule(
                (2 + 4, 0),
                (2 + 4, 0),
                (8, 0),
                "--grad-reduce-in-bf16",
                _MCORE_DOC + ": 16-bit params, 16-bit grads = 20",
            ),
        ),
        (
            ("bfloat16", 1, "bfloat16"),
            _rule(
                (2, 4),
                (2, 4),
                (0, 8),
                "--use-distributed-optimizer --grad-reduce-in-bf16",
                _MCORE_DOC + ": 16-bit params, 16-bit grads = 4 + 16/d",
            ),
        ),
        # Megatron-FSDP: optim_grads keeps the 16-bit params whole; optim_grads_params shards them too.
        (("bfloat16", 2, "float32"), _rule((2, 4), (0, 4), (0, 8), _MFSDP + " optim_grads", _MFSDP_DOC)),
        (("bfloat16", 3, "float32"), _rule((0, 2 + 4), (0, 4), (0, 8), _MFSDP + " optim_grads_params", _MFSDP_DOC)),
        (
            ("bfloat16", 2, "bfloat16"),
            _rule((2, 4), (0, 2), (0, 8), _MFSDP + " optim_grads --grad-reduce-in-bf16", _MFSDP_DOC),
        ),
        (
            ("bfloat16", 3, "bfloat16"),
            _rule((0, 2 + 4), (0, 2), (0, 8), _MFSDP + " optim_grads_params --grad-reduce-in-bf16", _MFSDP_DOC),
        ),
        # --fp16: fp16 params and main grads (megatron/training/arguments.py sets accumulate_allreduce_grads_in_fp32
        # only for --bf16), fp32 main params and an fp32 copy of the grads in the optimizer: the 16-bit rows above
        (
            ("float16", 0, "float16"),
            _rule((2 + 4, 0), (2 + 4, 0), (8, 0), "--fp16", _MCORE_DOC + ": 16-bit params, 16-bit grads = 20"),
        ),
        (
            ("float16", 1, "float16"),
            _rule(
                (2, 4),
                (2, 4),
                (0, 8),
                "--fp16 --use-distributed-optimizer",
                _MCORE_DOC + ": 16-bit params, 16-bit grads = 4 + 16/d",
            ),
        ),
        (
            ("float32", 0, "float32"),
            _rule((4, 0), (4, 0), (8, 0), "fp32 params", _MCORE_DOC + ": fp32 params, fp32 grads = 16"),
        ),
        (
            ("float32", 1, "float32"),
            _rule(
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
        flash_kernel="fused",
        flash_kernel_source=(
            "Transformer Engine DotProductAttention, attention_backend auto: cuDNN FusedAttention "
            "where eligible (transformer_engine/pytorch/attention backend selection)"
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
    elementwise_default="fused",
    elementwise_source=(
        "Transformer Engine's fused norms (TELayerNormColumnParallelLinear), bias-SwiGLU/GELU "
        "fusion and RoPE fusion, each on unless --no-bias-swiglu-fusion, --no-bias-gelu-fusion, "
        "--no-rope-fusion (megatron/training/arguments.py)"
    ),
    cross_entropy_default="inplace",
    cross_entropy_source=(
        "megatron/core/tensor_parallel/cross_entropy.py _VocabParallelCrossEntropy: "
        "logits.float(), exp and softmax in place, saved, the gradient in place"
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
    adam_source="megatron/core/optimizer/__init__.py: Transformer Engine's FusedAdam, else apex's",
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
MEGATRON_DEEPSPEED = EngineProfile(
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
    accum_pass_bytes=(("float32", 26.0),),
    accum_pass_source=(
        "deepspeed/runtime/pipe/engine.py _exec_backward_pass under BF16_Optimizer (fp32 gradient "
        "accumulation): clear_lp_grads() zeroes the bf16 gradients before each micro-batch's "
        "backward (write 2 bytes), autograd adds the new ones into them (read 2 + 2, write 2), and "
        "update_hp_grads runs hp_grad.add_(lp.grad.to(fp32)) after it (read 2, write 4; read 4 + 4, "
        "write 4): 26 bytes a parameter, every micro-batch (deepspeed/runtime/bf16_optimizer.py)"
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
    grad_accum_dtype="bfloat16",
    grad_accum_source=(
        "deepspeed/runtime/engine.py get_data_types: data_types.grad_accum_dtype defaults to the "
        "model dtype; fp32 selects BF16_Optimizer at ZeRO-1 (_do_optimizer_sanity_check)"
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
            _rule(
                (2, 4),
                (2 + 2, 0),
                (0, 8),
                "stage 0: BF16_Optimizer, bf16 accumulation",
                _BF16_OPT + " (grad_acc_dtype bf16: 6 + 12/d)",
            ),
        ),
        (
            ("bfloat16", 1, "bfloat16"),
            _rule((2, 4), (2, 0), (0, 8), "zero_optimization.stage 1", _ZERO_PAPER + ": P_os = 4 + 12/d", 2 * _BUCKET),
        ),
        (
            ("bfloat16", 2, "bfloat16"),
            _rule(
                (2, 4), (0, 2), (0, 8), "zero_optimization.stage 2", _ZERO_PAPER + ": P_os+g = 2 + 14/d", 2 * _BUCKET
            ),
        ),
        (
            ("bfloat16", 3, "bfloat16"),
            _rule(
                (0, 2 + 4), (0, 2), (0, 8), "zero_optimization.stage 3", _ZERO_PAPER + ": P_os+g+p = 16/d", 2 * _BUCKET
            ),
        ),
        # "fp16": {"enabled": true}: the same states in fp16 (FP16_Optimizer without ZeRO, deepspeed/runtime/fp16/
        # fused_optimizer.py; the ZeRO optimizers with fp16 partitions), the ZeRO paper's mixed-precision Adam
        (("float16", 0, "float16"), _rule((2 + 4, 0), (2, 0), (8, 0), "fp16, no ZeRO", _ZERO_PAPER + ": baseline 16")),
        (
            ("float16", 1, "float16"),
            _rule(
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
            _rule(
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
            _rule(
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
            _rule(
                (2, 4),
                (2 + 4, 0),
                (0, 8),
                "BF16_Optimizer (grad_accum_dtype fp32)",
                "deepspeed/runtime/bf16_optimizer.py fp32_groups_gradients_flat, fp32_groups_flat_partition",
            ),
        ),
        # float32: ZeRO-1/2 clone the fp32 partition as the optimizer's own copy; ZeRO-3 reuses it.
        (("float32", 0, "float32"), _rule((4, 0), (4, 0), (8, 0), "no ZeRO", _ZERO_PAPER + " (fp32: 4 + 4 + 8)")),
        (
            ("float32", 1, "float32"),
            _rule(
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
            _rule(
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
            _rule(
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
        flash_kernel="fa2",
        flash_kernel_source="--use-flash-attn-v2: the flash-attn package's FlashAttention-2 kernels (flash_attn_func)",
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
    elementwise_default="fused",
    elementwise_source=(
        "Megatron's fused kernels: apex FusedLayerNorm / MixedFusedRMSNorm, bias-GELU fusion, "
        "fused scale-mask-softmax (megatron/model/fused_*.py; --no-bias-gelu-fusion turns one off)"
    ),
    cross_entropy_default="inplace",
    cross_entropy_source=(
        "megatron/model/gpt_model.py: vocab_parallel_cross_entropy(output.float(), labels), "
        "Megatron's in-place vocab-parallel loss (mpu/cross_entropy.py)"
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
    adam_source="deepspeed/ops/adam/fused_adam.py FusedAdam (Megatron-DeepSpeed's --optimizer adam)",
)

# ---- torchtitan (FSDP2) -----------------------------------------------------------------------
_TT_MP = (
    "torchtitan/distributed/fsdp.py MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) over fp32 "
    "sharded params; docs/fsdp.md: reshard_after_forward True = ZeRO-3, False = ZeRO-2"
)
TORCHTITAN = EngineProfile(
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
    grad_accum_dtype="float32",
    grad_accum_source=(
        "torchtitan training.mixed_precision_reduce = float32; sharded gradients in the fp32 params' dtype"
    ),
    states=(
        (
            ("bfloat16", 0, "float32"),
            _rule(
                (4 + 2, 0),
                (4, 0),
                (8, 0),
                "DDP (data_parallel_replicate_degree), autocast",
                "torchtitan training.mixed_precision_param: torch.autocast under DDP",
            ),
        ),
        (
            ("bfloat16", 2, "float32"),
            _rule(
                (2, 4),
                (0, 4),
                (0, 8),
                "FSDP2 reshard_after_forward=False",
                _TT_MP + " (PP default, torchtitan get_fsdp_reshard_after_forward_policy)",
            ),
        ),
        (("bfloat16", 3, "float32"), _rule((0, 4), (0, 4), (0, 8), "FSDP2 reshard_after_forward=True", _TT_MP)),
        (("float32", 0, "float32"), _rule((4, 0), (4, 0), (8, 0), "DDP, mixed_precision_param float32", _TT_MP)),
        (("float32", 2, "float32"), _rule((4, 4), (0, 4), (0, 8), "FSDP2 reshard_after_forward=False", _TT_MP)),
        (("float32", 3, "float32"), _rule((0, 4), (0, 4), (0, 8), "FSDP2 reshard_after_forward=True", _TT_MP)),
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
        flash_kernel="sdpa",
        flash_kernel_source="torchtitan's attention: torch.nn.functional.scaled_dot_product_attention",
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
    elementwise_default="eager",
    elementwise_source=(
        "torch.compile is off unless the job config enables it ([compile] enable, "
        "training.compile before 2025; default false): plan a compiled run with --elementwise fused"
    ),
    compiles_loss=True,
    cross_entropy_source=(
        "torchtitan/components/loss.py build_cross_entropy_loss compiles cross_entropy("
        'pred.float(), labels) with the model (since 2025-04; [compile] components "loss"); '
        "before it train.py left the loss eager: plan such a run with --cross-entropy upcast"
    ),
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
    adam_source=(
        "torchtitan/components/optimizer: optimizer.implementation 'fused' by default since 2025-02-24 "
        "(6e49885, 'use Fused AdamW as default'); 'foreach' before (--optimizer.fused off by default)"
    ),
)

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
LLM_FOUNDRY = EngineProfile(
    name="llm-foundry",
    grad_accum_dtype="bfloat16",
    grad_accum_source=(
        _FSDP1_MP + "; a mixed_precision dict with reduce_dtype fp32 reduces in fp32 (--grad-accum float32)"
    ),
    states=tuple(
        ((dtype, zero, accum), rule)
        for accum in ("bfloat16", "float32")
        for dtype, zero, rule in (
            # NO_SHARD: the fp32 parameters, their bf16 copy kept from the forward to the end of the backward
            # (flat_param.py post_reshard: _mp_shard freed at the reshard), fp32 gradients after the cast, Adam.
            ("bfloat16", 0, _rule((4 + 2, 0), (4, 0), (8, 0), "sharding_strategy NO_SHARD", _FSDP1_MP)),
            # SHARD_GRAD_OP keeps each unit's unsharded bf16 parameters from its forward to its backward
            ("bfloat16", 2, _rule((2, 4), (0, 4), (0, 8), "sharding_strategy SHARD_GRAD_OP", _FSDP1_MP)),
            ("bfloat16", 3, _rule((0, 4), (0, 4), (0, 8), "sharding_strategy FULL_SHARD", _FSDP1_MP)),
        )
    )
    + (
        (("float32", 0, "float32"), _rule((4, 0), (4, 0), (8, 0), "NO_SHARD, mixed_precision FULL", _FSDP1_MP)),
        (("float32", 2, "float32"), _rule((4, 4), (0, 4), (0, 8), "SHARD_GRAD_OP, mixed_precision FULL", _FSDP1_MP)),
        (("float32", 3, "float32"), _rule((0, 4), (0, 4), (0, 8), "FULL_SHARD, mixed_precision FULL", _FSDP1_MP)),
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
        flash_kernel="triton",
        flash_kernel_source=(
            "llm-foundry attn_impl: triton in its pretraining YAMLs and submit_benchmarks.py's "
            "default "
            "(llmfoundry/models/layers/flash_attn_triton.py, a copy of flash-attention's Triton "
            "kernel); attn_impl flash runs the flash-attn package installed: --attention-kernel fa2"
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
    flat_param_grad_copy=True,
    flat_param_source=(
        "torch FSDP1 flat_param.py _use_unsharded_views: each parameter is a view of the unit's "
        "FlatParameter made by torch.split, whose backward concatenates the views' gradients into "
        "the flat gradient; _runtime_utils.py _post_backward_hook then, on the post-backward stream, "
        "casts it to the reduce dtype where it differs and _reduce_grad pre-divides it in place "
        "(_div_if_needed by the gradient predivide factor) before reduce_scatter_tensor"
    ),
    elementwise_default="eager",
    elementwise_source=(
        "llm-foundry trains its MPT models eager (no torch.compile in its benchmark runs): "
        "LayerNorm (low_precision_layernorm), GELU and the residual adds a kernel each"
    ),
    cross_entropy_default="fused",
    cross_entropy_source=(
        "llmfoundry/models/mpt/modeling_mpt.py: loss_fn 'fused_crossentropy' by default, "
        "flash-attn's CrossEntropyLoss (the xentropy CUDA kernel over the 16-bit logits); "
        "loss_fn torch_crossentropy runs torch's: --cross-entropy upcast"
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
        "--attention-kernel fa2; later llm-foundry (FSDP2, tensor parallelism, torch.compile) is not "
        "this profile"
    ),
    adam_default="foreach",
    adam_source=(
        "composer/optim/decoupled_weight_decay.py DecoupledAdamW.adamw: a loop over the parameters, each "
        "update a chain of element-wise ops (mul_, add_, mul_, addcmul_, sqrt, div, add_, addcdiv_): the "
        "bytes of torch's foreach chain, whose weight-decay mul_ the YAMLs' weight_decay 0 skips"
    ),
)

# ---- exatrain's own trainer -------------------------------------------------------------------
_EXA = (
    "exatrain accounting/memory.py state_bytes_per_param (trainer/parallel/data.py: DDP, "
    "ZeroRedundancyOptimizer, FSDP2)"
)
EXATRAIN = EngineProfile(
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
    grad_accum_dtype="float32",
    grad_accum_source="trainer: autocast over fp32 parameters, fp32 .grad (trainer/parallel/data.py)",
    states=(
        (("bfloat16", 0, "float32"), _rule((4 + 2, 0), (4, 0), (8, 0), "DDP", _EXA)),
        (("bfloat16", 1, "float32"), _rule((4 + 2, 0), (4, 0), (0, 8), "DDP + ZeroRedundancyOptimizer", _EXA)),
        (("bfloat16", 2, "float32"), _rule((2, 4), (0, 4), (0, 8), "FSDP2 reshard_after_forward=False", _EXA)),
        (("bfloat16", 3, "float32"), _rule((0, 4), (0, 4), (0, 8), "FSDP2 reshard_after_forward=True", _EXA)),
        # float16: autocast's fp16 copies in place of the bf16 ones, the same fp32 parameters and gradients
        (("float16", 0, "float32"), _rule((4 + 2, 0), (4, 0), (8, 0), "DDP", _EXA)),
        (("float16", 1, "float32"), _rule((4 + 2, 0), (4, 0), (0, 8), "DDP + ZeroRedundancyOptimizer", _EXA)),
        (("float16", 2, "float32"), _rule((2, 4), (0, 4), (0, 8), "FSDP2 reshard_after_forward=False", _EXA)),
        (("float16", 3, "float32"), _rule((0, 4), (0, 4), (0, 8), "FSDP2 reshard_after_forward=True", _EXA)),
        (("float32", 0, "float32"), _rule((4, 0), (4, 0), (8, 0), "DDP", _EXA)),
        (("float32", 1, "float32"), _rule((4, 0), (4, 0), (0, 8), "DDP + ZeroRedundancyOptimizer", _EXA)),
        (("float32", 2, "float32"), _rule((4, 4), (0, 4), (0, 8), "FSDP2 reshard_after_forward=False", _EXA)),
        (("float32", 3, "float32"), _rule((0, 4), (0, 4), (0, 8), "FSDP2 reshard_after_forward=True", _EXA)),
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
        flash_kernel="sdpa",
        flash_kernel_source="trainer/model.py: torch.nn.functional.scaled_dot_product_attention",
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
    elementwise_default="eager",
    elementwise_source="the trainer runs eager; `exatrain train --compile` compiles each block (--elementwise fused)",
    cross_entropy_source="trainer/train.py: F.cross_entropy(logits.float(), ...), uncompiled even under --compile",
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
    adam_source=(
        "trainer/train.py build_optimizer: torch.optim.AdamW(fused=True) over plain tensors on a GPU "
        "(fused_adamw_ok); its foreach path over DTensors (tensor and expert parallelism, FSDP2), under "
        "ZeroRedundancyOptimizer (ZeRO-1) and on the CPU"
    ),
)

ENGINES = {p.name: p for p in (MEGATRON_CORE, MEGATRON_DEEPSPEED, TORCHTITAN, EXATRAIN, LLM_FOUNDRY)}


@dataclass(frozen=True)
class Resolved:
    """What a runtime runs for a plan's settings, resolved once (``EngineProfile.resolve``): the profile as the
    settings vary it, and every choice whose empty value meant "the runtime's own" made. ``evaluate``,
    ``step_times``, ``stage_times``, ``rank_memory`` and the trainer-memory model take it. Built by hand (tests,
    ``accounting.memory.stage_memory``), its defaults are ``accounting.memory``'s own convention: no engine
    profile (``engine`` None), the upcast loss, Transformer Engine's p2p ring, no FP8."""

    dtype: str = "bfloat16"
    flash: bool = True  # flash attention (Plan.flash_attention)
    # the runtime's profile with the plan's gradient accumulation and Adam kernel
    engine: EngineProfile | None = field(default=None, repr=False)
    runtime: str = "exatrain"
    elementwise: str = "fused"  # settings.ELEMENTWISE, resolved (EngineProfile.elementwise)
    cross_entropy: str = "upcast"  # settings.CROSS_ENTROPY, resolved (EngineProfile.cross_entropy)
    attention_kernel: str = ""  # settings.ATTENTION_KERNELS, resolved ("": the device prior's own rate)
    cp_comm: str = "p2p"  # settings.CP_COMMS, resolved for the model (settings.cp_comm_for)
    cp_exchange: CpExchange | None = None  # how the engine runs it (None: Transformer Engine's p2p ring)
    moe_dispatcher: str = "alltoall"
    moe_load: float = 1.25  # the busiest expert rank's routed copies over the mean (accounting.moe.moe_load)
    fp8: str = ""  # the FP8 recipe's scaling ("": none)
    fp8_recipe: Fp8Recipe | None = None  # the accounting's FP8 configuration (with fp8_param_gather's FP8 weights)
    fp8_param_gather: bool = False
    fp8_tp_gather: bool = False  # its sequence-parallel all-gathers carry FP8 (EngineProfile.gathers_tp_in_fp8)
    selective: str = "core_attention"  # what its selective recomputation keeps (ActivationRules.selective)
    expert_gemms: str = "grouped"  # EngineProfile.expert_gemms
    recompute_modules: tuple[str, ...] = ()  # what selective recomputation reruns (Plan.recompute_modules)
    recompute_every: int = 0  # Plan.recompute_every
    settings: RunSettings = RunSettings()  # as the plan gave them, each that named nothing made the runtime's own

    def other(self, runtime: str, model=None) -> "Resolved":
        """Another runtime's own run of the same model, dtype, FP8 GEMMs and MoE routing (its memory beside the
        plan's runtime's: ``planner.evaluate``'s other memory models), every other setting its own."""
        s = self.settings
        keep = RunSettings(
            runtime=runtime,
            fp8=s.fp8,
            fp8_param_gather=s.fp8_param_gather,
            moe_capacity_factor=s.moe_capacity_factor,
            moe_force_balance=s.moe_force_balance,
        )
        return get_engine(runtime).resolve(keep, model, dtype=self.dtype, flash=self.flash)


def resolve_settings(settings: RunSettings, model=None, *, dtype: str = "bfloat16", flash: bool = True) -> Resolved:
    """``settings`` as their runtime runs them for ``model`` (``EngineProfile.resolve``)."""
    return get_engine(settings.runtime).resolve(settings, model, dtype=dtype, flash=flash)


def plan_run(plan) -> Resolved:
    """A plan's settings as its runtime runs them: the one place a Plan's settings are spread."""
    return resolve_settings(plan.settings, plan.model, dtype=plan.dtype, flash=plan.flash_attention)


def get_engine(name: str) -> EngineProfile:
    """The profile called ``name``; an unknown name is a UserError listing the valid ones."""
    try:
        return ENGINES[name]
    except (KeyError, TypeError):
        raise UserError(f"unknown engine {name!r}; use one of {', '.join(RUNTIMES)}") from None


__all__ = [
    "ADAM_BYTES",
    "ENGINES",
    "ActivationRules",
    "EngineProfile",
    "Overlap",
    "Resolved",
    "StateRule",
    "get_engine",
    "plan_run",
    "resolve_settings",
]
