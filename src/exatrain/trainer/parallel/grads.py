"""Gradient bookkeeping across all of tp, pp and dp: tied-embedding sync, global norm, clipping.

The global gradient norm is that of the single-device model: each rank adds the squares of the
gradient entries it holds, divided by the number of ranks holding identical copies of them, and one
all-reduce over the world sums those. A tensor-parallel shard is held once; a replicated parameter
tp times (norms, biases after the all-reduce); under DDP/ZeRO-1 every gradient is also replicated dp
times, under FSDP sharded; a tied embedding split over the pipeline has two copies (first and
last stage). Under context parallelism the cp ranks hold replicas as the dp ranks do: ``dp`` here
is then dp x cp (parallel/context.py). Routed experts under expert parallelism are sharded over ep and replicated over
tp and the dp/ep expert-data-parallel ranks.

Averaging over data parallelism: a dense gradient is averaged over the dp group. An expert's
gradient under expert parallelism already holds the contributions of the tokens every rank of its ep
group sent it, so it is summed over the expert-data-parallel group only and divided by dp: the
gradient of the mean loss over all dp ranks (Megatron-Core's expert-data-parallel reduction).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.utils import parametrize


@dataclass(frozen=True)
class GradEntry:
    """One parameter as this rank holds it, and how many ranks hold the same gradient values."""

    param: nn.Parameter
    copies: int
    expert: bool = False  # a routed expert split over ep > 1: averaged over the edp group (module doc)
    edp_group: dist.ProcessGroup | None = None  # its expert-data-parallel group (None: this rank alone)


def _shards(param: torch.Tensor, owner: nn.Module) -> int:
    """How many distinct pieces the parameter's full value is split into across the ranks of a stage."""
    if isinstance(owner, parametrize.ParametrizationList):  # a DTensor stored as its local shard
        mesh, placements = owner[0].mesh, owner[0].placements
    elif isinstance(param, DTensor):
        mesh, placements = param.device_mesh, param.placements
    else:
        return 1
    # Shard, or FSDP's _StridedShard over a tensor-parallel shard (not is_shard() in every version).
    return math.prod(mesh.size(i) for i, p in enumerate(placements) if not (p.is_replicate() or p.is_partial()))


def grad_entries(
    modules: Iterable[nn.Module],
    *,
    tp: int,
    dp: int,
    tied_copies: Iterable[nn.Parameter] = (),
    expert_params: Iterable[nn.Parameter] = (),
    edp_group: dist.ProcessGroup | None = None,
) -> list[GradEntry]:
    """GradEntry for every trainable parameter of this rank's stage modules (wrapped or not);
    ``expert_params``: the routed experts' parameters when they are split over ep > 1, whose
    gradients are summed over ``edp_group``."""
    entries, seen = [], set()
    tied = {id(p) for p in tied_copies}
    experts = {id(p) for p in expert_params}
    for module in modules:
        for sub in module.modules():
            for param in sub.parameters(recurse=False):
                if id(param) in seen or not param.requires_grad:
                    continue
                seen.add(id(param))
                copies = (tp * dp) // _shards(param, sub)
                if id(param) in tied:  # after the sync, the first and the last stage hold the same gradient
                    copies *= 2
                expert = id(param) in experts
                entries.append(GradEntry(param, copies, expert=expert, edp_group=edp_group if expert else None))
    return entries


def local_grad(param: torch.Tensor) -> torch.Tensor | None:
    g = param.grad
    if g is None:
        return None
    return g.to_local() if isinstance(g, DTensor) else g


def settle_grads(entries: list[GradEntry]) -> None:
    """Give every DTensor gradient its parameter's placements.

    DTensor's backward may leave a gradient Partial (a replicated norm weight fed a sequence-parallel
    slice: each tp rank holds a partial sum) or Replicate where the parameter is sharded (the
    vocab-parallel embedding's dense backward). Partial -> Replicate is the all-reduce sequence
    parallelism needs anyway; Replicate -> Shard is a local slice. After this, a rank's local gradient
    is exactly the part of the whole gradient its parameter shard covers."""
    for e in entries:
        g = e.param.grad
        if isinstance(g, DTensor) and isinstance(e.param, DTensor) and tuple(g.placements) != tuple(e.param.placements):
            e.param.grad = g.redistribute(e.param.device_mesh, e.param.placements)


