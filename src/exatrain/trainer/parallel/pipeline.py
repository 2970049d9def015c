"""Pipeline parallelism with ``torch.distributed.pipelining``: split, stages, schedule.

The model is cut into ``pp * interleave`` virtual stages of consecutive layers (``plan.
layers_per_stage()``, uneven splits included); pipeline rank r holds stages ``plan.stages_of_rank(r)``
(one stage, or with interleaving the looped placement r, r + pp, ..., or under zbv and dualpipev the V
r, 2 pp - 1 - r, which torch's V schedules set on the stages themselves). Each stage is a pruned copy of
the meta-device model, so a rank never builds layers it does not hold.

The zero-bubble schedules (zero_bubble, zbh1, zbv, dualpipev) run a backward as two passes: the input
gradient (``stage_backward_input``: autograd.grad of the stage's inputs, keeping the graph) and later the
weight gradient (``stage_backward_weight``: the parameters' gradients from the kept graph). torch asks
nothing more of the stage module than plain autograd: every parameter reached from the output, no
hook that runs on the whole backward (why FSDP and DDP do not combine with them, rules.py).

With tied embeddings the last stage keeps its own copy of the token embedding as the head (the
parameter stays ``head.weight`` and is initialised from ``embed.tok.weight``'s seed); the step loop
all-reduces the two copies' gradients (Megatron-LM's embedding group, Shoeybi et al. 2019).
"""

from __future__ import annotations

import copy
from itertools import accumulate
from typing import Callable

import torch
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

from exatrain.plan import Plan
from exatrain.trainer.model import Transformer


def split_stages(model: Transformer, plan: Plan, pp_rank: int) -> list[tuple[int, Transformer]]:
    """(virtual stage index, module) for each stage that ``pp_rank`` holds; ``model`` is on meta."""
    counts = plan.layers_per_stage()
    starts = [0, *accumulate(counts)]
    last = plan.virtual_stages - 1
    stages = []
    for index in plan.stages_of_rank(pp_rank):
        keep = [str(i) for i in range(starts[index], starts[index + 1])]
        if plan.virtual_stages == 1:
            stage = model
        else:  # copy the ends and only the kept layers (a deep copy of everything is slow for 100+ layers)
            layers, model.layers = model.layers, nn.ModuleDict()
            try:
                stage = copy.deepcopy(model)
            finally:
                model.layers = layers
            stage.layers = nn.ModuleDict({k: copy.deepcopy(layers[k]) for k in keep})
        if index != 0:
            stage.embed = None
        if index != last:
            stage.norm = None
            stage.head = None
        stages.append((index, stage))
    return stages


def build_schedule(
    plan: Plan,
    modules: list[tuple[int, nn.Module]],
    device: torch.device,
    group: torch.distributed.ProcessGroup,
    loss_fn: Callable,
) -> object:
    """A PipelineStage per held stage and the plan's schedule over them.

    ``scale_grads`` (the default) divides the accumulated gradients by the number of micro-batches,
    so with a mean-reduced loss per micro-batch the gradient is that of the mean over the batch."""
    stages = [PipelineStage(module, index, plan.virtual_stages, device, group=group) for index, module in modules]
    n = plan.num_microbatches
    if plan.schedule == "gpipe":
        return ScheduleGPipe(stages[0], n, loss_fn=loss_fn)
    if plan.schedule == "1f1b":
        return Schedule1F1B(stages[0], n, loss_fn=loss_fn)
    if plan.schedule == "interleaved":
        return ScheduleInterleaved1F1B(stages, n, loss_fn=loss_fn)
    if plan.schedule in ("zero_bubble", "zbh1"):  # zbh1: one stage per rank, ZB-H1's order
        return ScheduleInterleavedZeroBubble(stages, n, loss_fn=loss_fn)
    if plan.schedule == "zbv":
        return ScheduleZBVZeroBubble(stages, n, loss_fn=loss_fn)
    if plan.schedule == "dualpipev":
        return ScheduleDualPipeV(stages, n, loss_fn=loss_fn)
    raise ValueError(f"unknown schedule {plan.schedule!r}")


__all__ = ["build_schedule", "split_stages"]
