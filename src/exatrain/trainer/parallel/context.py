"""Context parallelism: every sequence split over the ``cp`` ranks of a cp group.

Load balance (Megatron-Core's scheme; Llama 3, Dubey et al. 2024, Sec. 3.3.2): the sequence is cut
into ``2 * cp`` equal chunks and cp rank r holds chunks r and 2cp-1-r, one early and one late, so
every rank does the same share of causal attention's work. A rank keeps its tokens, their global
positions (the learned position table and the rotary angles read those) and their next-token
labels; everything but attention is token-wise and runs on that share unchanged.

Attention needs every key and value of the sequence: each rank all-gathers K and V over the cp group
(``GatherSequence``, whose backward sums every rank's dK/dV and hands each rank its own part: a
reduce-scatter; gloo has none, so there an all-reduce and a slice). The
causal mask is built from global positions: query at position i sees key at position j iff j <= i.
PyTorch's ``torch.distributed.tensor.experimental.context_parallel`` is not used: in torch 2.13 it
dispatches only the flash, efficient and cuDNN SDPA kernels (``_context_parallel/_attention.py``,
its op table), none of which the CPU math path or the keyed dropout core (model.py) runs.

The loss of each rank is the mean over its tokens; all ranks hold equally many, so the average of
those means over dp x cp (the gradient reduction, parallel/mesh.py ``grad_mesh``) is the mean over
the global batch, as on one device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


def chunk_positions(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """int64 [seq_len / cp]: the global positions cp rank ``rank`` holds (chunks rank, 2cp-1-rank)."""
    chunk = seq_len // (2 * cp)
    first = torch.arange(rank * chunk, (rank + 1) * chunk)
    last = torch.arange((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk)
    return torch.cat((first, last))


@dataclass(frozen=True)
class ContextShard:
    """This rank's share of every sequence, and the group that holds the rest."""

    group: dist.ProcessGroup
    size: int
    rank: int
    positions: torch.Tensor  # int64 [s / cp]: this rank's global positions
    all_positions: torch.Tensor  # int64 [s]: the positions of the gathered keys, in cp rank order

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """[b, s/cp, ...] -> [b, s, ...]: every rank's share along dim 1, in cp rank order (so the
        keys' positions are ``all_positions``), differentiable."""
        return GatherSequence.apply(x, self.group, self.size, self.rank)

    def causal_mask(self) -> torch.Tensor:
        """bool [s/cp, s]: True where a local query may attend to a gathered key."""
        return self.all_positions[None, :] <= self.positions[:, None]


class GatherSequence(torch.autograd.Function):
    """All-gather along dim 1 over a group; backward: the sum of every rank's gradient of the whole,
    this rank's slice of it (torch.distributed.nn.functional.all_gather is not used: its gloo backward
    sends the gradient's slices, non-contiguous views, through all_to_all as they are)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup, size: int, rank: int) -> torch.Tensor:
        ctx.group, ctx.size, ctx.rank = group, size, rank
        parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        pieces = [c.contiguous() for c in grad.chunk(ctx.size, dim=1)]
        if dist.get_backend(ctx.group) == "gloo":  # no reduce-scatter in gloo
            whole = torch.cat(pieces, dim=1)
            dist.all_reduce(whole, group=ctx.group)
            return whole.chunk(ctx.size, dim=1)[ctx.rank].contiguous(), None, None, None
        out = torch.empty_like(pieces[ctx.rank])
        dist.reduce_scatter(out, pieces, group=ctx.group)
        return out, None, None, None


def context_shard(mesh, seq_len: int) -> ContextShard:
    """The ContextShard of this rank of ``mesh`` (parallel/mesh.py Mesh with cp > 1)."""
    device = mesh.device
    return ContextShard(
        group=mesh.cp_group,
        size=mesh.cp,
        rank=mesh.cp_rank,
        positions=chunk_positions(seq_len, mesh.cp, mesh.cp_rank).to(device),
        all_positions=torch.cat([chunk_positions(seq_len, mesh.cp, r) for r in range(mesh.cp)]).to(device),
    )


def apply_context_parallel(module: nn.Module, shard: ContextShard) -> None:
    """Tell a stage's position-aware parts which share of the sequence this rank holds: the
    embeddings (learned positions), the model (rotary angles), every block (dropout masks) and its
    attention (K/V gather, causal mask)."""
    module.context = shard
    if module.embed is not None:
        module.embed.context = shard
    for block in module.layers.values():
        block.context = block.attn.context = shard


def shard_batch(x: torch.Tensor, shard: ContextShard | None) -> torch.Tensor:
    """[b, s] -> [b, s/cp]: this rank's tokens (or labels) of every sequence."""
    if shard is None:
        return x
    return x.index_select(1, shard.positions.to(x.device)).contiguous()


__all__ = [
    "ContextShard",
    "GatherSequence",
    "apply_context_parallel",
    "chunk_positions",
    "context_shard",
    "shard_batch",
]
