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

A MoE layer (trainer/moe.py) is replicated over tp except for its shared experts: every tp rank
routes all the tokens of its sequence (the full sequence under sequence parallelism: the layer's
input is all-gathered, as a dense MLP's is, and its output sliced back) and runs the same routed
experts (expert-tensor-parallel size 1, parallel/expert.py places them); the shared experts are
column/row-parallel like a dense MLP, with one all-reduce (Megatron-Core's MoE layer). The router is
replicated (``ReplicateParams``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.parallel.style import ParallelStyle

from exatrain.trainer.model import Transformer
from exatrain.trainer.moe import MoE


class ReplicateParallel(ParallelStyle):
    """Parameters as replicated DTensors; inputs and outputs stay plain (replicated) tensors.

    For modules whose every tp rank computes the same thing on the same input (norms without
    sequence parallelism, the position table): no communication, forward or backward."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh, None, _inputs_to_replicate, _outputs_to_local)


class ReplicateParams(ParallelStyle):
    """Parameters as replicated DTensors, inputs and outputs untouched: for modules that compute on
    plain tensors with their parameters' local values (the MoE router)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh)


def _inputs_to_replicate(module: nn.Module, inputs: tuple[Any, ...], mesh: DeviceMesh) -> tuple[Any, ...]:
    return tuple(
        DTensor.from_local(x, mesh, [Replicate()], run_check=False)
        if isinstance(x, torch.Tensor) and not isinstance(x, DTensor)
        else x
        for x in inputs
    )


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
            parallelize_module(
                model.embed, tp_mesh, PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=seq)
            )
    for block in model.layers.values():
        plan = {
            "attn_norm": norm_style(),
            "attn.wq": ColwiseParallel(),
            "attn.wk": ColwiseParallel(),
            "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(output_layouts=seq if sp else Replicate()),
            "mlp_norm": norm_style(),
            **(_moe_plan(block.mlp, sp) if isinstance(block.mlp, MoE) else _mlp_plan(block.mlp, sp)),
        }
        if sp:  # all-gather the normalised sequence slices before the column-parallel matmuls
            plan["attn"] = PrepareModuleInput(input_layouts=(seq, None), desired_input_layouts=(Replicate(), None))
        parallelize_module(block, tp_mesh, plan)
        block.set_shard(tp_mesh.get_local_rank(), tp_mesh.size(), sp)  # which slice of each dropout mask
    if model.head is not None:
        parallelize_module(
            model,
            tp_mesh,
            {
                "norm": norm_style(),
                # Logits stay sharded over the vocabulary (a DTensor) for loss_parallel.
                "head": ColwiseParallel(
                    input_layouts=seq if sp else Replicate(), output_layouts=Shard(-1), use_local_output=False
                ),
            },
        )
        if model.embed is not None and model.spec.tied_embeddings:
            model.head.weight = model.embed.tok.weight  # re-tie: both are Shard(0) over the vocabulary


def _mlp_plan(mlp: nn.Module, sp: bool) -> dict[str, ParallelStyle]:
    """A dense MLP: column-parallel in, row-parallel out (one all-reduce, or reduce-scatter under SP)."""
    seq = Shard(1)
    mlp_in, mlp_out = (("w1", "w3"), "w2") if mlp.gated else (("fc1",), "fc2")
    plan: dict[str, ParallelStyle] = {
        **{f"mlp.{name}": ColwiseParallel() for name in mlp_in},
        f"mlp.{mlp_out}": RowwiseParallel(output_layouts=seq if sp else Replicate()),
    }
    if sp:
        plan["mlp"] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
    return plan


def _moe_plan(moe: MoE, sp: bool) -> dict[str, ParallelStyle]:
    """A MoE MLP (module doc): replicated router, tensor-parallel shared experts; the routed experts
    are placed by parallel/expert.py."""
    seq = Shard(1)
    plan: dict[str, ParallelStyle] = {"mlp.router": ReplicateParams()}
    if moe.shared is not None:
        plan.update(
            {
                "mlp.shared.w1": ColwiseParallel(),
                "mlp.shared.w3": ColwiseParallel(),
                "mlp.shared.w2": RowwiseParallel(output_layouts=Replicate()),
            }
        )
    if sp:  # the whole sequence in (all-gather); this rank's slice of the output out (backward: all-gather)
        plan["mlp"] = PrepareModuleInputOutput(
            input_layouts=(seq,),
            desired_input_layouts=(Replicate(),),
            use_local_input=True,
            output_layouts=(Replicate(),),
            desired_output_layouts=(seq,),
            use_local_output=True,
        )
    return plan


__all__ = ["ReplicateParallel", "ReplicateParams", "apply_tensor_parallel"]
