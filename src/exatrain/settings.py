"""The vocabularies of a plan and the one registry of its run settings, in one namespace.

A run setting is an engine option a plan carries beside its layout (``Plan.settings``, a ``RunSettings``): the
engine that runs it (``runtime``), FP8 GEMMs, how MoE tokens travel, which attention kernel, how the element-wise
ops and the loss run, how gradients accumulate, which Adam kernel, how context parallelism exchanges attention's
operands, what recomputation reruns and whether kernel launches wait for their kernels. Most have an empty value
that means "the runtime's own" (``accounting.engines.resolve`` turns a plan's settings into what its
runtime runs).

Each setting is one ``Setting`` record in ``SETTINGS`` (the ``registry`` package: its vocabularies, rules, notes
and records, split by job); ``run_settings.RunSettings`` writes a field out for each. From the records come the CLI's flags, the scalar rules
(``rules.extension_problem``), ``check_settings`` (once before a search), ``TrainConfig``'s refusals,
``Plan.settings_label``, an estimate's notes, each engine's own value and the export notes come from the same
records. Torch-free; it imports no other layer of exatrain but the catalog's types.
"""

from __future__ import annotations


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
    "listed",
    "offload_problem",
    "recompute_layers_problem",
    "recompute_modules_of",
    "recompute_modules_problem",
    "setting_notes",
    "trainer_cannot_build",
]
