"""Per-rank memory of every pipeline stage: model states, activations, buffers.

Byte convention (the trainer's, PyTorch-native mixed precision; Adam):

==========  =======================================  ================  ================
ZeRO stage  weights (bytes/param)                    gradients         optimizer (m, v)
==========  =======================================  ================  ================
0 (DDP)     4 fp32 + 2 16-bit compute copy           4 fp32            8 fp32
1           4 + 2                                    4                 8 / dp
2 (FSDP2)   4 / dp + 2 (unsharded copy kept fwd→bwd) 4 / dp            8 / dp
3 (FSDP2)   4 / dp + 16-bit copies of 2 layers       4 / dp (+1 layer) 8 / dp
==========  =======================================  ================  ================

The fp32 weights are Adam's master weights, so "model states" (weights + optimizer) come to
14 bytes/param at ZeRO-0 — Rajbhandari et al. 2020's mixed-precision Adam (2 + 4 + 8) — plus 4 bytes
of fp32 gradients. In float32 training there is no 16-bit copy (4 + 4 + 8 = 16 bytes/param).

Activations follow Korthikanti et al. 2022 Table 2, generalised to GQA, SwiGLU, no dropout and
fused (flash) attention; ``korthikanti_layer_activation_bytes`` reproduces the table itself.

Other engines keep other copies (``accounting.engines``): pass ``engine=`` to ``rank_memory``,
``stage_memory`` or ``memory_by_stage`` for Megatron-Core's, Megatron-DeepSpeed's or torchtitan's
model states, bucket buffers, dropout masks and selective recomputation. Without it (the default)
the numbers are the convention above, which is the ``exatrain`` profile's.

Mixture of experts, context parallelism and fp8 (``accounting.moe``, ``accounting.context``,
``accounting.fp8``) enter through keyword arguments of ``layer_activation_bytes`` and
``rank_memory`` (``ep``, ``etp``, ``cp``, ``capacity_factor``, ``fp8`` ...); at their defaults a dense
model's numbers are the ones above, bit for bit.

A plan that keeps model states in host memory (``run.settings.offload``) holds on the GPU what is left once
``accounting.offload`` has moved them (with an engine profile; the host's share is ``planner.evaluate``'s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from exatrain.catalog.models import ModelSpec
from exatrain.plan import MemoryBreakdown, Plan
from exatrain.settings import HALF_DTYPES, SCHEDULES
from exatrain.accounting.inflight import group_sizes, peak_in_flight_fast, schedule_codes
from exatrain.accounting.params import layer_params, stage_layer_kinds, stage_params, stage_params_split, total_params
from exatrain.accounting.engines import EngineProfile, Resolved
from exatrain.accounting.dtypes import COMPUTE_BYTES
from exatrain.accounting.fp8 import gemms_per_layer
from exatrain.accounting.fp8 import gemm_weights as fp8_gemm_weights
from exatrain.accounting.context import cp_buffer_bytes
from exatrain.accounting.moe import dispatch_buffer_bytes, expert_dp
from exatrain.accounting.offload import offloaded
from exatrain.accounting.activations import (  # re-exported: the layer's count lives there
    EngineSaves,
    engine_layer_activation_bytes,
    korthikanti_layer_activation_bytes,
    layer_activation_bytes,
    logits_bytes_per_element,
    per_op_checkpoint_layer_bytes,
)

# Engines whose embedding applies dropout outside every activation checkpoint, keeping its 1-byte mask per element
# of the embedding's output for each micro-batch in flight on the first stage (``rank_memory``): Megatron's
# embedding_dropout (hidden_dropout) in megatron/core/models/common/embeddings/language_model_embedding.py (after
# the scatter to the sequence-parallel region) and Megatron-DeepSpeed's Embedding (megatron/model/language_model.py),
# which DeepSpeed's PipelineModule leaves out of its checkpoints (``_is_checkpointable``: transformer layers only).
EMBEDDING_DROPOUT_ENGINES = ("megatron-core", "megatron-deepspeed")

# Fraction of the rest added as "other": allocator fragmentation and caching slack (a stated
# allowance, not a measurement: PyTorch's caching allocator typically reserves 5-10% above the peak).
FRAGMENTATION_ALLOWANCE = 0.05


@dataclass(frozen=True)
class StateBytesPerParam:
    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def state_bytes_per_param(dtype: str, zero_stage: int, dp: int) -> StateBytesPerParam:
    """Bytes per parameter of weights / gradients / optimizer states (table in the module doc).
    ZeRO-3's gathered layers are added by ``stage_memory`` (they depend on layer size)."""
    copy16 = 2.0 if dtype in HALF_DTYPES else 0.0
    if zero_stage == 0:
        return StateBytesPerParam(4.0 + copy16, 4.0, 8.0)
    if zero_stage == 1:
        return StateBytesPerParam(4.0 + copy16, 4.0, 8.0 / dp)
    if zero_stage == 2:
        # FSDP2 with reshard_after_forward=False keeps the unsharded compute copy from forward to
        # backward: a 16-bit copy in mixed precision, a separate fp32 buffer in float32 training.
        return StateBytesPerParam(4.0 / dp + (copy16 or 4.0), 4.0 / dp, 8.0 / dp)
    return StateBytesPerParam(4.0 / dp, 4.0 / dp, 8.0 / dp)


