"""The engines a plan runs on, and a plan's settings as its engine runs them (``Resolved``).

Each engine's profile is one data module under ``accounting/engine_data/`` (its memory rules, overlaps and sources,
``accounting.engine_profile.EngineProfile``); its own value of each run setting is the setting's record's
(``settings.Setting.engines``). ``resolve`` turns a plan's run settings into what the engine runs: the profile as
the settings vary it, each "the runtime's own" made concrete, and what follows from them (``Resolved``), which
``accounting.memory.rank_memory`` turns into bytes per rank and the planner's cost model into seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from exatrain.accounting.context import CpExchange
from exatrain.accounting.engine_data.exatrain import EXATRAIN
from exatrain.accounting.engine_data.llm_foundry import LLM_FOUNDRY
from exatrain.accounting.engine_data.megatron_core import MEGATRON_CORE
from exatrain.accounting.engine_data.megatron_deepspeed import MEGATRON_DEEPSPEED
from exatrain.accounting.engine_data.torchtitan import TORCHTITAN
from exatrain.accounting.engine_profile import COMMS, ActivationRules, EngineProfile, Overlap, StateRule
from exatrain.accounting.fp8 import Fp8Recipe
from exatrain.accounting.moe import moe_load
from exatrain.errors import UserError
from exatrain.run_settings import RunSettings
from exatrain.settings import ADAM_BYTES, NAMES, RUNTIMES, SETTINGS

ENGINES = {p.name: p for p in (MEGATRON_CORE, MEGATRON_DEEPSPEED, TORCHTITAN, EXATRAIN, LLM_FOUNDRY)}
# The run a hand-built Resolved stands for (tests, ``accounting.memory.stage_memory``): ``accounting.memory``'s own
# convention, fused element-wise ops, the upcast loss and Transformer Engine's p2p ring
CONVENTION = RunSettings(elementwise="fused", cross_entropy="upcast", cp_comm="p2p")


@dataclass(frozen=True, init=False)
class Resolved:
    """What a runtime runs for a plan's settings, resolved once (``resolve``): its ``settings`` with every choice
    whose empty value meant "the runtime's own" made (each reads as an attribute too: ``run.fp8`` is
    ``run.settings.fp8``), and what follows from them and the engine: the profile as the settings vary it, the cp
    exchange, the MoE load, the FP8 recipe and its TP gathers, what selective recomputation keeps and how the
    experts' GEMMs run. ``evaluate``, ``step_times``, ``stage_times``, ``rank_memory`` and the trainer-memory model
    take it. Built by hand, it takes settings by name (folded into ``settings``, from ``CONVENTION``), and no
    engine profile (``engine`` None)."""

    dtype: str = "bfloat16"
    flash: bool = True  # flash attention (Plan.flash_attention)
    # the runtime's profile with the plan's gradient accumulation and Adam kernel
    engine: EngineProfile | None = field(default=None, repr=False)
    cp_exchange: CpExchange | None = None  # how the engine runs cp (None: Transformer Engine's p2p ring)
    moe_load: float = 1.25  # the busiest expert rank's routed copies over the mean (accounting.moe.moe_load)
    fp8_recipe: Fp8Recipe | None = None  # the accounting's FP8 configuration (with fp8_param_gather's FP8 weights)
    fp8_tp_gather: bool = False  # its sequence-parallel all-gathers carry FP8 (EngineProfile.gathers_tp_in_fp8)
    selective: str = "core_attention"  # what its selective recomputation keeps (ActivationRules.selective)
    expert_gemms: str = "grouped"  # EngineProfile.expert_gemms
    settings: RunSettings = CONVENTION  # as the plan gave them, each that named nothing made the runtime's own

    def __init__(self, settings: RunSettings | None = None, **kw: Any) -> None:
        named = {k: kw.pop(k) for k in NAMES if k in kw}
        if "recompute_modules" in named:
            named["recompute_modules"] = tuple(named["recompute_modules"])
        values = {f: getattr(type(self), f) for f in _FIELDS if f != "settings"}
        unknown = set(kw) - set(values)
        if unknown:
            raise TypeError(f"Resolved() got unexpected keyword arguments {sorted(unknown)}")
        values.update(kw, settings=(settings or CONVENTION).replace(**named))
        for k, v in values.items():
            object.__setattr__(self, k, v)

    def __getattr__(self, name: str) -> Any:
        if name in NAMES:  # a setting reads as an attribute (only called where no field or property has the name)
            return getattr(self.settings, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def other(self, runtime: str, model=None) -> "Resolved":
        """Another runtime's own run of the same model, dtype, FP8 GEMMs and MoE routing (its memory beside the
        plan's runtime's: ``planner.evaluate``'s other memory models), every other setting its own."""
        s = self.settings
        keep = RunSettings(
            runtime=runtime,
            fp8=s.fp8,
            fp8_param_gather=s.fp8_param_gather,
            moe_capacity_factor=s.moe_capacity_factor,
            moe_force_balance=s.moe_force_balance,
        )
        return resolve(get_engine(runtime), keep, model, dtype=self.dtype, flash=self.flash)


