"""Per-rank memory of the project's own trainer as it runs today (PyTorch-native execution).

``accounting.memory`` is the planner's reference model: Megatron-LM's tensors (Korthikanti et al.
2022, Table 2) in 16 bits, model states by ZeRO stage. This module counts what ``exatrain train``
actually keeps, checked against a trace of the trainer's own model (``exatrain estimate --trace``,
tests/bench/test_trace.py). Where the two differ, the difference is a property of the trainer's
execution, and each item says whether it is inherent or avoidable:

* mixed precision by autocast over fp32 parameters (on a GPU the norms in fp32, as CUDA autocast
  runs them: bench/gpu_rules.py); the model casts the embedding's output to
  bf16, so the residual stream (the norms' inputs, a pipeline stage's input and output) is 2 bytes
  per element as in Megatron-LM, and casts each norm's output once, so q, k and v (and the MLP's
  gate and up projections) share one 16-bit input as Megatron's fused QKV does (autocast alone
  would keep an fp32 stream and a 16-bit copy per projection);
* DTensor sequence parallelism keeps the all-gathered (whole-sequence) input of the attention and
  of the MLP; Megatron keeps the 1/tp slice and gathers it again in the backward;
* grouped-query attention repeats keys and values to all heads before the kernel
  (``repeat_interleave``), which keeps the repeated copies — avoidable (``enable_gqa``);
* a pipeline stage keeps each in-flight micro-batch's output until its backward (Megatron frees
  the data after sending it);
* weights autocast cannot cache (a non-leaf read of a local shard under tp with ZeRO-0/1 over
  dp > 1; the routed experts' explicit casts) are cast again by every micro-batch's forward: a
  pipeline stage keeps one 16-bit set per micro-batch in flight (``_uncached_copies``) —
  avoidable (cast once per step, as Megatron's distributed optimizer keeps one bf16 copy);
* only linear layers get 16-bit weight copies (autocast casts nothing else); FSDP2 (ZeRO-2/3 with
  dp > 1) gathers every parameter in bf16;
* the peak is the largest of three moments: the backward of the last micro-batch in flight
  (states + activations + the backward's working set: the loss's fp32 temporaries, or the top
  layer's weight gradient and its fp32 copy, the input gradient, the residual stream's gradient,
  FSDP's fp32 reduce-scatter input), the gradient norm (a float64 square of the largest
  gradient) and AdamW's update (square-root and division temporaries: every parameter at once with
  the foreach implementation torch uses on accelerators, the largest one on the CPU). When no
  backward comes before the activations peak (GPipe; 1F1B with m <= in flight) the gradients are
  not allocated yet at that moment.

Mixture of experts (trainer/moe.py, parallel/expert.py): a rank holds N/ep of each MoE layer's routed
experts (whole experts; every tp rank the same ones), the router and the shared experts (tensor
parallel) as a dense layer's weights; fp32 weights, gradients and Adam states of all of them as
of any parameter (ZeRO-1 shards them over dp like the rest: ZeroRedundancyOptimizer sees one list).
The router runs in fp32 with autocast off, so it has no 16-bit copy; the experts' stacked weights
get one each (cast for the grouped GEMM and kept for its backward). A MoE layer keeps, beyond the
dense layer's attention and norms, its router's fp32 input, probabilities and sort indices, and
per routed token copy (top_k per token, at a balanced load: the trainer is dropless, with no
capacity factor, and the balancing loss drives the load towards even) the experts' input rows,
their SwiGLU intermediates and the combined output, with the int64 orderings of the dispatch
(``_moe_mlp_bytes``). Context parallelism (parallel/context.py): a rank runs s/cp tokens of every
sequence through everything token-wise, its attention keeps the all-gathered keys and values of the
whole sequence and the [s/cp, s] mask, and its states are sharded over dp x cp. Both were checked
against the trace (tests/bench/test_trace_moe_cp.py, within 1.6% on eight ranks of seven layouts).

DDP's gradient buckets are counted (``other``; the trace adds them as DDP sizes them, bench/trace.py).
Not counted (runtime overheads measured by neither model; see docs/accuracy.md, "Calibration and
validation"): torch.distributed.pipelining's per-micro-batch receive
buffers, DTensor's replicated gradient of the vocabulary-parallel embedding, and a loss computed
on whole-vocabulary logits when autocast is on around ``loss_parallel``. Per-norm statistics
(8 bytes a token) are left out. With one micro-batch per step and no pipeline the gradients are
taken as present at the activation peak (high by up to the gradient bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from exatrain.catalog.models import ModelSpec
from exatrain.settings import HALF_DTYPES
from exatrain.plan import MemoryBreakdown, Plan
from exatrain.accounting.engines import Resolved
from exatrain.accounting.memory import (
    COMPUTE_BYTES,
    FRAGMENTATION_ALLOWANCE,
    RankCounts,
    inflight_microbatches,
    state_bytes_per_param,
)
from exatrain.accounting.params import layer_params, router_params, stage_layer_kinds, stage_params, stage_params_split


def trainer_layer_activation_bytes(
    m: ModelSpec,
    micro_batch,
    tp,
    *,
    sequence_parallel: bool,
    recompute: str,
    flash: bool,
    dtype: str,
    on_cpu: bool = False,
    cp: int = 1,
    ep: int = 1,
    moe: bool = False,
):
    """Activation bytes one layer of the trainer's model keeps for backward, per micro-batch, on one
    tp rank (see the module doc), tensor by tensor per token, with d = tp under sequence parallelism:

      norms (``_norm_bytes``): on a GPU both run on an fp32 copy of the input (CUDA autocast's
        fp32 list) and keep it (4h/d; RMSNorm's fused kernel keeps its input); on the CPU LayerNorm
        keeps its input in the stream's dtype, RMSNorm's composite the fp32 upcast and the fp32
        normalised input (8h/d);
      inputs of the projections the norms feed (16-bit under autocast), whole sequence: each
        norm's output cast once and shared by its projections (2 per layer; under sequence
        parallelism the attention and the MLP each all-gather their input once);
      attention on h/tp channels: q, k, v (keys and values repeated to all heads) and the output,
        e bytes each, + fp32 log-sum-exp per head (flash); the math kernel keeps the s x s
        probabilities (on the CPU it computes, and keeps q, k, v, in fp32);
      MLP on f/tp channels: fc1 output and GELU output, or gate, silu(gate), up and their product.
    Selective recomputation drops the attention core's own tensors (log-sum-exp or probabilities);
    full recomputation keeps only the layer input (the residual stream: bf16 under autocast).

    ``cp``: the rank holds s/cp tokens of each sequence; its attention keeps the keys and values of
    the whole sequence, all-gathered over the cp group (parallel/context.py), so k and v count cp
    times per local token, and the flash kernel keeps the [s/cp, s] mask it is given, converted to
    q's dtype (an additive mask: e bytes per entry, once per micro-batch, whole on every tp rank).
    ``moe``: a MoE layer of a MoE model (``_moe_mlp_bytes`` replaces the dense MLP's tensors)."""
    s, h, f, a = m.seq_len // cp, m.hidden, m.ffn_hidden, m.heads
    b = np.asarray(micro_batch, dtype=float)
    t = np.asarray(tp, dtype=float)
    d = t if sequence_parallel else 1.0
    autocast = dtype in HALF_DTYPES
    e = COMPUTE_BYTES[dtype]
    stream = 2.0 if autocast else 4.0  # residual-stream bytes per element
    if recompute == "full":
        return s * b * stream * h / d
    norm_keep = _norm_bytes(m, stream, on_cpu)
    gemm_in = 2 * e * h
    kv = 2.0 * cp  # k and v: the whole sequence's, cp times a rank's own tokens
    mask = e * s * cp / b if cp > 1 else 0.0  # the [s/cp, s] mask in q's dtype, once per micro-batch
    if flash:
        core_own = 4.0 * a + mask * t  # per head log-sum-exp; the mask is whole on every tp rank
        attn = (2 + kv) * e * h + (0.0 if recompute == "selective" else core_own)  # q, k, v, output
    elif recompute == "selective":
        attn = (2 + kv) * e * h
    else:
        up = 4.0 if (on_cpu and autocast) else e
        attn = (1 + kv) * up * h + up * a * s * cp + e * h
    if moe and m.is_moe:
        dense, whole = _moe_mlp_bytes(m, e, ep=ep)
    else:
        dense, whole = (4 if m.gated_mlp else 2) * e * f, 0.0
    per_token = (2 * norm_keep) / d + gemm_in + (attn + dense) / t + whole
    return s * b * per_token


def _moe_mlp_bytes(m: ModelSpec, e: float, *, ep: int) -> tuple[float, float]:
    """Bytes per token a MoE layer's MLP (trainer/moe.py) keeps for backward, beyond its 16-bit input
    (counted with the dense layers' projection inputs): (tensor-parallel part, part every tp rank
    keeps whole). Routed token copies at a balanced load: each rank sends k copies of each token and,
    under expert parallelism, receives as many (T*k rows for its N/ep experts).

      shared experts (tensor-parallel, width shared * f): gate, silu(gate), up, their product;
      router (fp32, replicated): its fp32 input 4h, the softmax output 4N, the sort's int64 indices
        8N (the chosen top_k are a view of them, kept by ``gather``), the chosen weights, their sum
        and their 16-bit copy (4k + 4 + 2k);
      routed copies, k per token: the experts' input rows eh (the gathered copies; under ep the
        received and regrouped ones), gate, silu, up and product e*4f, the combined outputs eh (kept
        by the product with the weights), int64 orderings 16 (copy -> token, sorted -> copy order),
        under ep 16 more (the regrouping permutation and its inverse)."""
    h, f, n, k = m.hidden, m.expert_width, m.experts, m.top_k
    shared = 4 * e * m.shared_experts * f
    router = 4.0 * h + 12.0 * n + 4.0 * k + 4.0 + 2.0 * k
    routed = k * (2 * e * h + 4 * e * f + 16.0 + (16.0 if ep > 1 else 0.0))
    return shared, router + routed


def _norm_bytes(m: ModelSpec, stream: float, on_cpu: bool) -> float:
    """Bytes per token a norm keeps for backward, for a residual stream of ``stream`` bytes per
    element. On accelerators autocast runs LayerNorm and RMSNorm in fp32 (an fp32 copy of a bf16
    input), which the kernel keeps (RMSNorm's fused kernel: its input and a per-token rstd); on the
    CPU LayerNorm runs in its input's dtype, and RMSNorm's composite keeps an fp32 upcast of the
    input and the fp32 normalised input."""
    h = m.hidden
    if not on_cpu:
        return 4.0 * h
    return 8.0 * h if m.arch == "llama" else stream * h


def trainer_stage_memory(plan: Plan, pp_rank: int, *, on_cpu: bool | None = None) -> MemoryBreakdown:
    """Peak bytes one rank of pipeline stage ``pp_rank`` holds under the trainer (module doc).
    ``on_cpu``: the plan runs on CPU processes (default: its cluster's device is the host CPU)."""
    layers_here = sum(plan.layers_per_stage()[v] for v in plan.stages_of_rank(pp_rank))
    m = plan.model
    if m.is_moe:  # the rank's non-expert parameters, its routed experts (N/ep of each MoE layer's)
        dense, experts = stage_params_split(
            m,
            tp=plan.tp,
            pp=plan.pp,
            interleave=plan.interleave,
            layers_per_stage=plan.layers_per_stage(),
            v_shape=plan.v_shape,
            ep=plan.ep,
        )[pp_rank]
        moe_here = stage_layer_kinds(
            m, pp=plan.pp, interleave=plan.interleave, layers_per_stage=plan.layers_per_stage(), v_shape=plan.v_shape
        )[pp_rank][1]
    else:
        dense, experts, moe_here = stage_params(plan)[pp_rank], 0, 0
    rank = RankCounts(
        params_here=dense,
        layers_here=layers_here,
        inflight_mb=inflight_microbatches(plan, pp_rank),
        is_last=pp_rank == plan.rank_of_stage(plan.virtual_stages - 1),
        is_first=pp_rank == 0,
        expert_params_here=experts,
        moe_layers_here=moe_here,
    )
    parts = trainer_rank_memory(
        m,
        Resolved(dtype=plan.dtype, flash=plan.flash_attention),
        zero_stage=plan.zero_stage,
        recompute=plan.recompute,
        sequence_parallel=plan.sequence_parallel,
        tp=plan.tp,
        dp=plan.dp,
        micro_batch=plan.micro_batch,
        pp=plan.pp,
        interleave=plan.interleave,
        rank=rank,
        num_microbatches=plan.num_microbatches,
        cp=plan.cp,
        ep=plan.ep,
        on_cpu=plan_on_cpu(plan) if on_cpu is None else on_cpu,
    )
    return MemoryBreakdown(*(float(x) for x in parts))


def plan_on_cpu(plan: Plan) -> bool:
    """Whether the plan's cluster (a catalog name) runs on the host CPU."""
    from exatrain.catalog.hardware import cluster_catalog

    c = cluster_catalog().get(plan.cluster)
    return c is not None and c.device.name == "cpu"


def trainer_rank_memory(
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
    num_microbatches=None,
    on_cpu: bool = False,
    cp: int = 1,
    ep: int = 1,
):
    """(weights, gradients, optimizer, activations, other) bytes of one rank. Categorical options
    are scalars; every size may be a numpy array (one entry per candidate plan).

    ``run``: its dtype and flash attention (``accounting.engines.Resolved``); ``rank``: what the rank holds
    (``accounting.memory.RankCounts``: ``is_first``, the rank holds the embedding, None: when pp == 1).
    ``num_microbatches``: per step (default: more than are in flight). ``on_cpu``: CPU processes (no fused RMSNorm,
    LayerNorm in its input's dtype, per-tensor AdamW) rather than accelerators (foreach AdamW).

    Mixture of experts and context parallelism (module doc), with ``accounting.memory.rank_memory``'s
    conventions: ``params_here`` is the rank's parameters outside the routed experts and
    ``expert_params_here`` its routed experts' (N/ep of each MoE layer's: ``params.stage_params_split``
    with ep); ``moe_layers_here`` of the ``layers_here`` layers are MoE layers; ``cp``: the rank holds
    s/cp tokens of every sequence and its states are sharded over dp x cp (the trainer's ZeRO group)."""
    tp, dp, b, pp, v = (np.asarray(x, dtype=float) for x in (tp, dp, micro_batch, pp, interleave))
    dp = dp * cp  # the replicas' group: where ZeRO and FSDP shard, gradients are averaged (parallel/mesh.py)
    r = TrainerRank(
        tp=tp,
        dp=dp,
        b=b,
        pp=pp,
        v=v,
        is_last=np.asarray(rank.is_last, dtype=float),
        is_first=(pp == 1).astype(float) if rank.is_first is None else np.asarray(rank.is_first, dtype=float),
        expert_here=np.asarray(rank.expert_params_here, dtype=float),
        moe_here=np.asarray(rank.moe_layers_here, dtype=float),
        params_here=np.asarray(rank.params_here, dtype=float) + np.asarray(rank.expert_params_here, dtype=float),
        layers_here=np.asarray(rank.layers_here, dtype=float),
        inflight_mb=np.asarray(rank.inflight_mb, dtype=float),
        fsdp=(dp > 1) & (zero_stage >= 2),  # the trainer shards with FSDP2 only when dp > 1
        zero_stage=zero_stage,
        recompute=recompute,
        sequence_parallel=sequence_parallel,
        num_microbatches=num_microbatches,
        on_cpu=on_cpu,
        cp=cp,
        ep=ep,
    )
    st = _trainer_states(m, run, r)
    acts = _trainer_activations(m, run, r, st)
    other = _trainer_other(m, run, r, st, acts)
    return st.weights, st.grads + st.accumulated, st.optim, acts, other


@dataclass(frozen=True)
class TrainerRank:
    """The layout and counts of one trainer rank that ``trainer_rank_memory``'s parts read: sizes as floats or numpy
    arrays (``dp`` the replicas' group, dp x cp; ``params_here`` with the routed experts), options as scalars."""

    tp: Any
    dp: Any
    b: Any
    pp: Any
    v: Any
    is_last: Any
    is_first: Any
    expert_here: Any
    moe_here: Any
    params_here: Any
    layers_here: Any
    inflight_mb: Any
    fsdp: Any
    zero_stage: int
    recompute: str
    sequence_parallel: bool
    num_microbatches: Any
    on_cpu: bool
    cp: int
    ep: int


@dataclass(frozen=True)
class _States:
    """A trainer rank's model states (``_trainer_states``) and what the later parts read from their count."""

    weights: Any
    grads: Any
    accumulated: Any
    optim: Any
    fp32_w: Any
    uncached: Any
    gathered: float
    layer_rank_params: Any
    shared: Any
    on_host: Any
    per1_gradients: float


def _trainer_states(m: ModelSpec, run: Resolved, r: TrainerRank) -> _States:
    """The rank's fp32 parameters, gradients (and FSDP's fp32 accumulation), optimizer states and 16-bit copies."""
    dtype, zero_stage, tp, dp, pp, fsdp = run.dtype, r.zero_stage, r.tp, r.dp, r.pp, r.fsdp
    params_here, is_first, is_last, h, V = r.params_here, r.is_first, r.is_last, m.hidden, m.vocab
    autocast = dtype in HALF_DTYPES
    per = state_bytes_per_param(dtype, zero_stage, dp)
    per1 = state_bytes_per_param(dtype, 0, 1)
    lp = layer_params(m)  # a MoE model's MoE layer: with its N/ep routed experts
    layer_rank_params = lp.sharded / tp + lp.replicated + lp.experts / r.ep
    # A rank's own fp32 parameters and gradients (sharded over dp by FSDP), optimizer states.
    fp32_w = params_here * np.where(fsdp, 4.0 / dp, 4.0)
    grads = params_here * np.where(fsdp, per.gradients, per1.gradients)
    # Without a pipeline FSDP reduces only after the step's last micro-batch (trainer.train._grad_sync), and under
    # one only after the stage's last backward (torch pipelining's ``perform_reduce_grad``): until then every
    # parameter's unsharded gradient is accumulated in fp32 (FSDP2's reduce dtype).
    many = np.asarray(2 if r.num_microbatches is None else r.num_microbatches, dtype=float) > 1
    accumulated = np.where(fsdp & ((pp > 1) | many), params_here * (4.0 - per.gradients), 0.0)
    optim = params_here * per.optimizer
    # FSDP2's CPUOffloadPolicy (--offload params) keeps the sharded fp32 parameters, their gradients and the Adam
    # states in host memory, where the optimizer steps (accounting.offload): none of them, nor the step's
    # temporaries, on the device.
    on_host = fsdp & (run.settings.offload == "params")
    fp32_w, grads, optim = (np.where(on_host, 0.0, x) for x in (fp32_w, grads, optim))
    # 16-bit weight copies. Autocast casts the weights of linear layers only (not norms, not
    # embedding tables unless the table is also this rank's head) and keeps them until the
    # backward; FSDP2 gathers every parameter in bf16: all of them from forward to backward
    # (ZeRO-2), or one layer while the next is prefetched (ZeRO-3).
    # (a tied table is the head's weight only without a pipeline: a V schedule's rank 0 holds both ends, two copies)
    shared = is_last * (np.asarray(pp) == 1)
    tables = is_first * (
        V * h / tp * ((1.0 - shared) if m.tied_embeddings else 1.0) + (m.seq_len * h if m.learned_positions else 0)
    )
    # A MoE layer's router computes in fp32 with autocast off: no 16-bit copy of it either.
    non_linear = (
        r.layers_here * (4 if m.has_bias else 2) * h
        + tables
        + is_last * (2 if m.has_bias else 1) * h
        + r.moe_here * (router_params(m) if m.is_moe else 0)
    )
    # Under a pipeline every backward leaves its layers gathered (``set_reshard_after_backward(False)``) until their
    # next forward: a stage's layers are all gathered at its backward's peak, as under ZeRO-2.
    gathered = 2.0 if autocast else 4.0
    copy_fsdp = gathered * np.where((zero_stage == 2) | (pp > 1), params_here, 2 * layer_rank_params)
    copy16 = np.where(fsdp, copy_fsdp, 2.0 * (params_here - non_linear) if autocast else 0.0)
    uncached = _uncached_copies(
        copy16,
        r.expert_here,
        tp=tp,
        fsdp=fsdp,
        zero_stage=zero_stage,
        autocast=autocast,
        recompute=r.recompute,
        replicas=dp,
    )
    return _States(
        fp32_w + copy16,
        grads,
        accumulated,
        optim,
        fp32_w,
        uncached,
        gathered,
        layer_rank_params,
        shared,
        on_host,
        per1.gradients,
    )


def _trainer_layers(m: ModelSpec, run: Resolved, r: TrainerRank):
    """(the rank's layers' activations for one micro-batch, the recomputed layer's working set, one layer's count)."""
    recompute = r.recompute
    kw = dict(
        sequence_parallel=r.sequence_parallel, flash=run.flash, dtype=run.dtype, on_cpu=r.on_cpu, cp=r.cp, ep=r.ep
    )

    def per_layer_bytes(mode: str, moe: bool = False):
        return trainer_layer_activation_bytes(m, r.b, r.tp, recompute=mode, moe=moe, **kw)

    per_layer = per_layer_bytes(recompute)
    layers_here, moe_here = r.layers_here, r.moe_here
    if m.is_moe:  # the layers' activations: dense and MoE layers each their own; the largest for a recompute
        stage_layers = (layers_here - moe_here) * per_layer + moe_here * per_layer_bytes(recompute, moe=True)
        recomputed = np.maximum(
            np.where(
                layers_here > moe_here, per_layer_bytes("none") - (per_layer if recompute == "selective" else 0.0), 0.0
            ),
            np.where(
                moe_here > 0,
                per_layer_bytes("none", moe=True)
                - (per_layer_bytes(recompute, moe=True) if recompute == "selective" else 0.0),
                0.0,
            ),
        )
    else:
        stage_layers = per_layer * layers_here
        recomputed = per_layer_bytes("none") - (per_layer if recompute == "selective" else 0.0)
    return stage_layers, recomputed, per_layer


def _trainer_activations(m: ModelSpec, run: Resolved, r: TrainerRank, st: _States):
    """Activations per micro-batch in flight, then the backward's working set (module doc)."""
    stage_layers, recomputed, per_layer = _trainer_layers(m, run, r)
    tp, pp, v, is_last, is_first, h, V = r.tp, r.pp, r.v, r.is_last, r.is_first, m.hidden, m.vocab
    e, autocast = COMPUTE_BYTES[run.dtype], run.dtype in HALF_DTYPES
    tokens = r.b * m.seq_len / r.cp  # a rank's tokens of a micro-batch
    sp_div = tp if r.sequence_parallel else 1.0
    stream = 2.0 if autocast else 4.0  # residual-stream bytes (see the module doc)
    final_norm = _norm_bytes(m, stream, r.on_cpu)
    # One micro-batch in flight: its layers; on the last stage the final norm's input and the
    # head's 16-bit input; on a pipeline stage that sends, its output (kept until its backward; the
    # input it received is the first norm's input, counted with the layer).
    sends = np.where(pp > 1, np.maximum(v - is_last, 0.0) / v, 0.0)
    per_mb = (
        stage_layers
        + is_last * tokens * (final_norm / sp_div + e * h)
        + sends * v * tokens * stream * h / sp_div
        + st.uncached
    )
    acts = per_mb * r.inflight_mb - st.uncached  # one set of the 16-bit copies is counted with the weights
    if r.num_microbatches is not None:
        # No backward before the activations peak (GPipe; 1F1B with m <= in flight): the gradients
        # are allocated only as the first backward frees its micro-batch, so the peak is the larger
        # of "all in flight, no gradients" and "one fewer in flight, all gradients".
        first = np.asarray(r.num_microbatches, dtype=float) <= r.inflight_mb
        acts = acts - np.where(first & (pp > 1), np.minimum(per_mb, st.grads), 0.0)
    if r.recompute != "none":
        # Backward recomputes one layer at a time, holding what that layer would have kept
        # without recomputation for one micro-batch (minus what selective already keeps).
        acts = acts + recomputed
    # The backward's working set, at its largest either at the loss (fp32 log-softmax output, the
    # loss gradient, the log-softmax gradient; under tp the vocabulary-parallel loss's four fp32 tensors,
    # accounting.memory.logits_bytes_per_element) or in the top layer's MLP: the weight gradient
    # (16-bit, then its fp32 copy under autocast), the input gradient, the fp32 gradient of the
    # residual stream; with a tied head and no pipeline the head's fp32 weight gradient waits for
    # the embedding's to be summed with it.
    loss_temps = is_last * tokens * V / tp * np.where(tp > 1, 16.0, 12.0)
    wide = max(m.ffn_hidden, h)
    working = (
        (6.0 if autocast else 4.0) * wide * h / tp
        + e * tokens * wide / tp
        + 4.0 * tokens * h / sp_div
        + (is_first * st.shared * 4.0 * V * h / tp if m.tied_embeddings else 0.0)
        - is_last * tokens * (final_norm / sp_div + e * h)
    )  # the head's inputs are freed by then
    # FSDP reduce-scatters each layer's gradient in fp32 right after its backward, once that
    # layer's activations and gathered weights are freed: the unsharded fp32 gradient and its shard.
    # (Under a pipeline the stage reduces once, after its last backward: no per-layer transient.)
    reduce_scatter = np.where(
        r.fsdp & (pp == 1), (4.0 + 4.0 / r.dp - st.gathered) * st.layer_rank_params - per_layer, 0.0
    )
    return acts + np.maximum(np.maximum(loss_temps, working), reduce_scatter)


def _trainer_other(m: ModelSpec, run: Resolved, r: TrainerRank, st: _States, acts):
    """Buffers (a pipeline's gradient receive, DDP's buckets), the step's transients after the backward
    (gradient norm, optimizer update) above the backward's peak, and the allocator allowance."""
    tp, dp, pp, h, V, fsdp = r.tp, r.dp, r.pp, m.hidden, m.vocab, r.fsdp
    tokens = r.b * m.seq_len / r.cp
    sp_div = tp if r.sequence_parallel else 1.0
    stream = 2.0 if run.dtype in HALF_DTYPES else 4.0
    # A pipeline stage receives one activation gradient at a time.
    p2p = np.where(pp > 1, tokens * stream * h / sp_div, 0.0)
    # DDP (ZeRO-0/1 over dp x cp > 1 without a pipeline or experts: parallel/build.py) keeps its
    # reducer's buckets, one more copy of every gradient (the trainer's DDP does not view the
    # gradients into them: gradient_as_bucket_view is off), from its first step on.
    ddp = (pp == 1) & (dp > 1) & (r.zero_stage < 2) & (r.ep == 1)
    buckets = np.where(ddp, r.params_here * st.per1_gradients, 0.0)
    p2p = p2p + buckets
    peak_a = st.weights + st.grads + st.accumulated + st.optim + acts + p2p
    # ---- after the backward: gradient norm and optimizer update ----
    # A float64 square of the largest gradient; AdamW's square-root and division temporaries, for
    # all parameters at once (foreach, accelerators) or the largest one (the CPU's per-tensor loop).
    # The 16-bit weight copies are gone by then.
    holds_table = np.maximum(r.is_first, r.is_last)  # the embedding, or the head (its own or a tied copy)
    largest = np.maximum(holds_table * V * h, max(m.ffn_hidden, h) * h) / tp
    if m.is_moe:  # a stacked expert weight [N/ep, f, h], whole on every tp rank; per-layer expert params / 3
        moe_here = r.moe_here
        largest = np.maximum(largest, np.where(moe_here > 0, r.expert_here / np.maximum(moe_here, 1.0) / 3.0, 0.0))
    largest = largest / np.where(fsdp, dp, 1.0)
    states = st.fp32_w + st.grads + st.optim + buckets
    opt_local = np.where(r.zero_stage >= 1, r.params_here / dp, r.params_here)
    peak_clip = states + 16.0 * largest
    peak_opt = states + (8.0 * largest if r.on_cpu else 4.0 * opt_local)
    transient = np.where(st.on_host, 0.0, np.maximum(0.0, np.maximum(peak_clip, peak_opt) - peak_a))
    return p2p + transient + FRAGMENTATION_ALLOWANCE * (peak_a + transient)


def _uncached_copies(copy16, expert_here, *, tp, fsdp, zero_stage: int, autocast: bool, recompute: str, replicas):
    """Bytes of 16-bit weight copies each micro-batch's forward makes afresh and keeps to its backward.

    Autocast caches the cast of a leaf parameter for its whole region (a pipeline step runs in one),
    so one copy serves every micro-batch. It caches nothing else: the routed experts' weights are
    cast explicitly per call (moe.grouped_linear), and with tensor parallelism and ZeRO-0/1 over
    dp x cp > 1 every sharded parameter is stored as a local shard and read through a
    parametrization (parallel/data.py ``FromLocal``: a new, non-leaf DTensor per read), so every
    linear weight is cast again by each forward. A rank then holds one set of these copies per
    micro-batch in flight (none under full recomputation, whose forward keeps nothing)."""
    if not autocast or recompute == "full":
        return 0.0
    localized = (tp > 1) & (replicas > 1) & (zero_stage < 2)
    return np.where(fsdp, 0.0, np.where(localized, copy16, 2.0 * expert_here))


def trainer_memory_by_stage(plan: Plan, *, on_cpu: bool | None = None) -> tuple[MemoryBreakdown, ...]:
    return tuple(trainer_stage_memory(plan, r, on_cpu=on_cpu) for r in range(plan.pp))


__all__ = [
    "plan_on_cpu",
    "trainer_layer_activation_bytes",
    "trainer_memory_by_stage",
    "trainer_rank_memory",
    "trainer_stage_memory",
]