@dataclass(frozen=True)
class RankCounts:
    """What one rank of a pipeline stage holds (numbers, or numpy arrays, one entry per layout): its parameters
    outside the routed experts and its routed experts' (``params.stage_params_split`` with ep), its layers and
    the MoE layers among them, the micro-batches whose activations it holds at its peak (``inflight``), whether
    it is the last (the head and the loss) and the first (the embedding; None: when pp == 1) stage; the part of
    its stage's unsharded gradient alive at once (``unsharded_grad_share``); and under full recomputation the
    layers of it that recomputation covers (Plan.recompute_layers, recompute_every: ``settings.full_rerun_layers``;
    None: all of them)."""

    params_here: Any
    layers_here: Any
    inflight_mb: Any
    is_last: Any
    expert_params_here: Any = 0
    moe_layers_here: Any = 0
    is_first: Any = None
    pp_grad_share: Any = 1.0
    recomputed_here: Any = None


def inflight_microbatches(plan: Plan, pp_rank: int) -> float:
    """Micro-batches whose activations one rank holds at its peak, in units of that rank's whole
    share of layers (so interleaved schedules can give fractions). See ``inflight``."""
    return float(inflight(plan.schedule, plan.pp, plan.num_microbatches, plan.interleave, pp_rank))


def inflight(schedule: str, pp, num_microbatches, interleave, pp_rank):
    """``inflight_microbatches`` on plain numbers or numpy arrays (the search's batch path).

    The schedule simulator's peak count of (micro-batch, virtual stage) activation sets a rank holds,
    divided by v: GPipe holds all m; 1F1B's rank r min(p - r, m) (Narayanan et al. 2021 Sec. 2.2.1);
    interleaved 1F1B's rank 0 p(1 + (p-1)/(pv)) stage-units (Korthikanti et al. 2022 Sec. 4.2.3);
    zero bubble p, as ZB-H1 is designed to hold (Qi et al. 2023). See cost.schedule.
    """
    held = peak_in_flight_fast(
        pp=pp, num_microbatches=num_microbatches, schedule=schedule, interleave=interleave, rank=pp_rank
    )
    return np.where(np.asarray(pp) == 1, 1.0, held / np.asarray(interleave, dtype=float))


