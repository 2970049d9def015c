"""The notes of one estimate: each run setting's own line (``Setting.note``, from its record) and a few general
ones (the runtime's memory, its version, the overlaps, the trainer's model, host memory, stragglers, the cost
model), in one order (``NOTE_ORDER``).

A setting's note is a hook on its record that reads ``NoteFacts``: the plan, its ``Resolved`` run and what the
estimate measured. A setting ``NOTE_ORDER`` does not name writes its note where ``SETTINGS_SLOT`` stands, in
SETTINGS order, so a new setting adds nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from exatrain.accounting.memory import FRAGMENTATION_ALLOWANCE
from exatrain.catalog.hardware import ClusterSpec
from exatrain.planner.cost.coefficients import CostParams
from exatrain.planner.cost.offload import offload_note
from exatrain.settings import BY_NAME, SETTINGS, trainer_cannot_build

SETTINGS_SLOT = "*"  # where the notes of settings NOTE_ORDER does not name go


@dataclass(frozen=True)
class NoteFacts:
    """What an estimate's notes read: the plan and its run (``Resolved``), the cluster and cost parameters, the
    overlaps as priced (``overlap``; ``stated``: as the user gave them; ``rules``: the engine's), the seconds they
    hid, the best case's step, whether the trainer's per-tensor model counts the plan (``own``), the logits' bytes
    an element, the FP8 rate and cast bytes, the step times and the offload's host memory and parts."""

    plan: Any
    run: Any
    cluster: ClusterSpec
    coeffs: CostParams
    overlap: str
    stated: str | None
    rules: Any
    hidden: dict[str, float]
    best_s: float | None
    own: bool
    logits_bytes: float
    fp8_speedup: float | None
    cast_bytes: float
    time_s: Any
    host: tuple[float, dict[str, float], bool] | None  # (bytes per node, offload parts, fits) where offloaded


def _header(f: NoteFacts) -> tuple[str, ...]:
    plan, rule = f.plan, f.run.engine.state_rule(f.plan.dtype, f.plan.zero_stage)
    return (
        f"runtime {plan.runtime}: memory_bytes / memory_verdict are what it keeps ({rule.mode}; the verdict: the "
        "capacity against the band of measured peaks, planner/memory_band.py; fits: not 'does not fit'); "
        "trainer_memory_bytes / trainer_fits: what exatrain's own trainer keeps today (the point prediction against "
        "the capacity)",
        "bytes/param: weights {:g}, gradients {:g}, optimizer {:g} ({})".format(
            *rule.bytes_per_param(plan.dp), rule.source
        ),
        f"other = pipeline buffers + {FRAGMENTATION_ALLOWANCE:.0%} allocator allowance",
        "activations: Korthikanti et al. 2022 Table 2"
        + (f", dropout {plan.model.dropout:g}" if plan.model.dropout else ", no dropout")
        + (", flash attention" if plan.flash_attention else ", attention scores stored"),
    )


def _version(f: NoteFacts) -> str:
    assumed = f.run.engine.version_assumed
    return f"engine version priced: {assumed}" if assumed else ""


def _float16(f: NoteFacts) -> str:
    engine = f.run.engine
    if f.plan.dtype != "float16":
        return ""
    return (
        f"gradients accumulated and reduced in {engine.accum_dtype('float16')} ({f.plan.runtime}'s own for float16); "
        "dynamic loss scaling: the gradients unscaled every step (in the optimizer step's passes) and a "
        f"found-inf all-reduce before the update (cost.step.loss_scaling_s): {engine.loss_scale_source}"
    )


def _later_accum(f: NoteFacts) -> str:
    plan, engine = f.plan, f.run.engine
    later = float(engine.later_accum(plan.dtype, plan.zero_stage))
    if not (later and plan.num_microbatches > 1):
        return ""
    return (
        f"gradient accumulation: autograd adds each micro-batch's gradient after the first into the "
        f"{engine.accum_dtype(plan.dtype)} .grad, {later:g} bytes a parameter ({engine.later_accum_source})"
    )


def _overlap(f: NoteFacts) -> str:
    # the switches that can act on this plan: the expert all-to-all's only for a MoE model
    moe_switch = f.run.engine.overlap("ep_a2a")
    switches = [s for s in f.rules.switches if f.plan.model.is_moe or moe_switch is None or s != moe_switch.switch]
    if switches:
        hidden = ", ".join(f"{k} {v:.3f} s" for k, v in f.hidden.items())
        return (
            f"overlap {f.overlap}, switches assumed on: {'; '.join(switches)} — hidden per step: {hidden} "
            "(dp: with what the pipeline's drain hides)"
        )
    return f"overlap {f.overlap}: no communication hidden" + (
        " (synchronous launches, --launch-blocking: no kernel runs beside another; each kernel's fixed "
        f"time takes the host's {f.coeffs.blocking_launch_s * 1e6:.0f} us a launch, "
        "cost.compute.with_launch_blocking)"
        if f.plan.launch_blocking
        else ""
    )


def _best_case(f: NoteFacts) -> str:
    if f.best_s is None:
        return ""
    rt = f.plan.runtime
    return (
        f"--overlap not stated: priced with {rt}'s defaults (--overlap default); with every overlap it "
        f"offers on (--overlap all) the step would take {f.best_s:.4g} s, which the band's low end reaches"
    )


def _tp_backward(f: NoteFacts) -> str:
    if not (f.rules.tp and not f.rules.tp_backward and f.plan.tp > 1):
        return ""
    return (
        f"{f.plan.runtime}'s TP overlap hides the forward's collectives (a full recomputation's rerun forward's "
        f"too); the backward's own stay exposed ({f.run.engine.overlap('tp').passes_source})"
    )


def _tp_nodes(f: NoteFacts) -> str:
    tp, cluster = f.plan.tp, f.cluster
    if tp <= cluster.gpus_per_node:
        return ""
    return (
        f"tp {tp} spans {-(-tp // cluster.gpus_per_node)} {cluster.name} nodes: its collectives "
        "are priced on the inter-node network, striped over all of a node's NICs as NCCL runs them "
        "(cost.network.collective_s)"
    )


def _trainer_memory(f: NoteFacts) -> str:
    if f.own:
        return ""
    return (
        "trainer memory: the per-tensor model counts the trainer's dense and MoE layers (with ep and cp), "
        "not latent attention, QK-norm, a separate head width, sliding windows or FP8; "
        + ("memory_bytes is the accounting's exatrain profile" if f.plan.runtime == "exatrain" else "not given")
    )


def _trainer_build(f: NoteFacts) -> str:
    return trainer_cannot_build(f.plan.model) if f.plan.runtime == "exatrain" else ""


def _offload(f: NoteFacts) -> str:
    if f.host is None:
        return ""
    host, parts, fits = f.host
    return offload_note(f.plan, f.run, f.cluster, host, parts, fits)


def _straggler(f: NoteFacts) -> str:
    if f.time_s.straggler <= 0:
        return ""
    return (
        f"straggler: the step waits for the slowest of {f.plan.gpus} GPUs, whose speeds spread "
        f"{f.coeffs.speed_spread:.1%} (a cluster's GPUs of one model; planner/cost/variability.py): "
        f"{f.time_s.straggler:.3g} s"
    )


def _cost_model(f: NoteFacts) -> str:
    return f"cost model: {f.coeffs.source} parameters for {f.cluster.device.name}"


GENERAL_NOTES: dict[str, Callable[[NoteFacts], str | tuple[str, ...]]] = {
    "header": _header,
    "engine_version": _version,
    "float16": _float16,
    "later_accum": _later_accum,
    "overlap": _overlap,
    "best_case": _best_case,
    "tp_backward": _tp_backward,
    "tp_nodes": _tp_nodes,
    "trainer_memory": _trainer_memory,
    "trainer_build": _trainer_build,
    "offload": _offload,
    "straggler": _straggler,
    "cost_model": _cost_model,
}
# The notes in the order an estimate writes them: general ones (GENERAL_NOTES) and settings (by name)
NOTE_ORDER = (
    "header",
    "attention_kernel",
    "engine_version",
    "elementwise",
    "cross_entropy",
    "grad_accum",
    "float16",
    "grad_accum_fusion",
    "later_accum",
    "adam_kernel",
    "overlap",
    "best_case",
    "tp_backward",
    "tp_nodes",
    "recompute_modules",
    "recompute_layers",
    "recompute_every",
    "moe_dispatcher",
    "cp_comm",
    "fp8",
    SETTINGS_SLOT,
    "trainer_memory",
    "trainer_build",
    "offload",
    "straggler",
    "cost_model",
)


def estimate_notes(facts: NoteFacts) -> tuple[str, ...]:
    """Every note of an estimate, in NOTE_ORDER: each general note and each setting's (``Setting.note``), the
    settings NOTE_ORDER does not name at SETTINGS_SLOT; the empty ones left out."""
    out: list[str] = []
    for name in NOTE_ORDER:
        if name == SETTINGS_SLOT:
            hooks = [s.note for s in SETTINGS if s.note is not None and s.name not in NOTE_ORDER]
        elif name in GENERAL_NOTES:
            hooks = [GENERAL_NOTES[name]]
        else:
            hooks = [BY_NAME[name].note] if BY_NAME[name].note is not None else []
        for hook in hooks:
            line = hook(facts)
            out.extend((line,) if isinstance(line, str) else line)
    return tuple(line for line in out if line)


__all__ = ["GENERAL_NOTES", "NOTE_ORDER", "NoteFacts", "SETTINGS_SLOT", "estimate_notes"]
