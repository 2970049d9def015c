"""The device mesh of a plan: (pp, dp, tp), tp fastest, as ParallelDims documents (Megatron's order).

A tp group is ``tp`` consecutive ranks (inside a node, where tensor parallelism's per-layer
all-reduces belong); a dp group strides by ``tp``; a pipeline group strides by ``tp * dp``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from exatrain.errors import PlanError
from exatrain.plan import Plan


@dataclass(frozen=True)
class Mesh:
    """This rank's place in the plan's mesh, and the groups the step loop needs."""

    mesh: DeviceMesh
    rank: int
    pp_rank: int
    dp_rank: int
    tp_rank: int
    device: torch.device
    # First and last pipeline rank of this (dp, tp) position: the two copies of a tied embedding.
    embed_group: dist.ProcessGroup | None

    @property
    def tp_mesh(self) -> DeviceMesh:
        return self.mesh["tp"]

    @property
    def dp_mesh(self) -> DeviceMesh:
        return self.mesh["dp"]

    @property
    def pp_group(self) -> dist.ProcessGroup:
        return self.mesh["pp"].get_group()

    def size(self, dim: str) -> int:
        return self.mesh[dim].size()


def coordinates(rank: int, plan: Plan) -> tuple[int, int, int]:
    """(pp_rank, dp_rank, tp_rank) of a global rank."""
    tp, dp = plan.tp, plan.dp
    return rank // (tp * dp), (rank // tp) % dp, rank % tp


def global_rank(plan: Plan, pp_rank: int, dp_rank: int, tp_rank: int) -> int:
    return (pp_rank * plan.dp + dp_rank) * plan.tp + tp_rank


def build_mesh(plan: Plan, device: torch.device) -> Mesh:
    """Create the mesh (and the tied-embedding groups) on an initialised default process group."""
    world = dist.get_world_size()
    if world != plan.gpus:
        raise PlanError(f"the plan needs tp*pp*dp = {plan.tp}*{plan.pp}*{plan.dp} = {plan.gpus} ranks "
                        f"but {world} were started")
    mesh = init_device_mesh(device.type, (plan.pp, plan.dp, plan.tp), mesh_dim_names=("pp", "dp", "tp"))
    rank = dist.get_rank()
    pp_rank, dp_rank, tp_rank = coordinates(rank, plan)
    embed_group = None
    if plan.pp > 1 and plan.model.tied_embeddings:
        # Every rank takes part in creating every group (a collective call), in the same order.
        for d in range(plan.dp):
            for t in range(plan.tp):
                ranks = [global_rank(plan, 0, d, t), global_rank(plan, plan.pp - 1, d, t)]
                group = dist.new_group(ranks)
                if rank in ranks:
                    embed_group = group
    return Mesh(mesh=mesh, rank=rank, pp_rank=pp_rank, dp_rank=dp_rank, tp_rank=tp_rank,
                device=device, embed_group=embed_group)


__all__ = ["Mesh", "build_mesh", "coordinates", "global_rank"]