def stage_memory(plan: Plan, pp_rank: int, engine: EngineProfile | None = None) -> MemoryBreakdown:
    """Peak bytes of one rank of pipeline stage ``pp_rank`` (see the module doc for conventions;
    ``engine``: another engine's, see ``accounting.engines``). A MoE model is counted with its
    experts whole on every rank (ep is counted by ``rank_memory``, the path estimates take)."""
    layers_here = sum(plan.layers_per_stage()[v] for v in plan.stages_of_rank(pp_rank))
    moe = {}
    if plan.model.is_moe:
        split = stage_params_split(
            plan.model,
            tp=plan.tp,
            pp=plan.pp,
            interleave=plan.interleave,
            layers_per_stage=plan.layers_per_stage(),
            v_shape=plan.v_shape,
        )
        kinds = stage_layer_kinds(
            plan.model,
            pp=plan.pp,
            interleave=plan.interleave,
            layers_per_stage=plan.layers_per_stage(),
            v_shape=plan.v_shape,
        )
        params_here = split[pp_rank][0]
        moe = dict(expert_params_here=split[pp_rank][1], moe_layers_here=kinds[pp_rank][1])
    else:
        params_here = stage_params(plan)[pp_rank]
    # the convention's (or the engine's) count of the plan's loss and selective recomputation; no cp, ep, FP8
    loss = engine.cross_entropy(plan.cross_entropy, plan.elementwise) if engine is not None else plan.cross_entropy
    run = Resolved(
        dtype=plan.dtype,
        flash=plan.flash_attention,
        engine=engine,
        cross_entropy=loss or "upcast",
        recompute_modules=plan.recompute_modules,
        distribute_saved_activations=plan.distribute_saved_activations,
        moe_load=1.0,
    )
    rank = RankCounts(
        params_here=params_here,
        layers_here=layers_here,
        inflight_mb=inflight_microbatches(plan, pp_rank),
        is_last=pp_rank == plan.rank_of_stage(plan.virtual_stages - 1),
        is_first=pp_rank == plan.rank_of_stage(0),
        recomputed_here=(
            plan.recomputed_layers_of_rank(pp_rank) if plan.recompute_layers or plan.recompute_every else None
        ),
        pp_grad_share=float(unsharded_grad_share(plan.schedule, plan.pp, plan.num_microbatches, plan.interleave)),
        **moe,
    )
    parts = rank_memory(
        plan.model,
        run,
        zero_stage=plan.zero_stage,
        recompute=plan.recompute,
        sequence_parallel=plan.sequence_parallel,
        tp=plan.tp,
        dp=plan.dp,
        micro_batch=plan.micro_batch,
        pp=plan.pp,
        interleave=plan.interleave,
        rank=rank,
    )
    return MemoryBreakdown(*(float(x) for x in parts))


def rank_memory(
    m: ModelSpec,
    run: Resolved,
    *,
    zero_stage: int,
    recompute: str,
    sequence_parallel: bool,
    tp,
    dp,
    micro_batch,
    pp,
    interleave,
    rank: RankCounts,
    cp=1,
    ep=1,
    etp=1,
):
    """(weights, gradients, optimizer, activations, other) bytes of one rank. Categorical options
    are scalars; every size may be a numpy array (one entry per candidate plan).

    ``run``: the run as its runtime runs it (``accounting.engines.Resolved``): its dtype, flash attention, and
    ``run.engine``, whose count it is (that engine's model states by ZeRO stage, its ZeRO-3 working set, bucket
    buffers, allocator allowance and activation rules; None: this module's own convention, equal to the
    ``exatrain`` profile's). ``rank``: what the rank holds (``RankCounts``).

    Extensions (defaults: none, and then the result is the dense count exactly):
      ``cp``: context parallelism — activations, logits and pipeline buffers per rank divided by cp,
        the attention's K,V working set (``accounting.context.cp_buffer_bytes``, ``run.cp_comm``) in
        "other", and the model states sharded over dp*cp (the gradients of ranks holding the same
        weights are reduced over the data-parallel group with context parallelism:
        Megatron-Core parallel_state, ``get_data_parallel_group(with_context_parallel=True)``);
      MoE (``accounting.moe``): ``params_here`` is the rank's non-routed-expert parameters and
        ``expert_params_here`` its routed-expert ones (``params.stage_params_split``), whose states
        are sharded over the expert-data-parallel group ``expert_dp(tp, dp, ep, etp, cp)``;
        ``moe_layers_here`` of the ``layers_here`` layers are MoE layers (their activations with
        ``etp`` and the routing load ``run.moe_load``), and one all-to-all's buffers join "other";
      ``run.fp8_recipe``: the cached fp8 weights (``Fp8Recipe.weight_bytes_per_param`` per GEMM weight here;
        under ZeRO-3 only the gathered layers') join the weights, GEMM inputs are saved in fp8, and delayed scaling's
        amax histories join "other". The two transient working sets (CP's and the all-to-all's) belong to different
        parts of a layer, so the larger of them is counted.
    ``run.cross_entropy``: how the last stage's loss holds its logits (``logits_bytes_per_element``);
    ``rank.pp_grad_share``: the part of a stage's unsharded gradient (EngineProfile.pp_unsharded_grad_bytes) alive
    at once (``unsharded_grad_share``); ``run.recompute_modules``: what selective recomputation reruns
    (Plan.recompute_modules, ``layer_activation_bytes``); ``rank.recomputed_here``: under full recomputation, the
    layers of the rank it covers, the others keeping everything (None: all its layers); MoE layers among them in
    the rank's proportion.
    """
    lay = RankLayout(
        *(np.asarray(x, dtype=float) for x in (tp, dp, micro_batch, pp, interleave)),
        cp=cp,
        ep=ep,
        etp=etp,
        zero_stage=zero_stage,
        recompute=recompute,
        sequence_parallel=sequence_parallel,
    )
    rules = _rules(m, run, lay)
    weights, grads, optim = _model_states(m, run, rules, lay, rank)
    acts = _activations(m, run, rules, lay, rank)
    p2p, fp8_weights = _buffers(m, run, rules, lay, rank)
    weights = weights + fp8_weights
    other = p2p + rules.allowance * (weights + grads + optim + acts + p2p)
    return weights, grads, optim, acts, other


