"""What the exatrain trainer and the other engines' configs say about a setting they do not run: the trainer's
refusals (``Setting.trainer``), the plan's label parts (``Setting.label``) and the notes an engine config's export
carries where it cannot write a value (``Setting.notes``)."""

from __future__ import annotations

from typing import Any, Callable

from exatrain.registry.problems import cp_comm_for


# ---- the exatrain trainer's refusals (TrainConfig.check): what it does not run, one line each -------------
def trainer_routes(flag: str) -> str:
    # Its routing is dropless and follows the router (trainer.moe): a plan priced with token drop or
    # forced-even routing is another run's.
    return (
        f"the exatrain trainer routes MoE tokens dropless, as its router says; plan {flag} for Megatron-Core "
        "(--runtime megatron-core) or train a plan made without it"
    )


def trainer_layers(flag: str, n: int) -> str:
    # Its full recomputation wraps every block (parallel/activation.py).
    return (
        f"the exatrain trainer's full recomputation reruns every layer; plan {flag} {n} for the runtime that "
        "picks layers (Megatron-Core, torchtitan), or train a plan made without it"
    )


def trainer_elementwise(v, compile: bool) -> str | None:
    # The plan was priced with its element-wise ops as it names them: fused ones are what --compile runs;
    # eager ones what the trainer runs without it.
    if v == "fused" and not compile:
        return (
            "this plan was priced with fused element-wise ops (--elementwise fused): train it with --compile, "
            "or plan it with --elementwise eager"
        )
    if v in ("eager", "eager-composite") and compile:
        return (
            f"this plan was priced with eager element-wise ops (--elementwise {v}): train it without "
            "--compile, or plan it with --elementwise fused"
        )
    return None


# ---- labels (Plan.settings_label) ----------------------------------------------------------------------
def label(text: str) -> Callable[[Any, Any], str]:
    """A label that is ``text`` formatted with the value (``{v}``) where the value is not the default."""
    return lambda v, s: text.format(v=v)


def kernel_note(engine: str, switches: tuple[str, ...], runs: str) -> Callable[[Any], str]:
    """A note for a flash-attention plan priced with an --attention-kernel that ``engine`` has no switch for
    (``switches``: those it has), saying what the config ``runs`` instead. A note, not a refusal: the estimate is
    the what-if the user asked for, and the config says what it runs."""

    def note(plan) -> str:
        if not plan.flash_attention or not plan.attention_kernel or plan.attention_kernel in switches:
            return ""
        return (
            f"the plan was priced with the {plan.attention_kernel} attention kernel; {engine} has no switch "
            f"for it: {runs}"
        )

    return note


def titan03_cp_note(plan) -> str:
    """torchtitan 0.3 all-gathers K and V (context_parallel/api.py: flex_cp_allgather, or SDPA's dispatcher)."""
    comm = cp_comm_for("torchtitan", plan.cp_comm, plan.model) if plan.cp > 1 else "all_gather"
    return (
        ""
        if comm == "all_gather"
        else (
            f"the plan was priced with the {comm} K,V exchange; torchtitan 0.3 has no "
            "switch for it and all-gathers K and V"
        )
    )


def elementwise_note(engine: str) -> Callable[[Any], str]:
    """Megatron fuses the element-wise ops (its bias-activation, RoPE and norm kernels): a plan priced eager
    gets a note."""

    def note(plan) -> str:
        if plan.elementwise not in ("eager", "eager-composite"):
            return ""
        return (
            f"the plan was priced with {plan.elementwise} element-wise ops; {engine} runs its fused kernels "
            "(plan it without --elementwise, or with fused, to price them)"
        )

    return note


def fusion_note(target: str) -> Callable[[Any], str]:
    def note(plan) -> str:
        if not plan.grad_accum_fusion:
            return ""
        where = (
            "inside the weight-gradient GEMMs" if plan.grad_accum_fusion == "on" else "by a pass after each backward"
        )
        return (
            f"the plan was priced with Megatron-Core's gradients accumulated {where} (--grad-accum-fusion "
            f"{plan.grad_accum_fusion}); {target} accumulates them its own way, which this config does not set"
        )

    return note


def adam_note(target: str) -> Callable[[Any], str]:
    def note(plan) -> str:
        if not plan.adam_kernel:
            return ""
        return (
            f"the plan was priced with {plan.adam_kernel} Adam (--adam-kernel, torchtitan's switch); {target} "
            "runs its FusedAdam, which this config does not change"
        )

    return note


def blocking_note(plan) -> str:
    """An engine config cannot set the environment: a plan priced with synchronous launches says so."""
    return (
        ""
        if not plan.launch_blocking
        else "the plan was priced with synchronous kernel launches: set "
        "CUDA_LAUNCH_BLOCKING=1 in the job's environment (this config cannot)"
    )
