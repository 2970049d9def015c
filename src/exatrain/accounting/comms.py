"""Bytes each communication moves per rank per optimizer step, and the collectives behind them.

Ring algorithms (Patarasuk & Yuan 2009; what NCCL/RCCL use at these sizes): an all-reduce of
S bytes over n ranks sends 2(n-1)/n * S per rank, an all-gather or reduce-scatter (n-1)/n * S.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exatrain.catalog.models import ModelSpec
from exatrain.plan import Plan
from exatrain.accounting.memory import COMPUTE_BYTES
from exatrain.accounting.params import embedding_params, stage_params

GRAD_BYTES = 4  # gradients are reduced in fp32 (see memory.py's byte convention)


@dataclass(frozen=True)
class Collective:
    """``count`` collectives of one kind, each over ``group`` ranks on a ``message_bytes`` buffer."""

    kind: str  # all_reduce | all_gather | reduce_scatter | send_recv | broadcast
    group: int
    message_bytes: float
    count: float
    axis: str = "dp"  # which ranks: tp group, dp group, pp neighbours, or the pipeline's two ends

    @property
    def bytes_per_rank(self):
        """Bytes one rank sends for all ``count`` collectives (arrays in, arrays out)."""
        if self.kind == "send_recv":
            return self.message_bytes * self.count
        n = np.asarray(self.group, dtype=float)
        steps = 2.0 if self.kind == "all_reduce" else 1.0
        return np.where(n > 1, steps * (n - 1) / np.maximum(n, 1) * self.message_bytes * self.count, 0.0)


def tp_collectives(plan: Plan, pp_rank: int) -> tuple[Collective, ...]:
    """Megatron TP (Shoeybi et al. 2019 Sec. 3; Korthikanti et al. 2022 Sec. 4.2.2): per layer and
    micro-batch, 2 all-reduces of b*s*h in forward and 2 in backward (with sequence parallelism
    each becomes an all-gather + reduce-scatter of the same total); full recomputation repeats the
    forward's. The vocab-parallel embedding adds one forward all-reduce on the first stage, the
    head one backward all-reduce on the last; the loss all-reduces 3 fp32 numbers per token."""
    t = plan.tp
    if t == 1:
        return ()
    m, b = plan.model, plan.micro_batch
    e = COMPUTE_BYTES[plan.dtype]
    msg = b * m.seq_len * m.hidden * e
    mb = plan.num_microbatches
    layers = sum(plan.layers_per_stage()[v] for v in plan.stages_of_rank(pp_rank))
    per_layer = 4 + (2 if plan.recompute == "full" else 0)
    out: list[Collective] = []
    if plan.sequence_parallel:
        out += [Collective("all_gather", t, msg, per_layer * layers * mb, "tp"),
                Collective("reduce_scatter", t, msg, per_layer * layers * mb, "tp")]
    else:
        out.append(Collective("all_reduce", t, msg, per_layer * layers * mb, "tp"))
    if pp_rank == 0:
        out.append(Collective("all_reduce" if not plan.sequence_parallel else "reduce_scatter", t, msg, mb, "tp"))
    if pp_rank == plan.pp - 1:
        out.append(Collective("all_reduce" if not plan.sequence_parallel else "reduce_scatter", t, msg, mb, "tp"))
        out.append(Collective("all_reduce", t, 3 * 4 * b * m.seq_len, mb, "tp"))
    return tuple(out)


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
    ``dp_collectives_for``)."""
    return dp_collectives_for(plan.model, tp=plan.tp, pp=plan.pp, dp=plan.dp, zero_stage=plan.zero_stage,
                              num_microbatches=plan.num_microbatches, dtype=plan.dtype,
                              params_here=stage_params(plan)[pp_rank],
                              pipeline_end=pp_rank in (0, plan.pp - 1))


def dp_collectives_for(m: ModelSpec, *, tp, pp, dp, zero_stage: int, num_microbatches, dtype: str,
                       params_here, pipeline_end: bool) -> tuple[Collective, ...]:
    """Gradient reduction and parameter gathers over the data-parallel group, per step; sizes may be
    numpy arrays (one entry per candidate plan).

    ZeRO-0: all-reduce of fp32 gradients. ZeRO-1 (ZeroRedundancyOptimizer): the same all-reduce,
    then each rank broadcasts its updated shard. ZeRO-2: reduce-scatter gradients, all-gather the
    16-bit compute weights once. ZeRO-3: all-gather weights in forward and again in backward of
    every micro-batch, reduce-scatter the accumulated gradients once (Rajbhandari et al. 2020
    Sec. 7: 1.5x ZeRO-0's volume with one micro-batch).
    A tied head with pp > 1 adds an all-reduce of the embedding gradient between the two ends."""
    w_bytes = COMPUTE_BYTES[dtype]
    grads = params_here * GRAD_BYTES
    if zero_stage in (0, 1):
        out = [Collective("all_reduce", dp, grads, 1)]
        if zero_stage == 1:
            out.append(Collective("broadcast", dp, params_here * 4, 1))
    elif zero_stage == 2:
        out = [Collective("reduce_scatter", dp, grads, 1), Collective("all_gather", dp, params_here * w_bytes, 1)]
    else:
        out = [Collective("reduce_scatter", dp, grads, 1),
               Collective("all_gather", dp, params_here * w_bytes, 2 * np.asarray(num_microbatches))]
    if m.tied_embeddings and pipeline_end:
        ends = np.where(np.asarray(pp) > 1, 1.0, 0.0)
        out.append(Collective("all_reduce", 2, embedding_params(m) / np.asarray(tp) * GRAD_BYTES, ends,
                              axis="pp-ends"))
    return tuple(out)


def comm_bytes_per_rank(plan: Plan) -> dict[str, float]:
    """Bytes sent per step by the busiest rank, per kind of parallelism."""
    out = {}
    for kind, fn in (("tp", tp_collectives), ("pp", pp_collectives), ("dp", dp_collectives)):
        out[kind] = max(float(sum(c.bytes_per_rank for c in fn(plan, r))) for r in range(plan.pp))
    return out