@dataclass(frozen=True)
class RankLayout:
    """The layout ``rank_memory``'s parts count on: sizes as floats or numpy arrays (one entry per layout), the
    categorical options as scalars."""

    tp: Any
    dp: Any
    micro_batch: Any
    pp: Any
    interleave: Any
    cp: Any = 1
    ep: Any = 1
    etp: Any = 1
    zero_stage: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False


@dataclass(frozen=True)
class _Rules:
    """The count a run's engine (or, without one, this module's convention) gives: model-state bytes per parameter
    at a sharding degree, the ZeRO-3 working set, persistent bucket buffers, the allocator allowance and one
    layer's activations under a recomputation mode (``layer_bytes(mode, moe)``)."""

    state_bytes: Callable[[Any], tuple]
    gathered_layers: int
    prefetch_elements: float
    unsharded_grad_bytes: float
    buffers: float
    allowance: float
    layer_bytes: Callable[..., Any]


def _rules(m: ModelSpec, run: Resolved, lay: RankLayout) -> _Rules:
    """``run.engine``'s rules for ``lay`` (module doc; None: the convention, equal to the exatrain profile's)."""
    dtype, engine = run.dtype, run.engine
    kw = dict(
        recompute_modules=tuple(run.recompute_modules),
        cp=lay.cp,
        etp=lay.etp,
        capacity_factor=run.moe_load,
        fp8=run.fp8_recipe,
        sequence_parallel=lay.sequence_parallel,
        flash=run.flash,
        dtype=dtype,
    )
    b, tp, zero_stage = lay.micro_batch, lay.tp, lay.zero_stage
    # Full recomputation's checkpoint split over the tp ranks (Plan.distribute_saved_activations: the rule allows it
    # only without sequence parallelism, where every tp rank holds the layer input whole): 1/tp of it per rank.
    split = tp if run.settings.distribute_saved_activations and not lay.sequence_parallel else 1.0

    def saved(mode: str, nbytes):
        return nbytes / split if mode == "full" else nbytes

    if engine is None:

        def state_bytes(degree):
            st = state_bytes_per_param(dtype, zero_stage, degree)
            return st.weights, st.gradients, st.optimizer

        def layer_bytes(mode: str, moe: bool = False):
            return saved(mode, layer_activation_bytes(m, b, tp, recompute=mode, moe=moe, **kw))

        return _Rules(state_bytes, 2, 0.0, 4.0, 0.0, FRAGMENTATION_ALLOWANCE, layer_bytes)

    def engine_state_bytes(degree):
        return engine.state_bytes(dtype, zero_stage, degree)

    def engine_layer_bytes(mode: str, moe: bool = False):
        return saved(mode, engine_layer_activation_bytes(engine, m, b, tp, recompute=mode, moe=moe, **kw))

    return _Rules(
        engine_state_bytes,
        engine.zero3_gathered_layers,
        engine.zero3_prefetch_elements,
        engine.zero3_unsharded_grad_bytes,
        engine.buffer_bytes(dtype, zero_stage),
        engine.allocator_allowance,
        engine_layer_bytes,
    )


