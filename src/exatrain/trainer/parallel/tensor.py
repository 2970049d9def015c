"""Tensor and sequence parallelism with DTensor (Megatron-LM's scheme, Shoeybi et al. 2019;
sequence parallelism, Korthikanti et al. 2022), applied by ``parallelize_module``.

Per layer: q, k, v and the first MLP matrices are column-parallel (each rank holds heads/tp heads and
ffn/tp columns); the attention output and the second MLP matrix are row-parallel, so a layer costs
one all-reduce in attention and one in the MLP, forward and backward. With sequence parallelism the
norms run on a 1/tp slice of the sequence and those all-reduces become all-gather + reduce-scatter.
The token embedding is vocab-parallel; the head is column-parallel and hands the loss vocab-sharded
logits (a DTensor), from which ``loss_parallel`` computes the cross-entropy without gathering them.

Every parameter becomes a DTensor on the tp mesh; those that every tp rank holds whole (norms, the
position table, row-parallel biases) are Replicate, so FSDP, the optimizer and the grad norm see one
uniform kind of parameter.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                               RowwiseParallel, SequenceParallel, parallelize_module)
from torch.distributed.tensor.parallel.style import ParallelStyle

from exatrain.trainer.model import Transformer


class ReplicateParallel(ParallelStyle):
    """Parameters as replicated DTensors; inputs and outputs stay plain (replicated) tensors.

    For modules whose every tp rank computes the same thing on the same input (norms without
    sequence parallelism, the position table): no communication, forward or backward."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh, None, _inputs_to_replicate, _outputs_to_local)


def _inputs_to_replicate(module: nn.Module, inputs: tuple[Any, ...], mesh: DeviceMesh) -> tuple[Any, ...]:
    return tuple(DTensor.from_local(x, mesh, [Replicate()], run_check=False)
                 if isinstance(x, torch.Tensor) and not isinstance(x, DTensor) else x for x in inputs)


def _outputs_to_local(module: nn.Module, output: Any, mesh: DeviceMesh) -> Any:
    return output.to_local() if isinstance(output, DTensor) else output


def apply_tensor_parallel(model: Transformer, tp_mesh: DeviceMesh, *, sequence_parallel: bool) -> None:
    """Shard ``model`` (a whole model or one pipeline stage) over ``tp_mesh`` in place."""
    sp = sequence_parallel
    seq = Shard(1)  # the residual stream between layers under SP: [b, s/tp, h] per rank
    norm_style = (lambda: SequenceParallel()) if sp else (lambda: ReplicateParallel())
    if model.embed is not None:
        plan: dict[str, ParallelStyle] = {
            # Vocab-parallel lookup; the partial rows are summed by an all-reduce.
            "tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        }
        if model.embed.pos is not None:
            plan["pos"] = ReplicateParallel()
        parallelize_module(model.embed, tp_mesh, plan)
        if sp:  # hand the first layer its sequence slice (the backward all-gathers the gradient)
            parallelize_module(model.embed, tp_mesh,
                               PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=seq))
    for block in model.layers.values():
        mlp_in, mlp_out = (("w1", "w3"), "w2") if block.mlp.gated else (("fc1",), "fc2")
        plan = {
            "attn_norm": norm_style(),
            "attn.wq": ColwiseParallel(),
            "attn.wk": ColwiseParallel(),
            "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(output_layouts=seq if sp else Replicate()),
            "mlp_norm": norm_style(),
            **{f"mlp.{name}": ColwiseParallel() for name in mlp_in},
            f"mlp.{mlp_out}": RowwiseParallel(output_layouts=seq if sp else Replicate()),
        }
        if sp:  # all-gather the normalised sequence slices before the column-parallel matmuls
            plan["attn"] = PrepareModuleInput(input_layouts=(seq, None), desired_input_layouts=(Replicate(), None))
            plan["mlp"] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
        parallelize_module(block, tp_mesh, plan)
        block.set_shard(tp_mesh.get_local_rank(), tp_mesh.size(), sp)  # which slice of each dropout mask
    if model.head is not None:
        parallelize_module(model, tp_mesh, {
            "norm": norm_style(),
            # Logits stay sharded over the vocabulary (a DTensor) for loss_parallel.
            "head": ColwiseParallel(input_layouts=seq if sp else Replicate(), output_layouts=Shard(-1),
                                    use_local_output=False),
        })
        if model.embed is not None and model.spec.tied_embeddings:
            model.head.weight = model.embed.tok.weight  # re-tie: both are Shard(0) over the vocabulary


__all__ = ["ReplicateParallel", "apply_tensor_parallel"]
