"""The rule of each run setting: the one line a plan (or a search, before it enumerates anything) breaks with a
value, or None (``Setting.problem``; ``rules.extension_problem`` runs them in SETTINGS order)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from exatrain.errors import UserError
from exatrain.registry.vocab import (
    ADAM_KERNEL_RUNTIMES,
    ADAM_KERNELS,
    ATTENTION_KERNELS,
    CP_COMM_RUNTIMES,
    CP_COMMS,
    CP_COMMS_WITHOUT_SINKS,
    CP_COMMS_WITHOUT_WINDOWS,
    CROSS_ENTROPY,
    CROSS_ENTROPY_RUNTIMES,
    DISTRIBUTE_SAVED_RUNTIMES,
    ELEMENTWISE,
    FLOAT16_RUNTIMES,
    FLOAT16_WHY_NOT,
    FP8_PARAM_GATHER_RUNTIMES,
    FP8_RECIPES,
    GRAD_ACCUM,
    GRAD_ACCUM_FUSION,
    GRAD_ACCUM_FUSION_RUNTIMES,
    GRAD_ACCUM_RUNTIMES,
    MOE_DISPATCHERS,
    OFFLOAD_RUNTIMES,
    OFFLOADS,
    RECOMPUTE_EVERY_RUNTIMES,
    RECOMPUTE_LAYERS_RUNTIMES,
    RECOMPUTE_MODULES,
    RECOMPUTE_MODULES_RUNTIMES,
    RUNTIMES,
    listed,
)


def dtype_problem(dtype: str, runtime: str) -> str | None:
    """Why ``runtime`` does not train in ``dtype``, or None (an unknown dtype or runtime is its own rule's)."""
    if dtype == "float16" and runtime in RUNTIMES and runtime not in FLOAT16_RUNTIMES:
        why = FLOAT16_WHY_NOT.get(runtime, "trains in bfloat16 or float32, not float16")
        return f"--runtime {runtime} {why}: use --dtype bfloat16, or --runtime {' or '.join(FLOAT16_RUNTIMES)}"
    return None


def offload_problem(offload: str, runtime: str, zero_stage, dp=None) -> str | None:
    """Why ``runtime`` cannot keep ``offload`` (OFFLOADS) in host memory at ``zero_stage`` (and ``dp``, its replicas
    dp x cp: exatrain's trainer applies FSDP2 only over more than one), or None."""
    if offload == "none":
        return None
    if offload not in OFFLOADS:
        return f"--offload must be one of {', '.join(OFFLOADS)}, got {offload!r}"
    stages = OFFLOAD_RUNTIMES[offload].get(runtime)
    if stages is None:
        names = list(OFFLOAD_RUNTIMES[offload])
        who = ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]
        also = [v for v, by in OFFLOAD_RUNTIMES.items() if runtime in by]
        return f"--offload {offload} is not run by {runtime}; it is run by {who}" + (
            f" ({runtime} offloads --offload {also[0]})" if also else ""
        )
    if isinstance(zero_stage, int) and zero_stage not in stages:
        return f"--offload {offload} under {runtime} needs --zero {' or '.join(map(str, stages))} (got {zero_stage})"
    if runtime == "exatrain" and isinstance(dp, int) and dp < 2:
        return "--offload params runs through FSDP2, which exatrain's trainer applies only with dp x cp > 1"
    return None


def cp_comm_for(runtime: str, chosen: str = "", model: Any = None) -> str:
    """The context-parallel exchange ``runtime`` runs: ``chosen`` (a plan's --cp-comm) if it offers it, else its
    first that runs ``model`` (one with sliding windows or attention sinks needs an exchange that runs them), else
    its first. A one-line UserError for a way it does not offer."""
    offered = CP_COMM_RUNTIMES.get(runtime, ("p2p",))
    if chosen:
        if chosen not in CP_COMMS:
            raise UserError(f"--cp-comm must be one of {', '.join(CP_COMMS)}, got {chosen!r}")
        if chosen not in offered:
            raise UserError(
                f"--cp-comm {chosen}: {runtime} does not run context parallelism that way; it offers "
                f"{', '.join(offered)}"
            )
        return chosen
    unable = cp_comms_unable(runtime, model)
    return next((c for c in offered if c not in unable), offered[0])


def cp_comms_unable(runtime: str, model: Any) -> dict[str, str]:
    """The context-parallel exchanges of ``runtime`` that cannot run ``model``, each with what it lacks
    (sliding-window attention, attention sinks)."""
    lacks: dict[str, list[str]] = {}
    for table, attr, what in (
        (CP_COMMS_WITHOUT_WINDOWS, "sliding_window", "sliding-window attention"),
        (CP_COMMS_WITHOUT_SINKS, "attention_sinks", "attention sinks"),
    ):
        if getattr(model, attr, 0):
            for c in table.get(runtime, ()):
                lacks.setdefault(c, []).append(what)
    return {c: listed(whats) for c, whats in lacks.items()}