def _model_states(m: ModelSpec, run: Resolved, rules: _Rules, lay: RankLayout, rank: RankCounts):
    """(weights, gradients, optimizer) bytes: the rank's parameters and routed experts at their sharding degrees,
    less what is offloaded to the host, plus ZeRO-3's working set and a pipeline stage's unsharded gradient."""
    engine, zero_stage, e = run.engine, lay.zero_stage, COMPUTE_BYTES[run.dtype]
    params_here, expert_params_here = rank.params_here, rank.expert_params_here
    tp, dp, pp, cp, ep, etp = lay.tp, lay.dp, lay.pp, lay.cp, lay.ep, lay.etp
    shard_dp = dp * cp
    per_weights, per_grads, per_optim = rules.state_bytes(shard_dp)
    weights, grads, optim = params_here * per_weights, params_here * per_grads, params_here * per_optim
    if m.is_moe:
        ew, eg, eo = rules.state_bytes(expert_dp(tp, dp, ep, etp, cp))
        weights, grads, optim = (
            weights + expert_params_here * ew,
            grads + expert_params_here * eg,
            optim + expert_params_here * eo,
        )
    offload = run.settings.offload
    if engine is not None and offload != "none":  # what leaves the GPU for host memory (accounting.offload)
        rule = engine.state_rule(run.dtype, zero_stage)
        for n, degree in (
            (params_here, shard_dp),
            *(((expert_params_here, expert_dp(tp, dp, ep, etp, cp)),) if m.is_moe else ()),
        ):
            moved = offloaded(offload, rule, run.dtype, degree)
            weights, grads, optim = (
                weights - n * moved.weights,
                grads - n * moved.gradients,
                optim - n * moved.optimizer,
            )
    # Under a pipeline schedule an engine may hold the stage's whole gradient unsharded until the last
    # micro-batch's backward (EngineProfile.pp_unsharded_grad_bytes: torchtitan's FSDP2 stages).
    pp_grad = (engine.pp_unsharded_grad_bytes if engine is not None and zero_stage >= 2 else 0.0) * (pp > 1)
    if zero_stage == 3:
        # FSDP2 gathers one layer while prefetching the next, and holds one layer's unsharded
        # gradient until its reduce-scatter (DeepSpeed's ZeRO-3: one layer and a prefetch bucket).
        lp = layer_params(m)
        layer_rank_params = lp.sharded / tp + lp.replicated
        if m.is_moe:
            layer_rank_params = layer_rank_params + lp.experts / (np.asarray(ep, dtype=float) * etp)
        weights = weights + rules.gathered_layers * layer_rank_params * e
        if rules.prefetch_elements:
            weights = weights + rules.prefetch_elements * e
        # (a stage holding its whole unsharded gradient holds this layer's within it)
        grads = grads + np.where(pp_grad > 0, 0.0, layer_rank_params * rules.unsharded_grad_bytes)
    if zero_stage >= 2:
        grads = grads + pp_grad * rank.pp_grad_share * (params_here + (expert_params_here if m.is_moe else 0.0))
    return weights, grads, optim


def _layer_activations(m: ModelSpec, rules: _Rules, lay: RankLayout, rank: RankCounts):
    """The rank's layers' activations for its micro-batches in flight, and the recomputed layer's working set."""
    recompute, layer_bytes = lay.recompute, rules.layer_bytes
    layers_here, inflight_mb, recomputed_here = rank.layers_here, rank.inflight_mb, rank.recomputed_here
    partial = recompute == "full" and recomputed_here is not None
    if partial:  # the rerun layers keep their input, the others everything (the rank's mix of MoE layers in each)
        share = np.asarray(recomputed_here, dtype=float) / np.maximum(np.asarray(layers_here, dtype=float), 1.0)
    if m.is_moe:
        moe_here = np.asarray(rank.moe_layers_here, dtype=float)
        per_dense, per_moe = layer_bytes(recompute), layer_bytes(recompute, True)
        if partial:
            per_dense = share * per_dense + (1 - share) * layer_bytes("none")
            per_moe = share * per_moe + (1 - share) * layer_bytes("none", True)
        acts = (per_dense * (layers_here - moe_here) + per_moe * moe_here) * inflight_mb
        if recompute != "none":
            # the recomputed layer's working set: the larger kind present on this rank
            full_layer = np.where(moe_here > 0, layer_bytes("none", True), layer_bytes("none"))
            kept = np.where(moe_here > 0, per_moe, per_dense)
            acts = acts + full_layer - (kept if recompute == "selective" else 0.0)
        return acts
    per_layer = layer_bytes(recompute)
    if partial:
        per_layer = share * per_layer + (1 - share) * layer_bytes("none")
    acts = per_layer * layers_here * inflight_mb
    if recompute != "none":
        # Backward recomputes one layer at a time, holding what that layer would have kept
        # without recomputation for one micro-batch (minus what selective already keeps).
        full_layer = layer_bytes("none")
        acts = acts + full_layer - (per_layer if recompute == "selective" else 0.0)
    return acts