_FIELDS = tuple(f for f in Resolved.__dataclass_fields__)


def resolve(
    engine: EngineProfile, settings: RunSettings, model=None, *, dtype: str = "bfloat16", flash: bool = True
) -> Resolved:
    """What ``engine`` runs for ``settings`` (its runtime's) on ``model``: itself with their gradient accumulation,
    its fusion and Adam kernel (``with_grad_accum``, ``with_grad_accum_fusion``, ``with_adam``), each setting that
    names nothing made its own (``settings.Setting.own_value``: element-wise ops, loss, attention kernel, cp
    exchange, and any setting whose record states each engine's value), and what follows from them."""
    given = settings
    own = {x.name: x.own_value(engine, given, model) for x in SETTINGS if getattr(given, x.name) == x.default}
    s = given.replace(**{k: v for k, v in own.items() if v is not None})
    return Resolved(
        dtype=dtype,
        flash=flash,
        engine=engine.with_grad_accum(s.grad_accum)
        .with_grad_accum_fusion(s.grad_accum_fusion)
        .with_adam(s.adam_kernel),
        cp_exchange=engine.cp_exchange(given.cp_comm, model),
        moe_load=moe_load(s.moe_capacity_factor, s.moe_force_balance),
        fp8_recipe=Fp8Recipe(scaling=s.fp8, fp8_params=s.fp8_param_gather) if s.fp8 else None,
        fp8_tp_gather=engine.gathers_tp_in_fp8(s.fp8),
        selective=engine.activations.selective,
        expert_gemms=engine.expert_gemms,
        settings=s.replace(recompute_modules=tuple(s.recompute_modules)),
    )


def resolve_settings(settings: RunSettings, model=None, *, dtype: str = "bfloat16", flash: bool = True) -> Resolved:
    """``settings`` as their runtime runs them for ``model`` (``resolve``)."""
    return resolve(get_engine(settings.runtime), settings, model, dtype=dtype, flash=flash)


def plan_run(plan) -> Resolved:
    """A plan's settings as its runtime runs them: the one place a Plan's settings are spread."""
    return resolve_settings(plan.settings, plan.model, dtype=plan.dtype, flash=plan.flash_attention)


def get_engine(name: str) -> EngineProfile:
    """The profile called ``name``; an unknown name is a UserError listing the valid ones."""
    try:
        return ENGINES[name]
    except (KeyError, TypeError):
        raise UserError(f"unknown engine {name!r}; use one of {', '.join(RUNTIMES)}") from None


__all__ = [
    "ADAM_BYTES",
    "COMMS",
    "CONVENTION",
    "ENGINES",
    "ActivationRules",
    "EngineProfile",
    "Overlap",
    "Resolved",
    "StateRule",
    "get_engine",
    "plan_run",
    "resolve",
    "resolve_settings",
]
