"""Candidate layouts as numpy arrays, the form in which the rules of exatrain.rules check them: ``rule_inputs``
for a batch (the search's grid), ``plan_rule_inputs`` for one plan. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.models import ModelSpec
from exatrain.limits import beyond
from exatrain.run_settings import RunSettings
from exatrain.settings import DTYPES, RECOMPUTE, SCHEDULES

# (flag, Plan attribute) of each degree and batch size that must be a positive integer
POSITIVE_FIELDS = (
    ("tp", "tp"),
    ("pp", "pp"),
    ("dp", "dp"),
    ("micro-batch", "micro_batch"),
    ("global-batch", "global_batch"),
    ("interleave", "interleave"),
    ("ep", "ep"),
    ("cp", "cp"),
)


def among(x, values) -> np.ndarray:
    """``np.isin(x, values)`` for the few codes of a vocabulary (schedules, ZeRO stages): the same booleans without
    its sort, which costs more than the rest of a one-plan evaluation's small arrays."""
    x = np.asarray(x)
    out = np.zeros(x.shape, dtype=bool)
    for v in values:
        out |= x == v
    return out


@dataclass(frozen=True)
class Shared:
    """What a batch of candidate layouts shares: the model, the dtype, a custom layer split, the cluster (its
    node size: tp beyond a node), whether exatrain's trainer is to compile them, and the run settings (their
    runtime decides where ep may reach, ``ep_fits``, and which schedules, ZeRO stages and cp exchanges run)."""

    model: ModelSpec
    dtype: str = "bfloat16"
    stage_layers: tuple = ()
    cluster: ClusterSpec | None = None
    compile: bool = False
    settings: RunSettings = RunSettings()


@dataclass(frozen=True)
class RuleInputs:
    """Candidate layouts of one model as arrays (one entry each), with what the rules derive from them: what the
    rules check (the planner evaluates ``planner.layouts.Layouts``).
    ``recompute`` and ``schedule`` index RECOMPUTE and SCHEDULES (-1: not one of them);
    ``malformed`` marks a degree or batch size that was not an integer at all."""

    model: ModelSpec
    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    micro_batch: np.ndarray
    global_batch: np.ndarray
    zero_stage: np.ndarray
    recompute: np.ndarray
    sequence_parallel: np.ndarray
    schedule: np.ndarray
    interleave: np.ndarray
    dtype_ok: bool
    stage_layers: tuple
    gpus: np.ndarray | None  # requested device count (the search's), or None: tp*pp*dp by construction
    gpus_per_node: int | None  # the cluster's, or None: no cluster given
    malformed: np.ndarray
    compile: bool
    ep: np.ndarray | None = None  # expert-parallel degree (adds no ranks); None: 1 everywhere
    cp: np.ndarray | None = None  # context-parallel degree (adds ranks); None: 1 everywhere
    runtime: str = "exatrain"  # the engine that runs the layouts: where it lets ep reach (ep_ranks)
    cp_comm: str = ""  # how attention's operands travel under cp (Plan.cp_comm; "" = the runtime's own)

    def __post_init__(self) -> None:
        for name in ("ep", "cp"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.ones(self.tp.shape, dtype=np.int64))

    @property
    def num_microbatches(self) -> np.ndarray:
        return self.global_batch // np.maximum(self.micro_batch * self.dp, 1)


def _codes(values, names: tuple[str, ...]) -> np.ndarray:
    a = np.asarray(values)
    if a.dtype.kind in "iu":
        return np.where((a >= 0) & (a < len(names)), a, -1).astype(np.int64)
    return np.array([names.index(v) if v in names else -1 for v in a.reshape(-1).tolist()], dtype=np.int64).reshape(
        a.shape
    )


def rule_inputs(
    shared: Shared,
    *,
    tp,
    pp,
    micro_batch,
    global_batch,
    zero_stage,
    recompute,
    sequence_parallel,
    schedule,
    interleave,
    dp=None,
    gpus=None,
    ep=1,
    cp=1,
) -> RuleInputs:
    """Layouts as arrays, sharing ``shared``. Without ``dp``, dp = gpus // (tp*cp*pp) (1 where that does not
    divide; the gpus rules mark those). ``recompute``/``schedule``: names or indices."""
    tp, pp, mb, gb, zero, v, ep, cp = (
        np.asarray(a, dtype=np.int64) for a in (tp, pp, micro_batch, global_batch, zero_stage, interleave, ep, cp)
    )
    if dp is None:
        ranks = np.maximum(tp * pp * cp, 1)
        dp = np.where(np.asarray(gpus) % ranks == 0, np.asarray(gpus) // ranks, 1)
    arrays = np.broadcast_arrays(
        tp,
        pp,
        np.asarray(dp, dtype=np.int64),
        mb,
        gb,
        zero,
        _codes(recompute, RECOMPUTE),
        np.asarray(sequence_parallel, dtype=bool),
        _codes(schedule, SCHEDULES),
        v,
        ep,
        cp,
    )
    *arrays, ep, cp = arrays
    s = shared.settings
    return RuleInputs(
        shared.model,
        *arrays,
        dtype_ok=shared.dtype in DTYPES,
        stage_layers=tuple(shared.stage_layers),
        gpus=None if gpus is None else np.broadcast_to(np.asarray(gpus, dtype=np.int64), arrays[0].shape),
        gpus_per_node=None if shared.cluster is None else shared.cluster.gpus_per_node,
        malformed=np.zeros(arrays[0].shape, dtype=bool),
        compile=shared.compile,
        ep=ep,
        cp=cp,
        runtime=s.runtime if isinstance(s.runtime, str) else "",
        cp_comm=s.cp_comm if isinstance(s.cp_comm, str) else "",
    )


def plan_rule_inputs(plan, cluster: ClusterSpec | None = None, *, compile: bool = False) -> RuleInputs:
    """One plan as RuleInputs of one (fields that are not positive integers become 1, marked malformed)."""
    ok = {}
    malformed = False
    for _, attr in POSITIVE_FIELDS:
        value = getattr(plan, attr)
        good = not isinstance(value, bool) and isinstance(value, int) and not beyond(value)  # int64-safe
        ok[attr] = [value if good else 1]
        malformed |= not good
    x = rule_inputs(
        Shared(
            plan.model,
            dtype=plan.dtype,
            stage_layers=plan.stage_layers,
            cluster=cluster,
            compile=compile,
            settings=plan.settings,
        ),
        tp=ok["tp"],
        pp=ok["pp"],
        dp=ok["dp"],
        micro_batch=ok["micro_batch"],
        global_batch=ok["global_batch"],
        interleave=ok["interleave"],
        zero_stage=[plan.zero_stage if isinstance(plan.zero_stage, int) else -1],
        recompute=[plan.recompute if isinstance(plan.recompute, str) else ""],
        schedule=[plan.schedule if isinstance(plan.schedule, str) else ""],
        sequence_parallel=[bool(plan.sequence_parallel)],
        ep=ok["ep"],
        cp=ok["cp"],
    )
    return RuleInputs(**{**x.__dict__, "malformed": np.array([malformed])})


__all__ = ["POSITIVE_FIELDS", "RuleInputs", "Shared", "plan_rule_inputs", "rule_inputs"]