def _activations(m: ModelSpec, run: Resolved, rules: _Rules, lay: RankLayout, rank: RankCounts):
    """Activation bytes: the layers' (``_layer_activations``), the last stage's head and loss, and the first
    stage's embedding-dropout masks where the engine keeps them."""
    engine, e, inflight_mb = run.engine, COMPUTE_BYTES[run.dtype], rank.inflight_mb
    acts = _layer_activations(m, rules, lay, rank)
    tokens = lay.micro_batch * m.seq_len / lay.cp
    sp_div = lay.tp if lay.sequence_parallel else 1.0
    # Last stage: final-norm and head inputs per in-flight micro-batch (the head's whole sequence where the
    # engine keeps it all-gathered under sequence parallelism, EngineProfile.sp_gathered_head_input, as the
    # trainer's DTensor head does); the logits of one micro-batch as the loss holds them at its peak
    # (logits_bytes_per_element).
    head_div = 1.0 if engine is None or engine.sp_gathered_head_input else sp_div
    is_last = np.asarray(rank.is_last, dtype=float)
    acts = acts + is_last * (
        (e * tokens * m.hidden / sp_div + e * tokens * m.hidden / head_div) * inflight_mb
        + tokens * m.vocab / lay.tp * logits_bytes_per_element(run.cross_entropy, run.dtype, lay.tp)
    )
    if engine is not None and engine.name in EMBEDDING_DROPOUT_ENGINES and m.dropout > 0:
        # the first stage's embedding-dropout masks, 1 byte an element, one per micro-batch in flight
        pp = lay.pp
        first = (pp == 1).astype(float) if rank.is_first is None else np.asarray(rank.is_first, dtype=float)
        acts = acts + first * tokens * m.hidden / sp_div * inflight_mb
    return acts


def _buffers(m: ModelSpec, run: Resolved, rules: _Rules, lay: RankLayout, rank: RankCounts):
    """(buffers, FP8 weights): the pipeline's receive buffers, the engine's bucket buffers, the larger transient
    working set (CP's or the all-to-all's), FP8 scaling state; and the cached FP8 weights (module doc)."""
    e, tp, b, zero_stage = COMPUTE_BYTES[run.dtype], lay.tp, lay.micro_batch, lay.zero_stage
    tokens = b * m.seq_len / lay.cp
    sp_div = tp if lay.sequence_parallel else 1.0
    # Pipeline receive buffers: one activation and one gradient per virtual stage boundary.
    p2p = np.where(lay.pp > 1, 2 * e * tokens * m.hidden / sp_div * lay.interleave, 0.0)
    if rules.buffers:  # communication-bucket buffers the engine keeps for the whole run
        p2p = p2p + rules.buffers
    working = _working_set_bytes(
        m,
        b,
        tp,
        dtype=run.dtype,
        sequence_parallel=lay.sequence_parallel,
        cp=lay.cp,
        etp=lay.etp,
        capacity_factor=run.moe_load,
        cp_comm=run.cp_comm,
        moe_layers_here=rank.moe_layers_here,
    )
    if working is not None:
        p2p = p2p + working
    fp8, layers_here, moe_layers_here = run.fp8_recipe, rank.layers_here, rank.moe_layers_here
    if fp8 is None:
        return p2p, 0.0
    dense_here = layers_here - (moe_layers_here if m.is_moe else 0)
    gemm_w = dense_here * fp8_gemm_weights(m, False, tp)
    n_gemms = dense_here * gemms_per_layer(m, False)
    if m.is_moe:
        ep_ = np.asarray(lay.ep, dtype=float)
        gemm_w = gemm_w + moe_layers_here * fp8_gemm_weights(m, True, tp, ep_, lay.etp)
        n_gemms = n_gemms + moe_layers_here * gemms_per_layer(m, True, ep_)
    if zero_stage == 3:
        # Sharded weights (FSDP / ZeRO-3) are cast to fp8 as each layer is gathered (torchtitan's
        # float8 all-gather, torchao float8/fsdp_utils.py); no whole-stage fp8 copy is cached, only
        # the gathered layers' (the ZeRO-3 working set).
        gemm_w = gemm_w * np.minimum(1.0, rules.gathered_layers / np.maximum(layers_here, 1))
    return p2p + fp8.meta_bytes(n_gemms), gemm_w * fp8.weight_bytes_per_param(run.dtype)


