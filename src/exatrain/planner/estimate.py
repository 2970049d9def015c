"""One evaluation of one plan: memory per stage, FLOPs, communication bytes and (cost model) time.

This is the planner's single entry point for a plan; `exatrain estimate`, the trainer's CLI
(to attach a prediction to each run) and reports call it. Search evaluates many plans at once
through the vectorised path in ``planner.search`` and must agree with this function.
"""

from __future__ import annotations

from exatrain.catalog.hardware import ClusterSpec
from exatrain.plan import Plan, StepEstimate
from exatrain.planner.accounting.comms import comm_bytes_per_rank
from exatrain.planner.accounting.flops import hardware_flops_per_step, model_flops_per_step
from exatrain.planner.accounting.memory import FRAGMENTATION_ALLOWANCE, memory_by_stage
from exatrain.planner.accounting.params import stage_params, total_params


def estimate_plan(plan: Plan, cluster: ClusterSpec) -> StepEstimate:
    """Memory of every stage and the counts of one optimizer step for ``plan`` on ``cluster``."""
    by_stage = memory_by_stage(plan)
    worst = max(by_stage, key=lambda mb: mb.total)
    capacity = cluster.device.hbm_bytes
    notes = (
        "bytes/param: weights 4 fp32 (+2 16-bit copy in bf16), gradients 4 fp32, Adam 8 fp32; "
        "sharded per ZeRO stage",
        f"other = pipeline buffers + {FRAGMENTATION_ALLOWANCE:.0%} allocator allowance",
        "activations: Korthikanti et al. 2022 Table 2, no dropout"
        + (", flash attention" if plan.flash_attention else ""),
    )
    return StepEstimate(
        params=total_params(plan.model),
        params_by_stage=stage_params(plan),
        memory_bytes=worst,
        memory_by_stage=by_stage,
        capacity_bytes=capacity,
        fits=worst.total <= capacity,
        model_flops_per_step=model_flops_per_step(plan.model, plan.global_batch),
        hardware_flops_per_step=hardware_flops_per_step(plan.model, plan.global_batch, plan.recompute),
        comm_bytes=comm_bytes_per_rank(plan),
        notes=notes,
    )
