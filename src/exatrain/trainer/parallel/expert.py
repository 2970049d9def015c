"""Expert parallelism for the MoE layers (trainer/moe.py), and the MoE bookkeeping of a step.

Layout (EP inside DP, as Megatron-Core and torchtitan compose it; mesh.py builds the grid):

* routed experts: split over ``ep`` ranks (whole experts, Shard(0) of the stacked [N, ...] weights)
  and replicated over tp (expert-tensor-parallel size 1: every tp rank routes the same tokens and
  runs the same experts) and over the dp/ep expert-data-parallel ranks, which sum their gradients
  (grads.average_over_dp). As DTensors on the (ep, tp) mesh they keep their global shape, so
  checkpoints stay layout-free;
* everything else (attention, norms, router, shared experts, embeddings) as in a dense model:
  replicated over the whole dp (tensor-parallel where tp > 1: see tensor.py).

So with ep experts' groups, each rank computes N/ep experts for the tokens of the ep ranks of its
group; dp = edp * ep and tp*dp/ep ranks hold each expert's weights.

After each step ``finish_moe_step`` reads what the MoE layers recorded during the backward (the
balancing loss and the experts' loads of every micro-batch): the mean balancing loss for the log,
and, for routers with a balancing bias, the bias update of DeepSeek-V3's auxiliary-loss-free
balancing (arXiv 2412.19437, Sec. 2.1.2: each bias moves by ``rate`` towards the mean load, down for
an overloaded expert, up for an underloaded one), from the loads summed over the whole global batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from exatrain.plan import Plan
from exatrain.trainer.moe import MoE, local, moe_layers
from exatrain.trainer.parallel.mesh import Mesh

EXPERT_WEIGHTS = ("w1", "w2", "w3")


def aux_loss_scale(plan: Plan) -> float:
    """What the step does to one micro-batch's loss before its backward: divided by the number of
    micro-batches without a pipeline (train.Stepper), unscaled under a pipeline schedule (which
    divides the accumulated gradients instead: pipeline.build_schedule)."""
    return 1.0 if plan.pp > 1 else 1.0 / plan.num_microbatches


def apply_expert_parallel(module: nn.Module, mesh: Mesh, plan: Plan, *, aux_loss_coef: float) -> None:
    """Place the routed experts of ``module``'s MoE layers (on the meta device, after tensor
    parallelism) and hand each layer its ep group and balancing-loss settings, in place."""
    placed = mesh.expert_mesh
    placements = [Shard(0), Replicate()]
    if placed is None and plan.tp > 1:  # no ep: experts replicated over tp like every other parameter
        placed, placements = mesh.tp_mesh, [Replicate()]
    for moe in moe_layers(module):
        moe.aux_coef, moe.aux_scale = aux_loss_coef, aux_loss_scale(plan)
        if mesh.ep > 1:
            moe.ep_group, moe.ep = mesh.ep_group, mesh.ep
        if placed is not None:
            for name in EXPERT_WEIGHTS:
                p = getattr(moe.experts, name)
                setattr(
                    moe.experts,
                    name,
                    nn.Parameter(
                        distribute_tensor(p.data, placed, placements, src_data_rank=None), requires_grad=p.requires_grad
                    ),
                )


def expert_parameters(modules: list[nn.Module]) -> list[nn.Parameter]:
    """The routed experts' stored parameters (a localized DTensor's local shard included)."""
    out = []
    for module in modules:
        for moe in moe_layers(module):
            out += [p for _, p in moe.experts.named_parameters()]
    return out


def finish_moe_step(
    modules: list[nn.Module], mesh: Mesh, plan: Plan, *, bias_rate: float, update: bool
) -> float | None:
    """Close a step's MoE bookkeeping on every rank (collective): returns the balancing loss averaged
    over the model's MoE layers, the step's micro-batches and the dp ranks (None for a dense model);
    moves the routers' balancing biases when ``update`` (the step was applied).

    Each layer keeps the records of the last ``num_microbatches`` backward passes: a pipeline stage
    runs one more forward and backward, on placeholder inputs, before its first step (the schedule's
    shape inference), whose record comes first and is dropped here."""
    if not plan.model.is_moe:
        return None
    n = plan.num_microbatches
    layers: list[MoE] = [moe for module in modules for moe in moe_layers(module)]
    aux = torch.zeros((), dtype=torch.float64, device=mesh.device)
    loads = []
    for moe in layers:
        records, moe.records = moe.records[-n:], []
        for a, load in records:
            aux += a.double() / n
        loads.append(
            sum((load for _, load in records), torch.zeros(plan.model.experts, dtype=torch.int64, device=mesh.device))
        )
    dist.all_reduce(aux)  # the same value on the tp ranks of each (pp, dp) position
    mean_aux = float(aux) / (plan.tp * plan.dp * plan.model.moe_layers)
    if update and bias_rate > 0 and plan.model.router_bias and layers:
        total = torch.stack(loads)  # [layers here, N]
        if plan.dp > 1:
            dist.all_reduce(total, group=mesh.dp_mesh.get_group())
        with torch.no_grad():
            for moe, load in zip(layers, total.double()):
                step = bias_rate * torch.sign(load.mean() - load)  # + for an underloaded expert
                add_full(moe.router.bias, step)
    return mean_aux


def add_full(param: torch.Tensor, delta: torch.Tensor) -> None:
    """param += delta, ``delta`` given whole: a sharded parameter (FSDP) adds its own part of it."""
    bias = param
    if isinstance(bias, DTensor):
        part = distribute_tensor(delta.to(bias.dtype), bias.device_mesh, bias.placements, src_data_rank=None)
        bias.to_local().add_(part.to_local())
    else:
        local(bias).add_(delta.to(bias.dtype))


__all__ = ["apply_expert_parallel", "aux_loss_scale", "expert_parameters", "finish_moe_step"]
