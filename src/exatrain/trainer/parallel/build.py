"""This rank's part of the model, with every technique of the plan applied in a fixed order.

    meta-device model -> pipeline split -> TP/SP -> EP -> CP -> activation checkpointing -> compile
                      -> FSDP -> materialise (deterministic weights) -> DDP

Why this order (torchtitan's, for these reasons):
* the pipeline split comes first so that everything after works on one stage's module, and a rank
  never builds (let alone allocates) layers another rank holds;
* tensor parallelism next, on the plain modules: its styles replace ``nn.Linear``/``nn.Embedding``
  parameters with DTensors and hook the module boundaries, which needs the unwrapped modules;
* expert parallelism (MoE models) places the routed experts on the (ep, tp) mesh once tensor
  parallelism has placed everything else in the layer (parallel/expert.py);
* context parallelism (cp > 1) only tells the stage's position-aware parts which positions this
  rank holds (parallel/context.py); it changes no parameter, so its place among these is free;
  data parallelism then treats the cp ranks as more replicas (``Mesh.grad_mesh``: dp x cp);
* activation checkpointing wraps the already-sharded computation, so a recompute replays the same
  tensor-parallel collectives as the forward; it is switched on inside each layer, so the layer
  (and its parameter names) stays as it is for the wrappers after it;
* ``torch.compile`` (``--compile``) per layer, after checkpointing so it sees the checkpointed
  regions; it compiles each block's ``forward``, not the module call, so the hooks FSDP and DDP
  register stay outside the compiled graphs, and parameter names do not change;
* FSDP last among the meta-device steps: it must see the final parameters (it shards TP's DTensors
  a second time) and its per-layer units must enclose the checkpointed layer, so the weights are
  gathered while a recompute runs; applied on meta, so no rank ever holds unsharded weights;
* DDP needs real tensors (its constructor broadcasts them), so it wraps after materialisation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import parametrize

from exatrain.plan import Plan
from exatrain.trainer.fp8 import convert_to_fp8
from exatrain.trainer.init import materialize
from exatrain.trainer.model import Transformer
from exatrain.trainer.parallel.activation import apply_activation_checkpointing, apply_attention_kernel
from exatrain.trainer.parallel.context import ContextShard, apply_context_parallel, context_shard
from exatrain.trainer.parallel.data import apply_ddp, apply_fsdp, localize_dtensor_params
from exatrain.trainer.parallel.expert import apply_expert_parallel, expert_parameters
from exatrain.trainer.parallel.grads import GradEntry, grad_entries
from exatrain.trainer.parallel.mesh import Mesh
from exatrain.trainer.parallel.pipeline import split_stages
from exatrain.trainer.parallel.tensor import apply_tensor_parallel


@dataclass
class ParallelModel:
    """The stages this rank holds: (virtual stage index, module as run) in model order."""

    stages: list[tuple[int, nn.Module]]
    plan: Plan
    tied_copies: list[nn.Parameter]  # this rank's copy of a tied embedding split over pp (else empty)
    entries: list[GradEntry]
    inner: list[nn.Module]  # the stage modules without their DDP wrapper (parameter names as in the model)
    context: ContextShard | None = None  # this rank's share of every sequence under cp > 1

    @property
    def modules(self) -> list[nn.Module]:
        return [m for _, m in self.stages]

    def parameters(self) -> list[nn.Parameter]:
        return [e.param for e in self.entries]

    @property
    def holds_first(self) -> bool:
        return any(i == 0 for i, _ in self.stages)

    @property
    def holds_last(self) -> bool:
        return any(i == self.plan.virtual_stages - 1 for i, _ in self.stages)

    @property
    def reduce_after_schedule(self) -> bool:
        """Average gradients over dp after the pipeline schedule instead of inside DDP (see
        ``data_parallel_kind``)."""
        return data_parallel_kind(self.plan) == "allreduce"


def data_parallel_kind(plan: Plan) -> str:
    """How gradients are synchronised over dp: none, ddp, fsdp, or allreduce (after the schedule).

    Under a pipeline, ZeRO-0/1 gradients are averaged after the schedule (see parallel/data.py: DDP's
    reducer does not follow the schedules' gradient accumulation). FSDP follows it (the stage drives
    its reduce-scatter), except through the zero-bubble weight pass: refused by TrainConfig.check.
    With expert parallelism the experts' gradients are averaged over another group than the rest
    (grads.average_over_dp), which DDP's single group cannot do: after the backward too. The cp ranks
    hold replicas like the dp ranks: the group is dp x cp (parallel/context.py)."""
    if plan.dp * plan.cp == 1:
        return "none"
    if plan.zero_stage >= 2:
        return "fsdp"
    return "allreduce" if plan.pp > 1 or plan.ep > 1 else "ddp"


def execution_plan(plan: Plan) -> Plan:
    """The plan as executed: without a pipeline (pp 1) there are no virtual stages to interleave,
    so a plan that names some runs as the one whole model on each rank."""
    if plan.pp == 1 and (plan.interleave != 1 or plan.stage_layers):
        return plan.replace(interleave=1, stage_layers=(), schedule="1f1b")
    return plan


def stored_param(module: nn.Module, name: str) -> nn.Parameter:
    """The parameter object behind ``module.<name>`` (the local shard when parametrized)."""
    if parametrize.is_parametrized(module, name):
        return getattr(module.parametrizations, name).original
    return getattr(module, name)


def compile_blocks(module: nn.Module) -> None:
    """torch.compile every transformer block's forward in place (one graph, reused by every block:
    they share their code and differ only in their parameters, which the graph takes as inputs)."""
    for block in module.layers.values():
        block.forward = torch.compile(block.forward)


def shard_stage(
    module: nn.Module, plan: Plan, tp_mesh, dp_mesh, compile: bool = False, expert=None, context=None
) -> None:
    """Steps 2-4 on one meta-device stage, in place: TP/SP, expert parallelism (``expert``: a callable
    that places a stage's routed experts; MoE models only), activation checkpointing and the attention
    kernel, compile, FSDP (bench/trace.py applies the same to trace a rank's memory). ``dp_mesh``: the
    replicas' mesh (dp, or dp x cp); ``context``: this rank's ContextShard under cp > 1."""
    if plan.tp > 1:
        apply_tensor_parallel(module, tp_mesh, sequence_parallel=plan.sequence_parallel)  # 2.
    if expert is not None:
        expert(module)
    if context is not None:
        apply_context_parallel(module, context)
    apply_activation_checkpointing(module, plan.recompute)  # 3.
    apply_attention_kernel(module, plan.flash_attention)
    if compile:
        compile_blocks(module)
    if data_parallel_kind(plan) == "fsdp":
        half = plan.dtype if plan.dtype != "float32" else None
        apply_fsdp(module, dp_mesh, zero_stage=plan.zero_stage, half=half, offload=plan.offload == "params")  # 4.


def local_params_needed(plan: Plan) -> bool:
    """DDP and ZeroRedundancyOptimizer work on plain tensors (their broadcasts have no DTensor rule):
    with tensor or expert parallelism and ZeRO-0/1 over dp > 1, a materialised stage's DTensor
    parameters are stored as local shards (``localize_dtensor_params``)."""
    return (plan.tp > 1 or plan.ep > 1) and data_parallel_kind(plan) in ("ddp", "allreduce")


def parallelize(
    plan: Plan, mesh: Mesh, seed: int, compile: bool = False, moe_aux_loss_coef: float = 0.01
) -> ParallelModel:
    """Build, shard, initialise and wrap this rank's stages (see the module docstring for the order).
    ``moe_aux_loss_coef``: weight of the MoE layers' load-balancing loss (trainer/moe.py)."""
    with torch.device("meta"):
        whole = Transformer(plan.model)
    ddp = data_parallel_kind(plan) == "ddp"
    context = context_shard(mesh, plan.model.seq_len) if plan.cp > 1 else None
    stages: list[tuple[int, nn.Module]] = []
    tied: list[nn.Parameter] = []
    inner: list[nn.Module] = []
    for index, module in split_stages(whole, plan, mesh.pp_rank):  # 1. pipeline split
        if plan.fp8:  # FP8 GEMMs (trainer/fp8.py): still plain nn.Linear subclasses for the steps below
            convert_to_fp8(module)
        expert = (
            (lambda mod: apply_expert_parallel(mod, mesh, plan, aux_loss_coef=moe_aux_loss_coef))
            if plan.model.is_moe
            else None
        )
        shard_stage(
            module, plan, mesh.tp_mesh, mesh.grad_mesh, compile=compile, expert=expert, context=context
        )  # 2.-4.
        # FSDP2's CPU offload (--offload params) needs its sharded parameters made in host memory
        on_host = plan.offload == "params" and data_parallel_kind(plan) == "fsdp"
        materialize(module, plan.model, seed, torch.device("cpu") if on_host else mesh.device, mesh.device)
        run: nn.Module = module
        if local_params_needed(plan):
            localize_dtensor_params(module)
        if ddp:
            run = apply_ddp(module, mesh.grad_mesh)  # 5.
        if plan.pp > 1 and plan.model.tied_embeddings:
            if module.embed is not None:
                tied.append(stored_param(module.embed.tok, "weight"))
            if module.head is not None:
                tied.append(stored_param(module.head, "weight"))
        stages.append((index, run))
        inner.append(module)
    experts = expert_parameters(inner) if plan.ep > 1 else []
    entries = grad_entries(
        inner, tp=plan.tp, dp=plan.dp * plan.cp, tied_copies=tied, expert_params=experts, edp_group=mesh.edp_group
    )
    return ParallelModel(stages=stages, plan=plan, tied_copies=tied, entries=entries, inner=inner, context=context)


__all__ = [
    "ParallelModel",
    "compile_blocks",
    "data_parallel_kind",
    "execution_plan",
    "local_params_needed",
    "parallelize",
    "shard_stage",
    "stored_param",
]