def _working_set_bytes(
    m: ModelSpec, b, tp, *, dtype, sequence_parallel, cp, etp, capacity_factor, cp_comm, moe_layers_here
):
    """The larger of CP's attention working set and one all-to-all's buffers (None when neither)."""
    parts = []
    if np.any(np.asarray(cp) != 1):
        parts.append(cp_buffer_bytes(m, b, tp, cp, dtype=dtype, comm=cp_comm))
    if m.is_moe:
        a2a = dispatch_buffer_bytes(
            m, b, tp, sequence_parallel=sequence_parallel, dtype=dtype, cp=cp, etp=etp, capacity_factor=capacity_factor
        )
        parts.append(np.where(np.asarray(moe_layers_here) > 0, a2a, 0.0))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else np.maximum(parts[0], parts[1])


def unsharded_grad_share(schedule, pp, num_microbatches, interleave):
    """The part of a rank's stage gradient held unsharded at once where an engine accumulates it so over a
    pipeline schedule (EngineProfile.pp_unsharded_grad_bytes) and reduce-scatters each virtual stage's after
    that stage's last backward: one virtual stage's, 1/v, under the interleaved schedule when its micro-batches
    make one interleaving group (``inflight.group_size``: m <= pp, or no divisor of m between pp and m;
    every backward of virtual stage v-1, then all of v-2, ...: ``cost.schedule.rank_order``), else all of
    it (the groups alternate the virtual stages). Arrays allowed."""
    v = np.asarray(interleave, dtype=float)
    m, p = np.asarray(num_microbatches), np.asarray(pp)
    code = schedule_codes(schedule, np.broadcast_shapes(v.shape, m.shape, p.shape, np.shape(schedule)))
    one_round = (code == SCHEDULES.index("interleaved")) & (v > 1) & (group_sizes(p, m) >= m)
    return np.where(one_round, 1.0 / np.maximum(v, 1.0), 1.0)


def memory_by_stage(plan: Plan, engine: EngineProfile | None = None) -> tuple[MemoryBreakdown, ...]:
    return tuple(stage_memory(plan, r, engine) for r in range(plan.pp))


def model_state_bytes(plan: Plan) -> float:
    """Weights + optimizer states of the whole job (all ranks), the "model states" of the study."""
    per = state_bytes_per_param(plan.dtype, 0, 1)
    return total_params(plan.model) * (per.weights + per.optimizer)


__all__ = [  # the layer-level counts re-exported from accounting.activations, and this module's own
    "EMBEDDING_DROPOUT_ENGINES",
    "FRAGMENTATION_ALLOWANCE",
    "EngineSaves",
    "RankCounts",
    "RankLayout",
    "StateBytesPerParam",
    "engine_layer_activation_bytes",
    "inflight",
    "inflight_microbatches",
    "korthikanti_layer_activation_bytes",
    "layer_activation_bytes",
    "logits_bytes_per_element",
    "memory_by_stage",
    "model_state_bytes",
    "per_op_checkpoint_layer_bytes",
    "rank_memory",
    "stage_memory",
    "state_bytes_per_param",
    "unsharded_grad_share",
]
