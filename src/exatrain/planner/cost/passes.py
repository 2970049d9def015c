"""The engine's passes over a rank's parameters every micro-batch in the step time (``with_parameter_passes``):
its accumulation of gradients outside the GEMMs, autograd's adds into a kept .grad, autocast's weight casts and
FSDP2's copies around its gathers and reductions, each an element-wise pass at the element-wise kernels'
bandwidth (``compute.elementwise_time_s``), added to the stages' forward and backward."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from exatrain.layout_arrays import among
from exatrain.catalog.models import ModelSpec
from exatrain.planner.cost import compute
from exatrain.planner.cost.stage import StageTimes
from exatrain.settings import HALF_DTYPES, RECOMPUTE


def with_accumulation(st: StageTimes, engine, dtype: str, params_by_rank, v: int, dev: compute.Device) -> StageTimes:
    """``st`` with each micro-batch's backward ending in the pass an engine makes over its virtual stage's
    gradients to accumulate them outside the GEMMs (``EngineProfile.accum_pass``, bytes a parameter; a rank's
    parameters ``params_by_rank`` (N, pp) split evenly over its ``v`` virtual stages), at the element-wise
    kernels' bandwidth; unchanged where the engine makes none."""
    accum = engine.accum_pass(dtype)
    if not accum:
        return st
    return replace(st, bwd=st.bwd + compute.elementwise_time_s(accum * _per_stage(params_by_rank, v), dev))


def _per_stage(params_by_rank, v: int) -> np.ndarray:
    """(N, pp) parameters of a rank -> (N, pp * v) of each of its virtual stages, split evenly."""
    return np.tile(np.asarray(params_by_rank, dtype=float) / v, (1, v))


# Bytes an element of the parameter passes moves (EngineProfile.autocast_casts, autograd_accum, fsdp_pass_zero): a
# weight cast fp32 -> bf16 (read 4, write 2), its gradient cast back (read 2, write 4), an fp32 add into .grad
# (read 4 + 4, write 4), a bf16 gradient added into an fp32 one (read 2 + 4, write 4), a 16-bit copy (read 2, write
# 2), an fp32 copy (read 4, write 4)
CAST_BYTES_FP32_BF16 = 6.0
GRAD_ADD_BYTES_FP32 = 12.0
GRAD_ADD_BYTES_BF16_INTO_FP32 = 10.0
COPY_BYTES_BF16 = 4.0
COPY_BYTES_FP32 = 8.0


