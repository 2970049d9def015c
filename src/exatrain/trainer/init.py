"""Deterministic, layout-independent weights for a model built on the meta device.

Every parameter is drawn from its own generator, seeded by (run seed, the parameter's name in the
whole model). A rank materialises one parameter at a time at its full size on the training device,
keeps its own shard (tensor-parallel and/or FSDP), and frees the rest; so the values do not depend
on tp, pp, dp or the ZeRO stage (which is what makes loss parity with one process possible), and the
most a rank ever holds beyond its shards is the single largest parameter (the embedding).
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from exatrain.catalog.models import ModelSpec
from exatrain.trainer.model import Transformer, canonical_name, init_fill, init_std


def param_seed(seed: int, name: str) -> int:
    """A 63-bit seed from the run seed and a parameter name (stable across processes, unlike hash())."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def full_value(name: str, shape: torch.Size, spec: ModelSpec, seed: int, device: torch.device) -> torch.Tensor:
    """The whole (unsharded) float32 initial value of parameter ``name``."""
    std = init_std(name, spec)
    if std is None:
        return torch.full(shape, init_fill(name), dtype=torch.float32, device=device)
    gen = torch.Generator(device=device)
    gen.manual_seed(param_seed(seed, name))
    return torch.empty(shape, dtype=torch.float32, device=device).normal_(0.0, std, generator=gen)


def materialize(
    module: nn.Module, spec: ModelSpec, seed: int, device: torch.device, buffer_device: torch.device | None = None
) -> None:
    """Allocate a meta-device module (plain, DTensor or FSDP-sharded parameters) on ``device`` and
    fill every parameter with its deterministic initial value; its buffers then go to ``buffer_device``
    (None: ``device``), as FSDP2's CPU offload needs: parameters in host memory, buffers on the accelerator.
    The values are drawn on ``buffer_device`` (the mesh's: each device type has its own generator), so a run
    with its parameters in host memory starts from the very values of one without."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    # to_empty gives each plain parameter a new tensor per module; restore shared (tied) ones.
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for sub in module.modules():
        for name, param in sub._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append((sub, name))
    module.to_empty(device=device)
    for group in holders.values():
        first = getattr(group[0][0], group[0][1])
        for sub, name in group[1:]:
            setattr(sub, name, first)
    with torch.no_grad():
        for name, param in module.named_parameters():
            key = canonical_name(name, spec)
            full = full_value(key, param.shape, spec, seed, device if buffer_device is None else buffer_device)
            if isinstance(param, DTensor):
                # Every rank computes the same full value, so each takes its shard locally
                # (src_data_rank=None: no communication).
                shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
                param.to_local().copy_(shard.to_local())
            else:
                param.copy_(full)
            del full
        for sub in module.modules():
            if isinstance(sub, Transformer):
                sub.reset_buffers()
    if buffer_device is not None and torch.device(buffer_device) != torch.device(device):
        for sub in module.modules():
            for name, buf in sub._buffers.items():
                if buf is not None:
                    sub._buffers[name] = buf.to(buffer_device)


__all__ = ["full_value", "materialize", "param_seed"]
