"""``exatrain estimate --trace``: an estimate with the traced peak of the trainer's own model.

One rank of every distinct stage shape is traced over a short op order and each stage's peak
replayed from its ops (``trace.fast_trace``: FakeTensorMode, a fake process group, nothing
allocated); ``--trace full`` traces one rank of every stage over the whole step instead (the check of
the fast one). The estimate gains ``traced_memory_bytes`` (the stage with the largest traced peak)
and a note listing every stage's traced peak beside the trainer memory model's, and the model's error
against the trace per stage. Dense, mixture-of-experts (with ep; routing traced at a balanced load:
trace.py) and context-parallel (cp) plans alike; a MoE or cp layout the trainer refuses
(``TrainConfig.check``) is refused here in its words, before anything is traced.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from exatrain.catalog import ClusterSpec
from exatrain.errors import UserError
from exatrain.plan import MemoryBreakdown, Plan, StepEstimate
from exatrain.accounting.memory import FRAGMENTATION_ALLOWANCE
from exatrain.accounting.trainer_memory import trainer_memory_by_stage

GiB = 1024**3
MiB = 1024**2
_routing_note = "; MoE routing at a balanced load"


TRACE_MODES = ("fast", "full")


def trace_mode(trace: bool | str | None) -> str | None:
    """``estimate(trace=...)``: False/None no trace, True or "fast" the fast trace, "full" every stage
    with every micro-batch."""
    if trace is None or trace is False:
        return None
    if trace is True:
        return "fast"
    if trace not in TRACE_MODES:
        raise UserError(f"trace must be one of {', '.join(TRACE_MODES)} (or True/False), not {trace!r}")
    return str(trace)


def traced_estimate(
    plan: Plan, cluster: ClusterSpec, progress: Callable[[str], None] | None = None, mode: str = "fast"
) -> StepEstimate:
    """``plan.estimate`` with ``traced_memory_bytes`` and a note; ``progress`` hears of each traced rank."""
    if plan.estimate is None:
        raise ValueError("traced_estimate needs a plan with its estimate")
    try:
        from exatrain.bench.trace import fast_trace, trace_plan
    except ModuleNotFoundError as exc:  # pragma: no cover - torch missing
        raise UserError(f"--trace needs torch ({exc}); install exatrain[train]") from None
    on_cpu = cluster.device.name == "cpu"
    if plan.model.is_moe or plan.cp > 1:
        _trainer_runs_it(plan, on_cpu)
    try:
        if mode == "full":
            traced = trace_plan(plan, accelerator=not on_cpu, full=True, progress=progress)
            how = "one rank of every stage over the whole step"
        else:
            fast = fast_trace(plan, accelerator=not on_cpu, progress=progress)
            traced = fast.stages
            how = (
                f"one rank of each of {len(fast.probes)} stage shape(s) traced over a short op order, every "
                "stage's peak replayed over its own order"
                + (
                    f" (stage(s) {', '.join(str(r + 1) for r in fast.traced_in_full)} traced in full)"
                    if fast.traced_in_full
                    else ""
                )
            )
    except Exception as exc:  # the trace is an extra view of the plan; its failure is one line
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise UserError(f"--trace failed for this plan ({type(exc).__name__}: {first})") from None
    worst = max(traced, key=lambda t: t.total)
    modelled = trainer_memory_by_stage(plan, on_cpu=on_cpu)
    unit, scale = ("GiB", GiB) if worst.total >= GiB else ("MiB", MiB)
    # The model's tensors (without its allocator allowance, which a trace of tensors has no part of).
    errors = [m.total / (1 + FRAGMENTATION_ALLOWANCE) / t.total - 1 for m, t in zip(modelled, traced)]
    note = (
        "traced (the trainer's model per stage under FakeTensorMode, one step, no allocation; "
        + how
        + "; 16-bit weight copies count as activations"
        + (_routing_note if plan.model.is_moe else "")
        + ("" if on_cpu else "; the CPU's kernels, the norms in fp32 as CUDA's autocast runs them (bench/gpu_rules.py)")
        + "): "
        + ", ".join(f"{t.total / scale:.2f}" for t in traced)
        + f" {unit}; trainer memory model: "
        + ", ".join(f"{m.total / scale:.2f}" for m in modelled)
        + f" {unit}; model tensors (without the {FRAGMENTATION_ALLOWANCE:.0%} allowance) vs traced: "
        + ", ".join(f"{e:+.1%}" for e in errors)
    )
    est = plan.estimate
    return dataclasses.replace(
        est,
        traced_memory_bytes=MemoryBreakdown(
            weights=worst.weights,
            gradients=worst.gradients,
            optimizer=worst.optimizer,
            activations=worst.activations,
            other=worst.other,
        ),
        notes=tuple(est.notes) + (note,),
    )


def _trainer_runs_it(plan: Plan, on_cpu: bool) -> None:
    """Refuse, in the trainer's own words, a MoE or cp layout the trainer does not run (its
    ``TrainConfig.check``: e.g. ep with ZeRO-1/2/3, cp with a MoE model): the trace runs the
    trainer's code, and would otherwise trace a layout no run has."""
    from exatrain.trainer.config import TrainConfig

    try:
        TrainConfig(plan=plan, device="cpu" if on_cpu else "cuda").check()
    except UserError as exc:
        raise UserError(f"--trace traces what the trainer runs, and it does not run this plan: {exc}") from None


__all__ = ["TRACE_MODES", "trace_mode", "traced_estimate"]
