"""The vocabularies of a plan and the one registry of its run settings, in one namespace.

A run setting is an engine option a plan carries beside its layout (``Plan.settings``, a ``RunSettings``): the
engine that runs it (``runtime``), FP8 GEMMs, how MoE tokens travel, which attention kernel, how the element-wise
ops and the loss run, how gradients accumulate, which Adam kernel, how context parallelism exchanges attention's
operands, what recomputation reruns and whether kernel launches wait for their kernels. Most have an empty value
that means "the runtime's own" (``accounting.engines.accounting.engines.resolve`` turns a plan's settings into what its
runtime runs).

Each setting is one ``Setting`` record in ``SETTINGS`` (the ``registry`` package: its vocabularies, rules, notes
and records, split by job). From the records this module makes ``RunSettings``, the API's keyword arguments
(``takes_settings``) and ``SpaceOptions``'s settings (``holds_settings``); the CLI's flags, the scalar rules
(``rules.extension_problem``), ``check_settings`` (once before a search), ``TrainConfig``'s refusals,
``Plan.settings_label``, an estimate's notes, each engine's own value and the export notes come from the same
records. Torch-free; it imports no other layer of exatrain but the catalog's types.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import field
from typing import Any, Mapping

from exatrain.registry import (
    BY_NAME,
    FLAG_SETTINGS,
    NAMES,
    NOTES_ALSO,
    SETTINGS,
    Own,
    Setting,
    check_settings,
    setting_notes,
)
from exatrain.registry.problems import (
    adam_kernel_problem,
    cp_comm_for,
    cp_comm_problem,
    cp_comms_unable,
    dtype_problem,
    grad_accum_fusion_problem,
    grad_accum_problem,
    heads_not_split,
    offload_problem,
    recompute_layers_problem,
    recompute_modules_problem,
)
from exatrain.registry.runtime import default_runtime, default_runtime_note, trainer_cannot_build
from exatrain.registry.vocab import (
    ADAM_BYTES,
    ADAM_KERNEL_RUNTIMES,
    ADAM_KERNELS,
    ATTENTION_KERNELS,
    CP_COMM_RUNTIMES,
    CP_COMMS,
    CP_COMMS_WITHOUT_SINKS,
    CP_COMMS_WITHOUT_WINDOWS,
    CROSS_ENTROPY,
    CROSS_ENTROPY_RUNTIMES,
    DTYPES,
    ELEMENTWISE,
    FLOAT16_RUNTIMES,
    FLOAT16_WHY_NOT,
    FP8_PARAM_GATHER_RUNTIMES,
    FP8_RECIPES,
    GRAD_ACCUM,
    GRAD_ACCUM_FUSION,
    GRAD_ACCUM_FUSION_RUNTIMES,
    GRAD_ACCUM_RUNTIMES,
    HALF_DTYPES,
    MOE_DISPATCHERS,
    OFFLOAD_RUNTIMES,
    OFFLOADS,
    RECOMPUTE,
    RECOMPUTE_EVERY_RUNTIMES,
    RECOMPUTE_LAYERS_RUNTIMES,
    RECOMPUTE_MODULES,
    RECOMPUTE_MODULES_RUNTIMES,
    RUNTIMES,
    SCHEDULE_RUNTIMES,
    SCHEDULES,
    SPLIT_BACKWARD,
    V_SCHEDULES,
    full_rerun_layers,
    listed,
    recompute_modules_of,
)


def _settings_methods() -> dict[str, Any]:
    def replace(self, **changes: Any):
        """The same settings with ``changes`` (setting names)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The settings that are not their defaults, as plan JSON writes them (its flat keys, SETTINGS order)."""
        return {s.name: s.dump(getattr(self, s.name)) for s in SETTINGS if getattr(self, s.name) != s.default}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]):
        """The settings among plan-JSON keys ``d`` (a key not there: the default)."""
        return cls(**{s.name: s.load(d[s.name]) for s in SETTINGS if s.name in d})

    @classmethod
    def of(cls, values: Mapping[str, Any], base=None):
        """Settings from keyword values (the API's and the CLI's): a value given (not None) wins, then
        ``base``'s (a plan's settings), then the default. recompute_modules may be "a,b" or a list."""
        out = base if base is not None else cls()
        given = {k: v for k, v in values.items() if k in BY_NAME and v is not None}
        if "recompute_modules" in given:
            given["recompute_modules"] = recompute_modules_of(given["recompute_modules"])
        return dataclasses.replace(out, **given)

    @property
    def label(self) -> str:
        """The settings that are not the defaults, as the one-line descriptions append them
        (", deepep dispatcher, force-balanced routing, attention fa2"); "" when all are defaults."""
        parts = (s.label(getattr(self, s.name), self) for s in SETTINGS if getattr(self, s.name) != s.default)
        return "".join(f", {text}" for text in parts if text)

    return {
        "replace": replace,
        "to_dict": to_dict,
        "from_dict": from_dict,
        "of": of,
        "label": label,
        "__doc__": "A plan's run settings (SETTINGS: one field per record, each its default unless set).",
    }


RunSettings = dataclasses.make_dataclass(
    "RunSettings",
    [(s.name, s.type, field(default=s.default)) for s in SETTINGS],
    frozen=True,
    namespace=_settings_methods(),
)
RunSettings.__module__ = __name__


def holds_settings(cls):
    """Decorate a frozen dataclass with a ``settings: RunSettings`` field: each setting reads as an attribute
    (``plan.fp8`` is ``plan.settings.fp8``), and the constructor (so ``dataclasses.replace`` too) takes settings
    by name, folded into ``settings`` (``Plan(model=m, runtime="torchtitan")``)."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args: Any, **kw: Any) -> None:
        named = {k: kw.pop(k) for k in NAMES if k in kw}
        if named:
            kw["settings"] = kw.get("settings", RunSettings()).replace(**named)
        init(self, *args, **kw)

    cls.__init__ = __init__
    for s in SETTINGS:
        setattr(cls, s.name, property(lambda self, n=s.name: getattr(self.settings, n), doc=s.help))
    return cls