def cast_params(model: ModelSpec, tp, pp: int, params_by_rank) -> tuple[np.ndarray, np.ndarray]:
    """(the parameters of each rank (N, pp) a GEMM reads as weights, those of them in its transformer blocks):
    ``params_by_rank`` without the input embedding table and the learned positions (looked up, never a GEMM's
    weight; a tied table on a single stage is the head's weight too), and, for the blocks, without the head
    and the final norm either. The norms' parameters inside the blocks stay counted (autocast leaves them fp32;
    they are 2h to 4h of a layer's ~12h^2)."""
    from exatrain.accounting.params import embedding_params, final_norm_params, head_params, position_params

    tp = np.asarray(tp, dtype=np.int64).reshape(-1, 1)
    rank = np.arange(pp)[None, :]
    params = np.asarray(params_by_rank, dtype=float)
    table = 0 if (model.tied_embeddings and pp == 1) else embedding_params(model)
    looked_up = np.where(rank == 0, table // tp + position_params(model), 0)
    gemm = params - looked_up
    head = embedding_params(model) // tp if model.tied_embeddings else head_params(model) // tp
    blocks = gemm - np.where(rank == pp - 1, head + final_norm_params(model), 0)
    return gemm, blocks


def _v_looped(st: StageTimes, p: int) -> StageTimes:
    """A V placement's stage times reordered as the looped placement lays them out (chunk c of rank r at c pp + r:
    rank r's stages r and 2 pp - 1 - r), so that per-rank sums and spreads apply; its own inverse."""
    perm = np.concatenate([np.arange(p), np.arange(2 * p - 1, p - 1, -1)])
    return replace(
        st,
        **{
            f: getattr(st, f)[:, perm]
            for f in ("fwd", "bwd", "wgrad", "tp_fwd", "tp_bwd", "tp_hidden", "ext_fwd", "ext_bwd", "ep_share")
            if np.ndim(getattr(st, f)) == 2 and np.shape(getattr(st, f))[1] == 2 * p
        },
    )


def with_parameter_passes(
    st: StageTimes,
    engine,
    dtype: str,
    model: ModelSpec,
    tp,
    params_by_rank,
    v: int,
    m,
    zero,
    recompute,
    dev: compute.Device,
    shard=1,
    side_streams: bool = True,
    v_shape: bool = False,
) -> StageTimes:
    """``st`` with the passes an engine makes over its parameters every micro-batch (rank parameters
    ``params_by_rank`` (N, pp), tp (N,), ``m`` micro-batches, ``zero`` stages, ``recompute`` indices, FSDP's
    ``shard`` size (N,)), spread evenly over a step's micro-batches: its accumulation outside the GEMMs
    (``with_accumulation``); autograd's adds into a kept 16-bit .grad after the first micro-batch
    (``EngineProfile.later_accum``, DeepSpeed at ZeRO-0/1); at the ZeRO stages that keep fp32 parameters whole
    (``EngineProfile.param_pass_zero``, DDP) autocast's weight casts (bfloat16 training: the forward, a full
    recomputation's rerun of the blocks, the gradients back in the backward) and autograd's fp32 adds into .grad after
    the first micro-batch; at those FSDP2 shards (``fsdp_pass_zero``, bfloat16 training) each gather's copies into and
    out of its buffer (the shard cast to bf16, the gathered weights copied out; ZeRO-3 gathers again in the backward),
    the unsharded gradients kept in fp32 between micro-batches (the first cast, each later one added) and the last
    backward's copies into and out of the reduce-scatter. With ``side_streams`` (a GPU) FSDP2 runs two of those beside
    the compute, on its own streams (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py): each gather's copy-in of
    the shard (all_gather_copy_in_stream) and the reduce-scatter output's copy into the shard's .grad (the
    reduce-scatter stream); they lengthen the collectives they feed, not the compute, and are left out here. The
    gathered weights' copy-out and the reduce-scatter's copy-in run on the compute stream. Without streams (the
    CPU) every copy is in line. An FSDP1 engine (``EngineProfile.flat_param_grad_copy``) copies every backward's
    gradients into its units' flat gradients on the compute stream (``flat_grad_copy_bytes``). ``v_shape``: the
    stages are placed in a V (rank r: r and 2 pp - 1 - r), each rank's passes spread over its own two."""
    if v_shape:
        p = np.shape(params_by_rank)[-1]
        return _v_looped(
            with_parameter_passes(
                _v_looped(st, p),
                engine,
                dtype,
                model,
                tp,
                params_by_rank,
                v,
                m,
                zero,
                recompute,
                dev,
                shard=shard,
                side_streams=side_streams,
            ),
            p,
        )
    st = with_accumulation(st, engine, dtype, params_by_rank, v, dev)
    st = _with_grad_copies(st, engine, dtype, params_by_rank, v, m, zero, dev)
    if not (engine.autocast_casts or engine.autograd_accum or engine.fsdp_pass_zero):
        return st
    z = np.asarray(zero).reshape(-1)
    m = np.asarray(m, dtype=float).reshape(-1, 1)
    params = np.asarray(params_by_rank, dtype=float)
    fwd, bwd = _ddp_pass_bytes(engine, dtype, model, tp, params, m, z, recompute)
    if dtype in HALF_DTYPES and engine.fsdp_pass_zero:
        fwd, bwd = _fsdp_pass_bytes(engine, params, m, z, shard, side_streams, fwd, bwd)
    fwd_s = compute.elementwise_time_s(_per_stage(fwd, v), dev)
    bwd_s = compute.elementwise_time_s(_per_stage(bwd, v), dev)
    return replace(st, fwd=st.fwd + fwd_s, bwd=st.bwd + bwd_s)


def _with_grad_copies(st: StageTimes, engine, dtype: str, params_by_rank, v: int, m, zero, dev) -> StageTimes:
    """``st`` with FSDP1's copy of every backward's gradients into its units' flat gradients
    (``EngineProfile.flat_grad_copy_bytes``) and autograd's adds into a kept 16-bit .grad from the second
    micro-batch on (``EngineProfile.later_accum``), each on the compute stream."""
    flat = engine.flat_grad_copy_bytes(dtype)
    if flat:  # FSDP1: autograd builds each unit's flat gradient from its views, every backward, on the compute stream
        st = replace(st, bwd=st.bwd + compute.elementwise_time_s(flat * _per_stage(params_by_rank, v), dev))
    later = engine.later_accum(dtype, np.asarray(zero).reshape(-1, 1))
    if np.any(later):  # autograd's adds into a kept 16-bit .grad from the second micro-batch on
        m_ = np.asarray(m, dtype=float).reshape(-1, 1)
        adds = later * (m_ - 1) / m_ * np.asarray(params_by_rank, dtype=float)
        st = replace(st, bwd=st.bwd + compute.elementwise_time_s(_per_stage(adds, v), dev))
    return st


def _ddp_pass_bytes(engine, dtype: str, model: ModelSpec, tp, params, m, z, recompute):
    """(forward, backward) bytes a micro-batch moves per rank (N, pp) at the ZeRO stages that keep fp32 parameters
    whole (``EngineProfile.param_pass_zero``): autocast's weight casts and autograd's fp32 adds into .grad."""
    ddp = among(z, engine.param_pass_zero)[:, None]
    gemm, blocks = cast_params(model, tp, params.shape[1], params)
    fwd = np.zeros_like(gemm)
    bwd = GRAD_ADD_BYTES_FP32 * (m - 1) / m * params if engine.autograd_accum else 0.0 * gemm
    if engine.autocast_casts and dtype in HALF_DTYPES:
        full = (np.asarray(recompute).reshape(-1) == RECOMPUTE.index("full"))[:, None]
        fwd = CAST_BYTES_FP32_BF16 * gemm
        bwd = bwd + CAST_BYTES_FP32_BF16 * (gemm + np.where(full, blocks, 0.0))
    return np.where(ddp, fwd, 0.0), np.where(ddp, bwd, 0.0)


def _fsdp_pass_bytes(engine, params, m, z, shard, side_streams: bool, fwd, bwd):
    """``fwd``, ``bwd`` with, at the ZeRO stages FSDP2 shards (``EngineProfile.fsdp_pass_zero``), the bytes of its
    copies around each gather and the last backward's reduce-scatter and of the fp32 gradients it keeps between
    micro-batches (``with_parameter_passes``)."""
    fsdp = among(z, engine.fsdp_pass_zero)[:, None]
    s = np.asarray(shard, dtype=float).reshape(-1, 1)
    inline = 0.0 if side_streams else 1.0  # the shard-sized copies FSDP2 runs on its own streams on a GPU
    gather = inline * CAST_BYTES_FP32_BF16 / s + COPY_BYTES_BF16
    kept = np.where(m > 1, CAST_BYTES_FP32_BF16 + GRAD_ADD_BYTES_BF16_INTO_FP32 * (m - 1), 0.0)
    reduce = np.where(m > 1, COPY_BYTES_FP32, CAST_BYTES_FP32_BF16) + inline * COPY_BYTES_FP32 / s
    fwd = np.where(fsdp, gather * params, fwd)
    bwd = np.where(fsdp, (np.where((z == 3)[:, None], gather, 0.0) + (kept + reduce) / m) * params, bwd)
    return fwd, bwd


__all__ = [
    "CAST_BYTES_FP32_BF16",
    "COPY_BYTES_BF16",
    "COPY_BYTES_FP32",
    "GRAD_ADD_BYTES_BF16_INTO_FP32",
    "GRAD_ADD_BYTES_FP32",
    "cast_params",
    "with_accumulation",
    "with_parameter_passes",
]