def average_over_dp(entries: list[GradEntry], group: dist.ProcessGroup, dp: int, bucket_elems: int = 2**26) -> None:
    """Average every gradient over the data-parallel group: flat buckets of at most ``bucket_elems``
    elements per dtype, one all-reduce each (SUM, then divide: gloo has no AVG). Expert entries
    are summed over their own expert-data-parallel group instead and divided by dp (module doc)."""
    _sum_and_divide([e for e in entries if not e.expert], group, dp, bucket_elems)
    experts = [e for e in entries if e.expert]
    if experts:
        _sum_and_divide(experts, experts[0].edp_group, dp, bucket_elems)


def _sum_and_divide(entries: list[GradEntry], group: dist.ProcessGroup | None, divisor: int, bucket_elems: int) -> None:
    grads = [g for g in (local_grad(e.param) for e in entries) if g is not None]
    if group is None:
        for g in grads:
            g.div_(divisor)
        return
    buckets: list[list[torch.Tensor]] = []
    for g in grads:
        last = buckets[-1] if buckets else None
        if last and last[0].dtype == g.dtype and sum(x.numel() for x in last) + g.numel() <= bucket_elems:
            last.append(g)
        else:
            buckets.append([g])
    for bucket in buckets:
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        flat.div_(divisor)
        offset = 0
        for g in bucket:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def sync_tied_embedding(params: Iterable[nn.Parameter], group: dist.ProcessGroup | None) -> None:
    """Sum the gradients of the embedding's two copies (first and last pipeline stage): over ``group``, or on
    this rank when it holds both (the V schedules' rank 0)."""
    params = list(params)
    if group is None:
        if len(params) == 2:
            a, b = (local_grad(p) for p in params)
            if a is None or b is None:
                raise RuntimeError("tied embedding copy has no gradient")
            a.add_(b)
            b.copy_(a)
        return
    for p in params:
        g = local_grad(p)
        if g is None:
            raise RuntimeError("tied embedding copy has no gradient")
        dist.all_reduce(g, op=dist.ReduceOp.SUM, group=group)


def clip_grad_norm(entries: list[GradEntry], max_norm: float, device: torch.device) -> float:
    """Global L2 norm of the gradient of the whole model; scale every gradient so it is at most
    ``max_norm`` (no clipping when max_norm <= 0). Returns the norm before clipping.

    One read of every gradient: the per-tensor norms in the gradients' own dtype (torch's foreach norm,
    ``torch.nn.utils.get_total_norm``), grouped by how many ranks hold a copy; their squares are summed in
    float64. (Casting each gradient to float64 first read and wrote it three times over: 36 bytes an fp32
    element against 4; ``EngineProfile.step_pass_bytes``.)"""
    by_copies: dict[int, list[torch.Tensor]] = {}
    for e in entries:
        g = local_grad(e.param)
        if g is not None:
            by_copies.setdefault(e.copies, []).append(g.detach())
    total = torch.zeros((), dtype=torch.float64, device=device)
    for copies, grads in by_copies.items():
        total += torch.nn.utils.get_total_norm(grads, 2.0).to(device=device, dtype=torch.float64) ** 2 / copies
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    norm = float(total.sqrt())
    if max_norm > 0 and norm > max_norm:
        coef = max_norm / (norm + 1e-6)
        for e in entries:
            g = local_grad(e.param)
            if g is not None:
                g.mul_(coef)
    return norm


__all__ = [
    "GradEntry",
    "average_over_dp",
    "clip_grad_norm",
    "grad_entries",
    "local_grad",
    "settle_grads",
    "sync_tied_embedding",
]
