"""A plan's layout for other engines: Megatron-LM, Megatron-DeepSpeed (+ DeepSpeed JSON), torchtitan v0.2.2 (a TOML
job file) and torchtitan 0.3 (its command line).

Teams already on one of those engines can search with exatrain's planner and run with their own.
Every exporter maps the same fields — tp, pp, virtual stages, dp, micro/global batch, ZeRO stage,
recompute, sequence parallel, precision, model shape — onto the option names of a pinned upstream
version (cited next to each flag group). Where an engine cannot express part of a plan exactly, the
export still renders and says so in a note (a comment in the text, and ``Export.notes``); where the
engine cannot run the layout at all, it raises UserError. The notes for run settings an engine cannot write
are the registry's (``settings.Setting.notes``, ``settings.setting_notes``).
"""

from __future__ import annotations

from dataclasses import dataclass

from exatrain.plan import Plan

TARGETS = ("megatron", "deepspeed", "torchtitan", "torchtitan-0.3")


@dataclass(frozen=True)
class Flag:
    """One command-line option; ``value`` None for a switch (store_true); ``more``: further values of an
    option that takes several (argparse nargs='*'), each its own word."""

    name: str
    value: str | None = None
    more: tuple[str, ...] = ()

    def words(self) -> list[str]:
        return [self.name] if self.value is None else [self.name, self.value, *self.more]


@dataclass(frozen=True)
class FlagGroup:
    """Options of one concern, with the upstream file that defines them."""

    name: str  # a shell identifier: the bash array holding the group
    title: str
    source: str
    flags: tuple[Flag, ...]


@dataclass(frozen=True)
class Export:
    target: str
    text: str
    notes: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()  # (file name, content) the text refers to, e.g. ds_config.json


def summary(plan: Plan) -> str:
    virt = f" (x{plan.interleave} virtual stages per rank)" if plan.interleave > 1 else ""
    extra = "".join(f", {k} {n}" for k, n in (("cp", plan.cp), ("ep", plan.ep)) if n != 1)
    return (
        f"{plan.model.name}, tp {plan.tp}, pp {plan.pp}{virt}, dp {plan.dp}{extra} = {plan.gpus} ranks, "
        f"micro-batch {plan.micro_batch}, global batch {plan.global_batch}, ZeRO-{plan.zero_stage}, "
        f"recompute {plan.recompute}, sequence parallel {'on' if plan.sequence_parallel else 'off'}, "
        f"{plan.dtype}" + (f" with FP8 GEMMs ({plan.fp8} scaling)" if plan.fp8 else "") + plan.settings_label
    )


def even_split(plan: Plan) -> bool:
    """True when every virtual stage holds the same number of layers."""
    return len(set(plan.layers_per_stage())) == 1


__all__ = ["Export", "Flag", "FlagGroup", "TARGETS", "even_split", "summary"]
