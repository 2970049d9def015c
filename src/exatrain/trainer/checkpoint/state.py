"""What a checkpoint holds, under names that do not depend on the layout.

Every tensor is keyed by the parameter's name in the whole single-device model (``canonical_name``:
``layers.7.attn.wq.weight`` on whatever pipeline stage holds layer 7; a tied head's copy on the last
stage is ``embed.tok.weight``) and presented to DCP with its *global* shape:

* ``model.<name>``: the parameter. A DTensor (tensor parallel, FSDP2, or both) as it is; under ZeRO-0/1
  with tensor parallelism the stored local shard is re-wrapped as the DTensor the layer reads
  (``DTensor.from_local``, sharing storage, so a load writes straight into the shard);
* ``optim.<name>.exp_avg`` / ``.exp_avg_sq`` / ``.step``: AdamW's state, wrapped like its parameter.
  With ZeroRedundancyOptimizer each rank holds (and writes, and loads) the state of the parameters
  its partition owns: that is its local optimizer's state, whatever the dp degree;
* ``rng.rank<r>.cpu`` (and ``.cuda``): each rank's generator state, restored only onto the same layout
  (another layout reseeds from the seed and the step; only dropout draws from it).

DCP's planners then write each chunk once (replicas deduplicated) and read, for any other layout, the
overlapping parts of the stored chunks. Scalars (step, sampler cursor) and the plan are JSON (files.py).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.utils import parametrize

from exatrain.trainer.model import canonical_name
from exatrain.trainer.parallel.build import ParallelModel

Wrap = Callable[[torch.Tensor], torch.Tensor]


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def _from_local(f: nn.Module) -> Wrap:
    def wrap(t: torch.Tensor) -> torch.Tensor:
        return DTensor.from_local(t, f.mesh, f.placements, run_check=False, shape=f.shape, stride=f.stride)

    return wrap


def param_views(pm: ParallelModel) -> list[tuple[str, nn.Parameter, Wrap]]:
    """(canonical name, stored parameter, wrap) for every parameter this rank holds, once each; ``wrap``
    turns a tensor shaped like the stored parameter (it, or its Adam moments) into its global view."""
    spec = pm.plan.model
    out: list[tuple[str, nn.Parameter, Wrap]] = []
    seen: set[int] = set()
    for module in pm.inner:
        for prefix, sub in module.named_modules():
            if isinstance(sub, parametrize.ParametrizationList):
                continue  # handled from its owner below
            found: list[tuple[str, nn.Parameter, Wrap]] = []
            if parametrize.is_parametrized(sub):
                for name, plist in sub.parametrizations.items():
                    found.append((name, plist.original, _from_local(plist[0])))
            found += [(name, p, _identity) for name, p in sub.named_parameters(recurse=False)]
            for name, p, wrap in found:
                if id(p) in seen:
                    continue
                seen.add(id(p))
                out.append((canonical_name(f"{prefix}.{name}" if prefix else name, spec), p, wrap))
    return out


def local_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer that holds this rank's states (ZeroRedundancyOptimizer's partition, or itself)."""
    return getattr(optimizer, "optim", optimizer)


def _init_adam_state(state: dict, p: torch.Tensor, step_on_device: bool) -> None:
    """AdamW's own lazy initialisation (torch.optim.adam._init_group), done early so that a load has
    tensors to fill; the step count lives on the parameter's device for the fused kernel."""
    state["step"] = (
        torch.zeros((), dtype=torch.float32, device=p.device)
        if step_on_device
        else torch.tensor(0.0, dtype=torch.float32)
    )
    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def state_dict(
    pm: ParallelModel, optimizer: torch.optim.Optimizer, rank: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """This rank's part of the checkpoint: views onto its parameters and optimizer states (a load
    writes into them in place), and its RNG states."""
    views = param_views(pm)
    local = local_optimizer(optimizer)
    owned = {id(p) for g in local.param_groups for p in g["params"]}
    step_on_device = any(g.get("fused") or g.get("capturable") for g in local.param_groups)
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, p, wrap in views:
            out[f"model.{name}"] = wrap(p.detach())
            if id(p) not in owned:
                continue
            st = local.state[p]
            if not st:
                _init_adam_state(st, p.detach(), step_on_device)
            out[f"optim.{name}.exp_avg"] = wrap(st["exp_avg"])
            out[f"optim.{name}.exp_avg_sq"] = wrap(st["exp_avg_sq"])
            out[f"optim.{name}.step"] = st["step"]
    out[f"rng.rank{rank}.cpu"] = torch.get_rng_state()
    if device.type == "cuda":
        out[f"rng.rank{rank}.cuda"] = torch.cuda.get_rng_state(device)
    return out


def restore_rng(state: dict[str, torch.Tensor], rank: int, device: torch.device) -> None:
    torch.set_rng_state(state[f"rng.rank{rank}.cpu"])
    if device.type == "cuda" and f"rng.rank{rank}.cuda" in state:
        torch.cuda.set_rng_state(state[f"rng.rank{rank}.cuda"], device)


__all__ = ["local_optimizer", "param_views", "restore_rng", "state_dict"]