# ---- the rules of the settings (one line each; ``rules.extension_problem`` runs them in SETTINGS order) -------
def heads_not_split(model: Any, tp, cp):
    """Where cp does not divide the heads or the K,V heads a rank holds at tp (scalars or arrays)."""
    tp, cp = np.maximum(np.asarray(tp), 1), np.maximum(np.asarray(cp), 1)
    return ((model.heads // tp) % cp != 0) | ((model.kv_heads // tp) % cp != 0)


def cp_comm_problem(comm: str, runtime: str, model: Any, tp: int | None = None, cp: int | None = None) -> str | None:
    """Why ``runtime`` cannot run context parallelism by ``comm`` (Plan.cp_comm; "" = its own for the model)
    for ``model`` (and, given tp and cp, that layout), or None: a way it does not offer, a way that does not run
    the model's sliding windows (Transformer Engine's p2p ring) or attention sinks (its ring and all-gather),
    or an all-to-all whose cp does not divide the heads and K,V heads a rank holds (each rank attends over the
    whole sequence for heads/cp of them)."""
    if runtime not in RUNTIMES:
        return None  # the runtime's own rule reports it
    try:
        chosen = cp_comm_for(runtime, comm, model)
    except UserError as e:
        return str(e)
    unable = cp_comms_unable(runtime, model)
    if chosen in unable:
        others = [c for c in CP_COMM_RUNTIMES[runtime] if c not in unable]
        return f"{runtime}'s {chosen} context parallelism does not run {unable[chosen]}, which {model.name} has" + (
            f": use --cp-comm {' or '.join(others)}" if others else ""
        )
    if chosen == "a2a" and tp and cp and cp > 1 and bool(heads_not_split(model, tp, cp)):
        return (
            f"--cp {cp} by all-to-all splits the {model.heads // tp} heads and {model.kv_heads // tp} K,V heads a "
            f"rank holds at tp {tp} into cp groups: cp must divide both (or use another --cp-comm)"
        )
    return None


def recompute_modules_problem(modules, recompute, runtime: str) -> str | None:
    """Why a plan cannot recompute ``modules`` (RECOMPUTE_MODULES) under ``recompute`` on ``runtime``, or None:
    only Megatron-Core recomputes by module, and only under selective granularity (it ignores the list otherwise;
    transformer_layer.py reads recompute_modules under recompute_granularity == "selective")."""
    if not modules:
        return None
    if not isinstance(modules, tuple) or any(m not in RECOMPUTE_MODULES for m in modules):
        return f"recompute_modules must be a list of {', '.join(RECOMPUTE_MODULES)}, got {modules!r}"
    if runtime not in RECOMPUTE_MODULES_RUNTIMES:
        return (
            f"--recompute-modules is Megatron-Core's choice of what selective recomputation reruns; runtime "
            f"{runtime} reruns its own (exatrain and Megatron-DeepSpeed the attention core, torchtitan its per-op "
            "policy): use --runtime megatron-core, or drop it"
        )
    if recompute != "selective":
        return (
            f"--recompute-modules chooses what selective recomputation reruns; with --recompute {recompute} "
            "Megatron-Core ignores it: use --recompute selective, or drop it"
        )
    return None


def distribute_saved_problem(on, plan) -> str | None:
    """Why ``plan`` cannot keep its full-recomputation checkpoints split over its tp ranks
    (DISTRIBUTE_SAVED_RUNTIMES), or None: off, or on with full recomputation, tp > 1 and no sequence parallelism
    (Megatron-Core's TransformerConfig refuses it with sequence parallelism, whose checkpoints are split already)."""
    if not on:
        return None
    flag = "--distribute-saved-activations"
    if plan.runtime not in DISTRIBUTE_SAVED_RUNTIMES:
        return (
            f"{flag} is Megatron-Core's --distribute-saved-activations and Megatron-DeepSpeed's "
            f"--partition-activations; runtime {plan.runtime} does not split its checkpoints: use --runtime "
            f"{' or '.join(DISTRIBUTE_SAVED_RUNTIMES)}, or drop it"
        )
    if plan.recompute != "full":
        return (
            f"{flag} splits full recomputation's checkpoints; with --recompute {plan.recompute}: use --recompute full"
        )
    if plan.tp < 2:
        return f"{flag} splits each checkpoint over the tensor-parallel ranks; with --tp 1 there is none to split over"
    if plan.sequence_parallel:
        return (
            f"{flag} with --sequence-parallel: the checkpoints are split over the tp ranks already (Megatron-Core "
            "refuses both); drop one"
        )
    return None


def recompute_layers_problem(n, recompute, runtime: str, every: bool = False) -> str | None:
    """Why a plan cannot fully recompute only the first ``n`` layers of each stage (RECOMPUTE_LAYERS_RUNTIMES;
    ``every``: only one layer in ``n``, RECOMPUTE_EVERY_RUNTIMES), or None: a whole number, under full
    recomputation, on an engine that does it."""
    flag = "--recompute-every" if every else "--recompute-layers"
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        return f"{flag} must be a whole number of layers >= 1 (0: every layer), got {n!r}"
    if not n:
        return None
    if every and runtime not in RECOMPUTE_EVERY_RUNTIMES:
        return (
            f"--recompute-every is torchtitan's layer-level selective checkpointing (selective_ac_option N; "
            f"FSDP1's every-Nth-block check_fn under llm-foundry); runtime {runtime} does not pick layers that "
            f"way: use --runtime {' or '.join(RECOMPUTE_EVERY_RUNTIMES)}, or drop it"
            + (" (Megatron-Core: --recompute-layers, the first N of each stage)" if runtime == "megatron-core" else "")
        )
    if not every and runtime not in RECOMPUTE_LAYERS_RUNTIMES:
        return (
            f"--recompute-layers is Megatron-Core's --recompute-method block --recompute-num-layers; runtime "
            f"{runtime} does not pick layers that way: use --runtime megatron-core, or drop it"
            + (" (torchtitan: --recompute-every, one layer in N)" if runtime == "torchtitan" else "")
        )
    what = "one layer in N" if every else "the first N layers of each stage"
    if recompute != "full":
        return (
            f"{flag} N recomputes {what} whole; with --recompute {recompute} there is no whole-layer "
            "recomputation: use --recompute full, or drop it"
        )
    return None


def adam_kernel_problem(kernel: str, runtime: str) -> str | None:
    """Why a plan (or a search) cannot run Adam's ``kernel`` (ADAM_KERNELS; "" is the runtime's own) under
    ``runtime``, or None."""
    if not kernel:
        return None
    if kernel not in ADAM_KERNELS:
        return f"--adam-kernel must be one of {', '.join(ADAM_KERNELS)}, got {kernel!r}"
    if runtime not in ADAM_KERNEL_RUNTIMES:
        own = (
            "picks its own (fused over plain tensors on a GPU, foreach over DTensors and on the CPU)"
            if runtime == "exatrain"
            else "runs its fused Adam"
        )
        return (
            f"--adam-kernel is torchtitan's switch (--optimizer.implementation); {runtime} {own}: use "
            f"--runtime {' or '.join(ADAM_KERNEL_RUNTIMES)}, or drop it"
        )
    return None


def grad_accum_fusion_problem(fusion: str, runtime: str) -> str | None:
    """Why a plan (or a search) cannot say ``fusion`` (GRAD_ACCUM_FUSION; "" is the runtime's own) for
    whether its gradients accumulate inside the weight-gradient GEMMs under ``runtime``, or None."""
    if not fusion:
        return None
    if fusion not in GRAD_ACCUM_FUSION:
        return f"--grad-accum-fusion must be one of {', '.join(GRAD_ACCUM_FUSION)}, got {fusion!r}"
    if runtime not in GRAD_ACCUM_FUSION_RUNTIMES:
        return (
            f"--grad-accum-fusion is Megatron-Core's switch (--no-gradient-accumulation-fusion); {runtime} "
            f"accumulates its gradients its own way: use --runtime {' or '.join(GRAD_ACCUM_FUSION_RUNTIMES)}, "
            "or drop it"
        )
    return None


def grad_accum_problem(accum: str, dtype: str, runtime: str) -> str | None:
    """Why a plan (or a search) cannot accumulate its gradients in ``accum`` (GRAD_ACCUM; "" is the
    runtime's own) training in ``dtype`` under ``runtime``, or None."""
    if not accum:
        return None
    if accum not in GRAD_ACCUM:
        return f"--grad-accum must be one of {', '.join(GRAD_ACCUM)}, got {accum!r}"
    if dtype != "bfloat16":
        return f"--grad-accum sets how bfloat16 training accumulates its gradients; this one trains in {dtype}: drop it"
    if runtime not in GRAD_ACCUM_RUNTIMES[accum]:
        return (
            f"{runtime} accumulates bfloat16 gradients in float32 only (--grad-accum {accum} is offered by "
            f"{' and '.join(GRAD_ACCUM_RUNTIMES[accum])}): drop it"
        )
    return None


def runtime_rule(v, p) -> str | None:
    if v not in RUNTIMES:
        return f"--runtime must be one of {', '.join(RUNTIMES)}, got {v!r}"
    return dtype_problem(p.dtype, v)


def fp8_rule(v, p) -> str | None:
    if v and v not in FP8_RECIPES:
        return f"--fp8 must be one of {', '.join(FP8_RECIPES)}, got {v!r}"
    if v and p.dtype != "bfloat16":
        return "--fp8 runs its GEMMs in FP8 inside bfloat16 training: use --dtype bfloat16"
    return None


def dispatcher_rule(v, p) -> str | None:
    if v not in MOE_DISPATCHERS:
        return f"--moe-dispatcher must be one of {', '.join(MOE_DISPATCHERS)}, got {v!r}"
    if v != "alltoall" and not p.model.is_moe:
        return f"--moe-dispatcher {v} dispatches a mixture-of-experts layer's tokens; {p.model.name} has no experts"
    return None


def not_moe(flag: str, p) -> str:
    return f"{flag} sets how a mixture-of-experts layer's tokens are routed; {p.model.name} has no experts"


def capacity_rule(v, p) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
        return f"--moe-capacity-factor must be a number >= 0 (0: dropless), got {v!r}"
    if v and not p.model.is_moe:
        return not_moe("--moe-capacity-factor", p)
    if v and p.moe_dispatcher != "alltoall":
        # Megatron-Core refuses it too (transformer_config.py: "moe_expert_capacity_factor only works with
        # alltoall token dispatcher")
        return (
            f"--moe-capacity-factor drops and pads tokens in the alltoall dispatcher only; drop it or use "
            f"--moe-dispatcher alltoall (not {p.moe_dispatcher})"
        )
    return None


def balance_rule(v, p) -> str | None:
    return not_moe("--moe-force-balance", p) if v and not p.model.is_moe else None


def gather_rule(v, p) -> str | None:
    if not v:
        return None
    need = FP8_PARAM_GATHER_RUNTIMES.get(p.runtime)
    if not p.fp8:
        return "--fp8-param-gather gathers the FP8 GEMMs' weights in FP8: it needs --fp8 (a scaling recipe)"
    if need is None:
        return (
            f"--fp8-param-gather is Megatron-Core's --fp8-param-gather or torchtitan's "
            f"enable_fsdp_float8_all_gather; runtime {p.runtime} has no such switch: "
            "use --runtime megatron-core or torchtitan, or drop it"
        )
    if p.runtime == "torchtitan" and p.fp8 != "current":
        return (
            f"torchtitan gathers FP8 weights with tensorwise scaling only: use --fp8 current (not {p.fp8}), "
            "or drop --fp8-param-gather"
        )
    if isinstance(p.zero_stage, int) and p.zero_stage < need:
        what = "the distributed optimizer" if p.runtime == "megatron-core" else "FSDP"
        return (
            f"--fp8-param-gather needs {what} (ZeRO-{need} or higher) under {p.runtime}, which gathers the "
            f"weights it sends: use --zero {need}, or drop it"
        )
    return None


def kernel_rule(v, p) -> str | None:
    if v and v not in ATTENTION_KERNELS:
        return f"--attention-kernel must be one of {', '.join(ATTENTION_KERNELS)}, got {v!r}"
    if v and not p.flash_attention:
        return (
            f"--attention-kernel {v} names flash attention's kernel; this plan has flash attention off "
            "(--no-flash-attention): drop one of them"
        )
    return None


def elementwise_rule(v, p) -> str | None:
    if v and v not in ELEMENTWISE:
        return f"--elementwise must be one of {', '.join(ELEMENTWISE)}, got {v!r}"
    return None


def loss_rule(v, p) -> str | None:
    if v and v not in CROSS_ENTROPY:
        return f"--cross-entropy must be one of {', '.join(CROSS_ENTROPY)}, got {v!r}"
    if v and p.runtime not in CROSS_ENTROPY_RUNTIMES[v]:
        what = {
            "upcast": "torch's cross_entropy over an fp32 copy",
            "inplace": "Megatron's vocab-parallel loss",
            "fused": "one kernel over the 16-bit logits (a compiled loss, flash-attn's xentropy)",
        }[v]
        return (
            f"--cross-entropy {v} is {what}, which {p.runtime} does not run: use "
            f"--runtime {' or '.join(CROSS_ENTROPY_RUNTIMES[v])}, or drop it"
        )
    return None


def cp_comm_rule(v, p) -> str | None:
    if not isinstance(v, str):
        return f"cp_comm must be a string, got {v!r}"
    tp = p.dims.tp if isinstance(p.dims.tp, int) and not isinstance(p.dims.tp, bool) else None
    return cp_comm_problem(v, p.runtime, p.model, tp, p.dims.cp) if (p.dims.cp > 1 or v) else None
