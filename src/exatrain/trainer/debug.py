"""Whole per-parameter tensors of a run, written for tests that compare layouts (``TrainConfig.dump_dir``).

Loss curves and one global gradient norm can agree while individual parameters train wrongly (a
gradient scaled by a constant, clipped anyway; one shard's rows swapped), so the parity tests compare
every parameter. A run with a dump directory writes, keyed by each parameter's name in the whole
single-device model (``checkpoint.state.param_views``, the checkpoint's names):

* ``weights-step<N>.pp<r>.safetensors``: the weights before the run's first step (N = the step it
  starts from: 0, or a resumed checkpoint's step) and after its last;
* ``grads-step<N>.pp<r>.safetensors``: the gradients of the first step the run takes, after every
  synchronisation (dp averaging, tensor-parallel partial sums, the tied embedding's two copies) and
  before clipping;
* ``dtypes.pp<r>.json``: the dtypes one linear layer (the first attention query projection of the
  rank's first stage) saw in that first forward: its input, its weight as the forward read it
  (FSDP's mixed-precision gather shows there) and its output (autocast shows there); and the layer's
  class (``Float8Linear`` under ``--fp8``, trainer/fp8.py).

Every rank of a pipeline stage takes part (DTensor shards, tensor-parallel or FSDP, are gathered into
whole tensors with ``full_tensor``, a collective over the parameter's mesh); the stage's first rank
(dp 0, cp 0, tp 0) writes. A pipeline rank writes one file per kind, holding all its virtual stages; with a
tied embedding split over the pipeline the first and last stage files both hold ``embed.tok.weight``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from exatrain.trainer.checkpoint.state import param_views
from exatrain.trainer.parallel.build import ParallelModel
from exatrain.trainer.parallel.mesh import Mesh


def whole(t: torch.Tensor, wrap: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The full float tensor of a stored parameter (or its gradient) on the CPU."""
    v = wrap(t.detach())
    if isinstance(v, DTensor):
        v = v.full_tensor()
    return v.detach().to("cpu").clone()


class Dump:
    """One rank's side of a run's dump (every rank builds one; see the module docstring)."""

    def __init__(self, root: str | Path, pm: ParallelModel, mesh: Mesh) -> None:
        self.root = Path(root)
        self.pm, self.mesh = pm, mesh
        self.writer = mesh.dp_rank == 0 and mesh.tp_rank == 0 and mesh.cp_rank == 0
        self.grads_done = False
        self.dtypes: dict[str, str] = {}
        first_block = next(iter(pm.inner[0].layers.values()))
        self._hook = first_block.attn.wq.register_forward_hook(self._record_dtypes)
        if self.writer:
            self.root.mkdir(parents=True, exist_ok=True)

    def _record_dtypes(self, module: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        self.dtypes = {
            "module": type(module).__name__,
            "input": str(inputs[0].dtype).removeprefix("torch."),
            "weight": str(module.weight.dtype).removeprefix("torch."),
            "output": str(output.dtype).removeprefix("torch."),
        }
        self._hook.remove()

    def weights(self, step: int) -> None:
        """The weights after ``step`` optimizer steps."""
        self._write(f"weights-step{step:08d}", {n: whole(p, wrap) for n, p, wrap in param_views(self.pm)})

    def grads(self, step: int) -> None:
        """The gradients of step ``step`` (1-based), once per run: the run's first step."""
        if self.grads_done:
            return
        self.grads_done = True
        out = {}
        for name, p, wrap in param_views(self.pm):
            if not p.requires_grad:  # not trained (an MoE router's balancing bias): no gradient to dump
                continue
            if p.grad is None:
                raise RuntimeError(f"{name} has no gradient to dump at step {step}")
            out[name] = whole(p.grad, wrap)
        self._write(f"grads-step{step:08d}", out)
        if self.writer:
            (self.root / f"dtypes.pp{self.mesh.pp_rank}.json").write_text(json.dumps(self.dtypes) + "\n")

    def _write(self, stem: str, tensors: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        if self.writer:
            save_file(
                {k: v.contiguous() for k, v in tensors.items()},
                str(self.root / f"{stem}.pp{self.mesh.pp_rank}.safetensors"),
            )


def read_dump(root: str | Path, stem: str) -> dict[str, torch.Tensor]:
    """Every pipeline rank's file of one kind merged by name (``stem``: e.g. ``grads-step00000001``).
    A name two files hold (a tied embedding's two copies) must hold equal values in both."""
    from safetensors.torch import load_file

    paths = sorted(Path(root).glob(f"{stem}.pp*.safetensors"))
    if not paths:
        raise FileNotFoundError(f"no {stem}.pp*.safetensors in {root}")
    merged: dict[str, torch.Tensor] = {}
    for path in paths:
        for name, t in load_file(str(path)).items():
            if name in merged and not torch.equal(merged[name], t):
                raise ValueError(f"{name} differs between pipeline ranks ({path.name})")
            merged[name] = t
    return merged


__all__ = ["Dump", "read_dump", "whole"]
