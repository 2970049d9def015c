"""Data parallelism: DDP (ZeRO-0), DDP + ZeroRedundancyOptimizer (ZeRO-1), FSDP2 (ZeRO-2/3).

* ZeRO-0/1: ``DistributedDataParallel`` all-reduces (averages) gradients in buckets during the
  backward; ZeRO-1 adds ``ZeroRedundancyOptimizer``, which keeps each rank's share of the Adam states
  and broadcasts the updated parameters (Rajbhandari et al. 2020, P_os). Under a pipeline schedule
  the gradients are instead averaged after the schedule, in flat buckets (``grads.average_over_dp``):
  DDP's reducer does not follow gradients accumulated over micro-batches (torch 2.13: its one-time
  bucket rebuild counts two backwards and fails at the second step) nor the zero-bubble schedules'
  separate weight-gradient pass.
* ZeRO-2/3: ``fully_shard`` per layer and on the root. Gradients are reduce-scattered and parameters
  stay sharded between steps; ``reshard_after_forward=True`` frees the gathered weights after each
  forward (ZeRO-3, P_os+g+p), ``False`` keeps them until the backward (ZeRO-2's communication: one
  all-gather per step). With tensor parallelism FSDP shards the DTensors further (2-D).

DDP cannot hold DTensor parameters (its reducer and its initial broadcast work on plain tensors), nor can
ZeroRedundancyOptimizer (it broadcasts updated parameters), so with ZeRO-0/1 under tensor parallelism
each DTensor parameter is registered as its local shard and re-wrapped as a DTensor on access (a parametrization,
``DTensor.from_local``): DDP and ZeroRedundancyOptimizer see plain tensors, the layer sees the DTensor, and gradients
flow through ``from_local`` to the local shard.

Mixed precision (bf16): weights, gradients and optimizer states stay float32 (the master copy);
compute runs under autocast; FSDP gathers bf16 weights and reduces gradients in float32.
"""

from __future__ import annotations

import inspect
from typing import Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement
from torch.nn.parallel import DistributedDataParallel
from torch.nn.utils import parametrize


class FromLocal(nn.Module):
    """Parametrization: a plain local shard in storage, a DTensor when the layer reads it."""

    def __init__(
        self, mesh: DeviceMesh, placements: Sequence[Placement], shape: torch.Size, stride: tuple[int, ...]
    ) -> None:
        super().__init__()
        self.mesh, self.placements = mesh, tuple(placements)
        self.shape, self.stride = shape, stride

    def forward(self, local: torch.Tensor) -> DTensor:
        return DTensor.from_local(
            local, self.mesh, self.placements, run_check=False, shape=self.shape, stride=self.stride
        )


def localize_dtensor_params(model: nn.Module) -> None:
    """Store every DTensor parameter of ``model`` as its local shard (see the module docstring).
    A parameter held by two modules (a tied head and embedding) stays one local parameter."""
    local_of: dict[int, tuple[DTensor, nn.Parameter]] = {}
    for module in list(model.modules()):
        for name, param in list(module.named_parameters(recurse=False)):
            if not isinstance(param, DTensor):
                continue
            if id(param) not in local_of:
                local_of[id(param)] = (
                    param,
                    nn.Parameter(param.to_local().detach(), requires_grad=param.requires_grad),
                )
            setattr(module, name, local_of[id(param)][1])
            # unsafe: the parametrized value (global shape) differs in shape from the stored shard.
            parametrize.register_parametrization(
                module, name, FromLocal(param.device_mesh, param.placements, param.shape, param.stride()), unsafe=True
            )


def apply_ddp(model: nn.Module, dp_mesh: DeviceMesh) -> DistributedDataParallel:
    """Wrap the model in DDP over the dp group (plain tensors only). The rotary table is a buffer
    every rank computes identically, so buffers are not broadcast each forward."""
    group = dp_mesh.get_group()
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters:  # torch >= 2.13
        return DistributedDataParallel(model, process_group=group, forward_sync_buffers=False)
    return DistributedDataParallel(model, process_group=group, broadcast_buffers=False)


def apply_fsdp(
    model: nn.Module, dp_mesh: DeviceMesh, *, zero_stage: int, half: str | None, offload: bool = False
) -> None:
    """fully_shard each layer, then the root (embedding, final norm, head), in place; ``half``: the mixed
    precision's 16-bit dtype ("bfloat16" or "float16": gathered in it, reduced in float32), None: float32.
    ``offload`` (Plan.offload "params"): FSDP2's CPUOffloadPolicy keeps the sharded parameters and their
    gradients in host memory, copied to the device before each all-gather and back after each reduce-scatter, and
    the optimizer steps there; pinned host buffers on an accelerator (pinning needs one: on a CPU mesh torch 2.13
    refuses pin_memory, and the copies are to and from the CPU itself)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = (
        MixedPrecisionPolicy(param_dtype=getattr(torch, half), reduce_dtype=torch.float32)
        if half
        else MixedPrecisionPolicy()
    )
    policy = CPUOffloadPolicy(pin_memory=dp_mesh.device_type != "cpu") if offload else OffloadPolicy()
    reshard = zero_stage == 3
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp, offload_policy=policy)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp, offload_policy=policy)


__all__ = ["FromLocal", "apply_ddp", "apply_fsdp", "localize_dtensor_params"]