def takes_settings(fn):
    """Give ``fn`` (which ends in ``**settings``) one keyword argument per run setting it does not name itself,
    default None (not given): its signature (``inspect.signature``, which the CLI reads to pass its flags) lists
    them, and a keyword that is neither its own nor a setting is a TypeError, as for any function."""
    sig = inspect.signature(fn)
    own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    names = {p.name for p in own}
    extra = [
        inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY, default=None) for s in SETTINGS if s.name not in names
    ]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kw: Any) -> Any:
        for k in kw:
            if k not in names and k not in BY_NAME:
                raise TypeError(f"{fn.__name__}() got an unexpected keyword argument {k!r}")
        return fn(*args, **kw)

    wrapper.__signature__ = sig.replace(parameters=own + extra)  # type: ignore[attr-defined]
    return wrapper


__all__ = [
    "ADAM_BYTES",
    "ADAM_KERNELS",
    "ADAM_KERNEL_RUNTIMES",
    "ATTENTION_KERNELS",
    "BY_NAME",
    "CP_COMMS",
    "CP_COMMS_WITHOUT_SINKS",
    "CP_COMMS_WITHOUT_WINDOWS",
    "CP_COMM_RUNTIMES",
    "CROSS_ENTROPY",
    "CROSS_ENTROPY_RUNTIMES",
    "DTYPES",
    "ELEMENTWISE",
    "FLAG_SETTINGS",
    "FLOAT16_RUNTIMES",
    "FLOAT16_WHY_NOT",
    "FP8_PARAM_GATHER_RUNTIMES",
    "FP8_RECIPES",
    "GRAD_ACCUM",
    "GRAD_ACCUM_FUSION",
    "GRAD_ACCUM_FUSION_RUNTIMES",
    "GRAD_ACCUM_RUNTIMES",
    "HALF_DTYPES",
    "MOE_DISPATCHERS",
    "NAMES",
    "NOTES_ALSO",
    "OFFLOADS",
    "OFFLOAD_RUNTIMES",
    "Own",
    "RECOMPUTE",
    "RECOMPUTE_EVERY_RUNTIMES",
    "RECOMPUTE_LAYERS_RUNTIMES",
    "RECOMPUTE_MODULES",
    "RECOMPUTE_MODULES_RUNTIMES",
    "RUNTIMES",
    "RunSettings",
    "SCHEDULES",
    "SCHEDULE_RUNTIMES",
    "SETTINGS",
    "SPLIT_BACKWARD",
    "Setting",
    "V_SCHEDULES",
    "adam_kernel_problem",
    "check_settings",
    "cp_comm_for",
    "cp_comm_problem",
    "cp_comms_unable",
    "default_runtime",
    "default_runtime_note",
    "dtype_problem",
    "full_rerun_layers",
    "grad_accum_fusion_problem",
    "grad_accum_problem",
    "heads_not_split",
    "holds_settings",
    "listed",
    "offload_problem",
    "recompute_layers_problem",
    "recompute_modules_of",
    "recompute_modules_problem",
    "setting_notes",
    "takes_settings",
    "trainer_cannot_build",
]
