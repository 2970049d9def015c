"""The device mesh of a plan: (pp, dp, cp, tp), tp fastest, as ParallelDims documents (Megatron-Core's
tp-cp-dp-pp order).

A tp group is ``tp`` consecutive ranks (inside a node, where tensor parallelism's per-layer
all-reduces belong); a cp group strides by ``tp``; a dp group by ``tp * cp``; a pipeline group by
``tp * cp * dp``. Weights are replicated over cp as over dp, so gradients are reduced (and FSDP/ZeRO
shard) over the flattened (dp, cp) mesh, ``grad_mesh``; the data sampler still splits the batch over
dp alone (every cp rank of a dp position reads the same sequences, parallel/context.py).

With expert parallelism (ep > 1) the dp dimension is itself a (edp, ep) grid, ep fastest: the mesh
is built as (pp, edp, ep, tp) and (edp, ep) flattened back into "dp", so dp groups, dp ranks and
everything dense are exactly as without ep. An ep group is ep dp-neighbours (stride ``tp``), whose
token all-to-alls stay as close as the dp layout allows; the experts' expert-data-parallel group
(edp = dp/ep ranks) strides by ``ep * tp``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from exatrain.errors import PlanError
from exatrain.plan import Plan
from exatrain.trainer.parallel.ranks import coordinates, cp_coordinate, global_rank  # torch-free, re-exported


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
    ep: int = 1
    flat_dp: DeviceMesh | None = None  # with ep > 1: the (edp, ep) grid flattened into dp
    cp: int = 1
    cp_rank: int = 0
    flat_dp_cp: DeviceMesh | None = None  # with cp > 1: the (dp, cp) grid flattened

    @property
    def cp_group(self) -> dist.ProcessGroup | None:
        """The context-parallel group (None without context parallelism)."""
        return self.mesh["cp"].get_group() if self.cp > 1 else None

    @property
    def grad_mesh(self) -> DeviceMesh:
        """The ranks holding replicas of the same weights (dp, times cp under context parallelism):
        where DDP averages, FSDP and ZeRO shard."""
        return self.flat_dp_cp if self.flat_dp_cp is not None else self.dp_mesh

    @property
    def ep_rank(self) -> int:
        return self.dp_rank % self.ep

    @property
    def expert_mesh(self) -> DeviceMesh | None:
        """The (ep, tp) mesh the routed experts live on (Shard over ep, Replicate over tp); None
        without expert parallelism."""
        return self.mesh["ep", "tp"] if self.ep > 1 else None

    @property
    def ep_group(self) -> dist.ProcessGroup | None:
        return self.mesh["ep"].get_group() if self.ep > 1 else None

    @property
    def edp_group(self) -> dist.ProcessGroup | None:
        """The ranks holding the same experts at this (pp, tp) position (None when that is this rank
        alone): where the experts' gradients are summed."""
        return self.mesh["edp"].get_group() if self.ep > 1 and self.mesh["edp"].size() > 1 else None

    @property
    def tp_mesh(self) -> DeviceMesh:
        return self.mesh["tp"]

    @property
    def dp_mesh(self) -> DeviceMesh:
        return self.flat_dp if self.flat_dp is not None else self.mesh["dp"]

    @property
    def pp_group(self) -> dist.ProcessGroup:
        return self.mesh["pp"].get_group()

    def size(self, dim: str) -> int:
        return self.dp_mesh.size() if dim == "dp" else self.mesh[dim].size()


def cuda_index(local_rank: int) -> int:
    """The GPU a rank drives. A launcher may show each rank only its own GPU (SLURM's
    --gpu-bind=closest on Frontier, CUDA_VISIBLE_DEVICES per rank), so index modulo what is visible."""
    return local_rank % max(1, torch.cuda.device_count())


def build_mesh(plan: Plan, device: torch.device) -> Mesh:
    """Create the mesh (and the tied-embedding groups) on an initialised default process group."""
    world = dist.get_world_size()
    if world != plan.gpus:
        raise PlanError(
            f"the plan needs tp*cp*pp*dp = {plan.tp}*{plan.cp}*{plan.pp}*{plan.dp} = {plan.gpus} "
            f"ranks but {world} were started"
        )
    flat_dp_cp = None
    if plan.cp > 1:  # TrainConfig.check refuses cp with ep
        mesh = init_device_mesh(
            device.type, (plan.pp, plan.dp, plan.cp, plan.tp), mesh_dim_names=("pp", "dp", "cp", "tp")
        )
        flat_dp = None
        flat_dp_cp = mesh["dp", "cp"]._flatten("dp_cp")
    elif plan.ep > 1:
        mesh = init_device_mesh(
            device.type, (plan.pp, plan.dp // plan.ep, plan.ep, plan.tp), mesh_dim_names=("pp", "edp", "ep", "tp")
        )
        flat_dp = mesh["edp", "ep"]._flatten("dp")
    else:
        mesh = init_device_mesh(device.type, (plan.pp, plan.dp, plan.tp), mesh_dim_names=("pp", "dp", "tp"))
        flat_dp = None
    rank = dist.get_rank()
    pp_rank, dp_rank, tp_rank = coordinates(rank, plan)
    embed_group = None
    if plan.pp > 1 and plan.model.tied_embeddings and plan.rank_of_stage(plan.virtual_stages - 1) != 0:
        # (under a V schedule rank 0 holds both copies: grads.sync_tied_embedding sums them there)
        # Every rank takes part in creating every group (a collective call), in the same order.
        for d in range(plan.dp):
            for c in range(plan.cp):
                for t in range(plan.tp):
                    ranks = [global_rank(plan, 0, d, t, c), global_rank(plan, plan.pp - 1, d, t, c)]
                    group = dist.new_group(ranks)
                    if rank in ranks:
                        embed_group = group
    return Mesh(
        mesh=mesh,
        rank=rank,
        pp_rank=pp_rank,
        dp_rank=dp_rank,
        tp_rank=tp_rank,
        device=device,
        embed_group=embed_group,
        ep=plan.ep,
        flat_dp=flat_dp,
        cp=plan.cp,
        cp_rank=cp_coordinate(rank, plan),
        flat_dp_cp=flat_dp_cp,
    )


__all__ = ["Mesh", "build_mesh", "coordinates", "cuda_index", "cp_coordinate", "global_rank"]
