"""Bytes each communication moves per rank per optimizer step, and the collectives behind them.

Ring algorithms (Patarasuk & Yuan 2009; what NCCL/RCCL use at these sizes): an all-reduce of
S bytes over n ranks sends 2(n-1)/n * S per rank, an all-gather or reduce-scatter (n-1)/n * S.
An all-to-all of an S-byte buffer keeps 1/n of it and sends the other (n-1)/n * S (balanced).

Expert and context parallelism add their own traffic (``moe_collectives_for``,
``cp_collectives_for``; the layouts are those of ``accounting.moe`` and ``accounting.context``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exatrain.catalog.models import ModelSpec
from exatrain.plan import Plan
from exatrain.accounting import context, moe
from exatrain.accounting.dtypes import COMPUTE_BYTES
from exatrain.accounting.params import embedding_params, stage_params, stage_params_split

GRAD_BYTES = 4  # gradients are reduced in fp32 (see memory.py's byte convention)


@dataclass(frozen=True)
class Collective:
    """``count`` collectives of one kind, each over ``group`` ranks on a ``message_bytes`` buffer."""

    kind: str  # all_reduce | all_gather | reduce_scatter | send_recv | broadcast | all_to_all
    group: int
    message_bytes: float  # all_gather / reduce_scatter: the whole (gathered) buffer; all_to_all: one rank's buffer
    count: float
    axis: str = "dp"  # which ranks: tp, dp, ep, etp, cp or edp group, pp neighbours, or the pipeline's two ends

    @property
    def bytes_per_rank(self):
        """Bytes one rank sends for all ``count`` collectives (arrays in, arrays out)."""
        if self.kind == "send_recv":
            return self.message_bytes * self.count
        n = np.asarray(self.group, dtype=float)
        steps = 2.0 if self.kind == "all_reduce" else 1.0
        return np.where(n > 1, steps * (n - 1) / np.maximum(n, 1) * self.message_bytes * self.count, 0.0)


def tp_collectives(plan: Plan, pp_rank: int, engine=None) -> tuple[Collective, ...]:
    """Megatron TP (Shoeybi et al. 2019 Sec. 3; Korthikanti et al. 2022 Sec. 4.2.2): per layer and
    micro-batch, 2 all-reduces of b*s*h in forward and 2 in backward (with sequence parallelism
    each becomes an all-gather + reduce-scatter of the same total); full recomputation repeats the
    forward's (in the layers it covers: ``Plan.recomputed_layers_of_rank``), selective recomputation by module the
    pair of each rerun module that holds one (``Plan.recompute_modules``: a dense layer's MLP; a MoE layer's shared
    experts, or its MLP all-reduce without SP). The vocab-parallel embedding adds one forward all-reduce on the
    first stage, the head one backward all-reduce on the last; the loss all-reduces 3 fp32 numbers per token.
    ``engine`` (an ``EngineProfile``; None: exatrain's trainer) adds what its runtime sends beyond that,
    as ``cost.step.stage_times`` prices it: torchtitan's per-op selective recomputation repeats the
    forward's all-gathers (all-reduces without SP), and its tensorwise FP8 sends the forward's all-gathers
    in FP8, one byte an element (``EngineProfile.fp8_tp_gather``)."""
    t = plan.tp
    if t == 1:
        return ()
    m, b = plan.model, plan.micro_batch
    e = COMPUTE_BYTES[plan.dtype]
    msg = b * m.seq_len * m.hidden * e
    mb = plan.num_microbatches
    layers = sum(plan.layers_per_stage()[v] for v in plan.stages_of_rank(pp_rank))
    per_op = engine is not None and engine.reruns_tp_gathers(plan.recompute, m.is_moe)
    fp8_gather = engine is not None and engine.gathers_tp_in_fp8(plan.fp8)
    # the forward's pairs again: a full recomputation's layers (two a layer), a module rerun's own
    again = 2 * plan.recomputed_layers_of_rank(pp_rank) + _module_pairs(plan, pp_rank)
    out: list[Collective] = []
    if plan.sequence_parallel:
        forward_ag = (2 * layers + again + (2 * layers if per_op else 0)) * mb  # the forward's and reruns'
        out += [
            Collective("all_gather", t, msg / e if fp8_gather else msg, forward_ag, "tp"),
            Collective("all_gather", t, msg, 2 * layers * mb, "tp"),  # the backward's (output gradients)
            Collective("reduce_scatter", t, msg, (4 * layers + again) * mb, "tp"),
        ]
    else:
        out.append(Collective("all_reduce", t, msg, (4 * layers + again + (2 * layers if per_op else 0)) * mb, "tp"))
    if pp_rank == 0:
        out.append(Collective("all_reduce" if not plan.sequence_parallel else "reduce_scatter", t, msg, mb, "tp"))
    if pp_rank == plan.pp - 1:
        out.append(Collective("all_reduce" if not plan.sequence_parallel else "reduce_scatter", t, msg, mb, "tp"))
        out.append(Collective("all_reduce", t, 3 * 4 * b * m.seq_len, mb, "tp"))
    return tuple(out)


def module_rerun_tp_pairs(m: ModelSpec, modules: tuple[str, ...], sequence_parallel) -> tuple[object, object]:
    """(per dense layer, per MoE layer) TP collective pairs (forward's all-gather + reduce-scatter, or all-reduce
    without sequence parallelism) a rerun of ``modules`` repeats, as ``cost.step.stage_times`` counts a layer's
    collectives: a dense layer's MLP ("mlp": its checkpoint holds the pair, Transformer Engine's linears run them);
    a MoE layer's shared experts' pair under sequence parallelism, its MLP all-reduce without ("moe", or
    "shared_experts" where it has shared experts)."""
    sp = np.asarray(sequence_parallel, dtype=bool)
    dense = 1.0 if "mlp" in modules else 0.0
    mods = set(modules)
    rerun = "moe" in mods or ("shared_experts" in mods and m.shared_experts)
    moe = np.where(sp, 1.0 if m.shared_experts else 0.0, 1.0) * (1.0 if rerun and m.is_moe else 0.0)
    return dense, moe


def _module_pairs(plan: Plan, pp_rank: int) -> float:
    """TP collective pairs per micro-batch that rerunning ``plan.recompute_modules`` repeats on ``pp_rank``
    (``module_rerun_tp_pairs``, per dense and per MoE layer)."""
    if plan.recompute != "selective" or not plan.recompute_modules:
        return 0.0
    from exatrain.accounting.params import stage_layer_kinds

    dense, moe = stage_layer_kinds(
        plan.model, pp=plan.pp, interleave=plan.interleave, layers_per_stage=plan.layers_per_stage()
    )[pp_rank]
    per_dense, per_moe = module_rerun_tp_pairs(plan.model, plan.recompute_modules, plan.sequence_parallel)
    return float(per_dense * dense + per_moe * moe)


def pp_collectives(plan: Plan, pp_rank: int) -> tuple[Collective, ...]:
    """Point-to-point: each forward chunk sends its output activation to the next virtual stage and
    each backward chunk its input gradient to the previous one, b*s*h per micro-batch (divided by
    tp with sequence parallelism: the scatter/gather optimisation of Narayanan et al. 2021 Sec. 4.1)."""
    if plan.pp == 1:
        return ()
    m, b = plan.model, plan.micro_batch
    e = COMPUTE_BYTES[plan.dtype]
    msg = b * m.seq_len * m.hidden * e / (plan.tp if plan.sequence_parallel else 1)
    last = plan.virtual_stages - 1
    sends = 0
    for v in plan.stages_of_rank(pp_rank):
        sends += (v != last) + (v != 0)  # forward output (not from the last), input grad (not from the first)
    return (Collective("send_recv", 2, msg, sends * plan.num_microbatches, "pp"),)


def dp_collectives(plan: Plan, pp_rank: int) -> tuple[Collective, ...]:
    """The DP collectives of one rank of pipeline stage ``pp_rank``, once per step (see
    ``dp_collectives_for``; a MoE model's experts whole on every rank: ep is counted by ``dp_collective_times`` of
    ``cost.step``)."""
    if plan.model.is_moe:
        dense, experts = stage_params_split(
            plan.model, tp=plan.tp, pp=plan.pp, interleave=plan.interleave, layers_per_stage=plan.layers_per_stage()
        )[pp_rank]
        return dp_collectives_for(
            plan.model,
            tp=plan.tp,
            pp=plan.pp,
            dp=plan.dp,
            zero_stage=plan.zero_stage,
            num_microbatches=plan.num_microbatches,
            dtype=plan.dtype,
            params_here=dense,
            pipeline_end=pp_rank in (0, plan.pp - 1),
            expert_params_here=experts,
        )
    return dp_collectives_for(
        plan.model,
        tp=plan.tp,
        pp=plan.pp,
        dp=plan.dp,
        zero_stage=plan.zero_stage,
        num_microbatches=plan.num_microbatches,
        dtype=plan.dtype,
        params_here=stage_params(plan)[pp_rank],
        pipeline_end=pp_rank in (0, plan.pp - 1),
    )


def dp_collectives_for(
    m: ModelSpec,
    *,
    tp,
    pp,
    dp,
    zero_stage: int,
    num_microbatches,
    dtype: str,
    params_here,
    pipeline_end: bool,
    cp=1,
    ep=1,
    etp=1,
    expert_params_here=0,
) -> tuple[Collective, ...]:
    """Gradient reduction and parameter gathers over the data-parallel group, per step; sizes may be
    numpy arrays (one entry per candidate plan).

    ZeRO-0: all-reduce of fp32 gradients. ZeRO-1 (ZeroRedundancyOptimizer): the same all-reduce,
    then each rank broadcasts its updated shard. ZeRO-2: reduce-scatter gradients, all-gather the
    16-bit compute weights once. ZeRO-3: all-gather weights in forward and again in backward of
    every micro-batch, reduce-scatter the accumulated gradients once (Rajbhandari et al. 2020
    Sec. 7: 1.5x ZeRO-0's volume with one micro-batch).
    A tied head with pp > 1 adds an all-reduce of the embedding gradient between the two ends.

    With context parallelism the group is dp*cp (ranks holding the same weights; Megatron-Core's
    data-parallel group with context parallelism). A MoE model's routed-expert parameters
    (``expert_params_here``) go through the same collectives over the expert-data-parallel group
    ``moe.expert_dp(tp, dp, ep, etp, cp)`` (axis "edp")."""
    out = _state_collectives(zero_stage, dp * cp, params_here, dtype, num_microbatches, "dp")
    if m.is_moe:
        out += _state_collectives(
            zero_stage, moe.expert_dp(tp, dp, ep, etp, cp), expert_params_here, dtype, num_microbatches, "edp"
        )
    if m.tied_embeddings and pipeline_end:
        ends = np.where(np.asarray(pp) > 1, 1.0, 0.0)
        out.append(Collective("all_reduce", 2, embedding_params(m) / np.asarray(tp) * GRAD_BYTES, ends, axis="pp-ends"))
    return tuple(out)


def _state_collectives(zero_stage: int, group, params, dtype: str, num_microbatches, axis: str) -> list[Collective]:
    w_bytes = COMPUTE_BYTES[dtype]
    grads = params * GRAD_BYTES
    if zero_stage in (0, 1):
        out = [Collective("all_reduce", group, grads, 1, axis)]
        if zero_stage == 1:
            out.append(Collective("broadcast", group, params * 4, 1, axis))
    elif zero_stage == 2:
        out = [
            Collective("reduce_scatter", group, grads, 1, axis),
            Collective("all_gather", group, params * w_bytes, 1, axis),
        ]
    else:
        out = [
            Collective("reduce_scatter", group, grads, 1, axis),
            Collective("all_gather", group, params * w_bytes, 2 * np.asarray(num_microbatches), axis),
        ]
    return out


def moe_collectives_for(
    m: ModelSpec,
    *,
    micro_batch,
    tp,
    ep,
    etp=1,
    cp=1,
    sequence_parallel: bool,
    dtype: str,
    moe_layers,
    num_microbatches,
    recompute: str = "none",
    capacity_factor=1.0,
    rerun=None,
) -> tuple[Collective, ...]:
    """Token traffic of a rank's ``moe_layers`` MoE layers per step (Megatron-Core's all-to-all token
    dispatcher, megatron/core/transformer/moe/token_dispatcher.py): per layer and micro-batch the
    forward dispatches (all-to-all over ep) and combines (all-to-all back) T*top_k token copies of h
    elements (``moe.a2a_message_bytes``), and the backward does both again on the gradients; full
    recomputation repeats the forward's (``rerun``: the share of the layers whose forward runs again, where not
    every layer's or none: Plan.recompute_layers, the "moe" module). With etp > 1 the dispatched copies are
    all-gathered over the etp group and the experts' outputs reduce-scattered, once each way in forward and in
    backward."""
    msg = moe.a2a_message_bytes(
        m, micro_batch, tp, sequence_parallel=sequence_parallel, dtype=dtype, cp=cp, capacity_factor=capacity_factor
    )
    passes = 2 + ((1 if recompute == "full" else 0) if rerun is None else rerun)  # forward, backward, rerun forward
    n = passes * np.asarray(moe_layers) * np.asarray(num_microbatches)
    out = [Collective("all_to_all", ep, msg, 2 * n, axis="ep")]
    if np.any(np.asarray(etp) > 1):
        gathered = msg * etp
        out += [
            Collective("all_gather", etp, gathered, n, axis="etp"),
            Collective("reduce_scatter", etp, gathered, n, axis="etp"),
        ]
    return tuple(out)


def cp_collectives_for(
    m: ModelSpec,
    *,
    micro_batch,
    tp,
    cp,
    dtype: str,
    layers,
    num_microbatches,
    comm: str = "p2p",
    recompute: str = "none",
    rerun=None,
) -> tuple[Collective, ...]:
    """Key/value traffic of a rank's ``layers`` attention layers per step under context parallelism
    (``accounting.context``): the ring sends cp-1 K,V blocks forward and cp-1 K,V plus cp-1 dK,dV
    blocks backward per layer and micro-batch; the all-gather variant gathers the whole K,V forward
    and again backward and reduce-scatters dK,dV; the all-to-all variant trades Q,K,V before attention
    and the output after it, forward and (as gradients) backward. Full recomputation repeats the forward's
    (``rerun``: in that share of the layers, Plan.recompute_layers; None: all of them)."""
    block = context.kv_block_bytes(m, micro_batch, tp, cp, dtype)
    n = np.asarray(layers) * np.asarray(num_microbatches)
    again = (1 if recompute == "full" else 0) if rerun is None else rerun
    if comm == "a2a":
        qkv, out = context.a2a_tensor_bytes(m, micro_batch, tp, cp, dtype)
        passes = 2 + again
        return (
            Collective("all_to_all", cp, qkv, passes * n, axis="cp"),
            Collective("all_to_all", cp, out, passes * n, axis="cp"),
        )
    if comm == "p2p":
        fwd, bwd = context.cp_sends_per_layer(cp, comm=comm)
        return (Collective("send_recv", cp, block, ((1 + again) * fwd + bwd) * n, axis="cp"),)
    context.cp_sends_per_layer(cp, comm=comm)  # validates comm
    gathers = 2 + again
    whole = block * np.asarray(cp, dtype=float)
    return (
        Collective("all_gather", cp, whole, gathers * n, axis="cp"),
        Collective("reduce_scatter", cp, whole, n, axis="cp"),
    )


def tp_collectives_per_layer(m: ModelSpec, *, moe: bool, sequence_parallel: bool, recompute: str = "none") -> int:
    """Tensor-parallel collectives of one layer per micro-batch (forward + backward; see
    ``tp_collectives``): 2 forward and 2 backward for a dense layer. In a MoE layer under sequence
    parallelism the routed experts need none (each tp rank routes its own 1/tp of the tokens, and
    expert tensor parallelism has its own group): only the attention's pair and the shared experts'
    (Megatron-Core MoELayer). Full recomputation repeats the forward's."""
    if moe and m.is_moe and sequence_parallel:
        forward = 1 + (1 if m.shared_experts else 0)
    else:
        forward = 2
    return 2 * forward + (forward if recompute == "full" else 0)


def comm_bytes_per_rank(plan: Plan, engine=None) -> dict[str, float]:
    """Bytes sent per step by the busiest rank, per kind of parallelism (``engine``: see ``tp_collectives``)."""
    out = {"tp": max(float(sum(c.bytes_per_rank for c in tp_collectives(plan, r, engine))) for r in range(plan.pp))}
    for kind, fn in (("pp", pp_collectives), ("dp", dp_collectives)):
        out[kind] = max(float(sum(c.bytes_per_rank for c in fn(plan, r))) for r in range(plan.pp))
    return out
