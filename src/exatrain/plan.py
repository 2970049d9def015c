"""The contract between planner, trainer, launchers and reports.

A ``Plan`` is one training layout for one model: the parallel degrees, batch sizes and execution
options. It is the unit of reproducibility: ``exatrain search``/``estimate`` write it as JSON,
``exatrain launch`` renders it, ``exatrain train`` executes it, and every run appends a
``RunRecord`` (the plan, what the cost model predicted, what was measured) that calibration and
tuning read back. JSON keys are exact: loading rejects unknown or missing keys.

This module imports neither torch nor the planner. The plan's vocabularies and run settings are
``exatrain.settings``, its estimate ``exatrain.estimates``; JSON files are read and written by
``exatrain.jsonio``, RunRecord files by ``exatrain.records``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.models import ModelSpec
from exatrain.errors import PlanError, UserError
from exatrain.estimates import MemoryBreakdown, StepEstimate, TimeBreakdown
from exatrain.jsonio import read_json, write_json_atomic
from exatrain.run_settings import RunSettings, SettingsView, holds_settings
from exatrain.settings import NAMES, V_SCHEDULES, full_rerun_layers

PLAN_VERSION = 1
_FILE_KEYS = {"zero": "zero_stage"}  # a flag whose plan-file key is not its name with "_" for "-"


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of parallelism. Rank order is tp fastest, then dp, then pp (Megatron's order),
    so a tp group is ``tp`` consecutive ranks and a dp group strides by ``tp``.

    ``ep`` (expert parallelism) adds no ranks: the routed experts of a MoE layer are split over ep
    ranks, experts/ep whole experts each (expert-tensor-parallel size 1: experts are not split over
    tp), and replicated over the edp = tp*cp*dp/ep expert-data-parallel ranks that hold the same
    ones, which reduce their gradients and shard their states; everything else is replicated or
    sharded over dp (times cp) as in a dense model. Where the ep group lies:

    * ep divides dp (every runtime): ep consecutive dp ranks (dp rank = edp_rank' * ep + ep_rank),
      strided by tp*cp, each of them with its tp*cp ranks; the edp group is those tp*cp ranks of the
      dp/ep dp ranks ep*tp*cp apart. exatrain's trainer builds this mesh (trainer/parallel/mesh.py),
      and the cost model prices every ep | dp layout this way (Megatron-Core with etp 1 would place
      even these groups as below, on ranks no farther apart: the strided span is the wider one).
    * ep wider than dp (runtime megatron-core, ep any divisor of tp*cp*dp; torchtitan when tp*cp
      divides ep): Megatron-Core's "MoE parallel folding" (megatron/core/parallel_state.py
      initialize_model_parallel) lays the expert layers' ranks out as its own etp x ep x edp x pp grid
      of the same world, order tp-cp-ep-dp-pp with etp 1: within a pipeline stage's tp*cp*dp ranks
      (numbered tp fastest, then cp, then dp), rank = edp_rank * ep + ep_rank. The ep group is ep
      consecutive ranks, so it takes in the tp (and cp) ranks; the edp group is the tp*cp*dp/ep ranks
      ep apart. Each tp rank dispatches its own s/tp tokens, so this needs sequence parallelism when
      tp > 1 (as Megatron-LM requires for MoE). exatrain's trainer refuses it (rules, scope "trainer").

    ``cp`` (context parallelism) splits every sequence over ``cp`` ranks and does add ranks: the
    order is tp fastest, then cp, then dp, then pp (Megatron-Core's tp-cp-dp-pp), so a cp group is
    ``cp`` ranks strided by ``tp``. Weights are replicated over cp as over dp, and gradients are
    reduced over dp x cp."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    cp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp


@dataclass(frozen=True)
class TrainShape:
    """Batch sizes in sequences. ``global_batch`` = micro_batch * dp * num_microbatches."""

    micro_batch: int = 1
    global_batch: int = 1


def balanced_split(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per (virtual) stage as even as possible. Leftover layers go to the middle stages
    first, because the first stage also holds the embedding and the last the head and the loss."""
    if stages <= 0 or layers < stages:
        raise PlanError(
            f"cannot split {layers} layers into {stages} pipeline stages: "
            "every stage needs at least one layer; lower pp or interleave"
        )
    base, extra = divmod(layers, stages)
    order = list(range(1, stages - 1)) + [0, stages - 1] if stages > 2 else list(range(stages))
    counts = [base] * stages
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)


@holds_settings
@dataclass(frozen=True)
class Plan(SettingsView):
    """One layout for one model. Construct, then ``validate()``; or ``Plan.load(path)``."""

    model: ModelSpec
    dims: ParallelDims = ParallelDims()
    shape: TrainShape = TrainShape()
    zero_stage: int = 0  # 0 = plain data parallel (DDP), 1 = optimizer states sharded, 2 = + grads, 3 = + weights
    recompute: str = "none"
    sequence_parallel: bool = False
    schedule: str = "1f1b"
    interleave: int = 1  # virtual pipeline stages per rank
    stage_layers: tuple[int, ...] = ()  # layers per virtual stage in model order; () = balanced_split
    dtype: str = "bfloat16"
    flash_attention: bool = True
    cluster: str = ""  # name of the cluster the plan was made for ("" = unspecified)
    # The engine options it runs with (settings.SETTINGS: runtime, fp8, MoE routing, kernels, gradient
    # accumulation, cp exchange, what recomputation reruns); each reads as an attribute (plan.fp8) and is
    # a constructor keyword (Plan(model=m, runtime="torchtitan")): run_settings.SettingsView, holds_settings
    settings: RunSettings = RunSettings()
    estimate: StepEstimate | None = None

    # ---- derived ---------------------------------------------------------------------------
    @property
    def tp(self) -> int:
        return self.dims.tp

    @property
    def pp(self) -> int:
        return self.dims.pp

    @property
    def dp(self) -> int:
        return self.dims.dp

    @property
    def ep(self) -> int:
        return self.dims.ep

    @property
    def cp(self) -> int:
        return self.dims.cp

    @property
    def gpus(self) -> int:
        return self.dims.world_size

    @property
    def micro_batch(self) -> int:
        return self.shape.micro_batch

    @property
    def global_batch(self) -> int:
        return self.shape.global_batch

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per pipeline per step (each dp replica runs this many)."""
        return self.shape.global_batch // (self.shape.micro_batch * self.dims.dp)

    @property
    def virtual_stages(self) -> int:
        return self.dims.pp * self.interleave

    @property
    def tokens_per_step(self) -> int:
        return self.shape.global_batch * self.model.seq_len

    @property
    def label(self) -> str:
        """The layout as every table, picture and log spells it: "tp4·pp16·dp2" ("·cp2", "·ep8"
        follow when those are used)."""
        extra = "".join(f"·{name}{n}" for name, n in (("cp", self.cp), ("ep", self.ep)) if n != 1)
        return f"tp{self.tp}·pp{self.pp}·dp{self.dp}{extra}"

    @property
    def schedule_label(self) -> str:
        """The pipeline schedule as it is spelled everywhere: "1f1b", "interleaved×2"; a single
        stage runs no schedule: "no pipeline"."""
        if self.pp == 1:
            return "no pipeline"
        return self.schedule + (f"×{self.interleave}" if self.interleave > 1 else "")

    @property
    def recompute_label(self) -> str:
        """The recomputation as a table spells it: "none", "selective", "full", or for a full one that covers
        some layers "full 3/stage" (the first 3 of each stage) or "full 1/2" (one layer in 2)."""
        if self.recompute == "full" and self.recompute_layers:
            return f"full {self.recompute_layers}/stage"
        if self.recompute == "full" and self.recompute_every:
            return f"full 1/{self.recompute_every}"
        return self.recompute

    @property
    def settings_label(self) -> str:
        """The run settings a plan was priced with that are not the defaults, as the one-line
        descriptions append them (", deepep dispatcher, force-balanced routing, attention fa2"); ""
        when all are defaults."""
        return self.settings.label

    def recomputed_layers_of_rank(self, pp_rank: int) -> int:
        """Layers of pipeline rank ``pp_rank`` that recomputation reruns whole: under full recomputation all of them,
        or those ``recompute_layers`` / ``recompute_every`` pick (``full_rerun_layers``); else none."""
        if self.recompute != "full":
            return 0
        rerun = full_rerun_layers(self.layers_per_stage(), self.pp, self.recompute_layers, self.recompute_every)
        return int(sum(rerun[v] for v in self.stages_of_rank(pp_rank)))

    def layers_per_stage(self) -> tuple[int, ...]:
        """Layers of each virtual stage, in model order (length pp * interleave)."""
        return self.stage_layers or balanced_split(self.model.layers, self.virtual_stages)

    def stages_of_rank(self, pp_rank: int) -> tuple[int, ...]:
        """Virtual stages held by pipeline rank ``pp_rank``: looped placement, stage k on rank k % pp
        (the placement of interleaved 1F1B and interleaved zero bubble), or for the V schedules (zbv,
        dualpipev) stages r and 2 pp - 1 - r, so rank 0 holds the first and the last."""
        if self.v_shape:
            return (pp_rank, self.virtual_stages - 1 - pp_rank)
        return tuple(range(pp_rank, self.virtual_stages, self.dims.pp))

    @property
    def v_shape(self) -> bool:
        """Whether the plan places its stages in a V (zbv, dualpipev over pp > 1): ``stages_of_rank``."""
        return self.schedule in V_SCHEDULES and self.dims.pp > 1 and self.interleave == 2

    def rank_of_stage(self, stage: int) -> int:
        """The pipeline rank that holds virtual stage ``stage`` (``stages_of_rank``'s inverse)."""
        return next(r for r in range(self.dims.pp) if stage in self.stages_of_rank(r))

    def with_estimate(self, estimate: StepEstimate | None) -> "Plan":
        return dataclasses.replace(self, estimate=estimate)

    def replace(self, **changes: Any) -> "Plan":
        return dataclasses.replace(self, **changes)

    # ---- validation --------------------------------------------------------------------------
    def validate(self, cluster: ClusterSpec | None = None) -> "Plan":
        """Raise PlanError (``rules.RuleError``) naming the first rule the plan breaks and its fix
        (``exatrain.rules``, the one list the search and the trainer use too); return self when the
        plan can run."""
        from exatrain import rules

        rules.check(self, cluster)
        return self

    # ---- JSON --------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": PLAN_VERSION,
            "model": self.model.to_dict(),
            "cluster": self.cluster,
            "gpus": self.gpus,
            "tp": self.dims.tp,
            "pp": self.dims.pp,
            "dp": self.dims.dp,
            **({"ep": self.dims.ep} if self.dims.ep != 1 else {}),
            **({"cp": self.dims.cp} if self.dims.cp != 1 else {}),
            "micro_batch": self.shape.micro_batch,
            "global_batch": self.shape.global_batch,
            "num_microbatches": self.num_microbatches,
            "zero_stage": self.zero_stage,
            "recompute": self.recompute,
            "sequence_parallel": self.sequence_parallel,
            "schedule": self.schedule,
            "interleave": self.interleave,
            "stage_layers": list(self.layers_per_stage()),
            "dtype": self.dtype,
            "flash_attention": self.flash_attention,
            **self.settings.to_dict(),
            "estimate": None if self.estimate is None else self.estimate.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "plan") -> "Plan":
        if not isinstance(d, Mapping):
            raise UserError(f"{source}: a plan must be a JSON object")
        if "plan" in d and isinstance(d["plan"], Mapping) and "model" not in d:
            d = d["plan"]  # accept `estimate --json` / `search --json` entries, whose plan is nested
        _check_keys(d, source)
        if not isinstance(d["model"], Mapping):
            raise UserError(f"{source}: `model` must be an object of model fields")
        try:
            plan = cls(
                model=ModelSpec.from_dict(d["model"], source=f"{source}: model"),
                dims=ParallelDims(tp=d["tp"], pp=d["pp"], dp=d["dp"], ep=d.get("ep", 1), cp=d.get("cp", 1)),
                shape=TrainShape(micro_batch=d["micro_batch"], global_batch=d["global_batch"]),
                zero_stage=d["zero_stage"],
                recompute=d["recompute"],
                sequence_parallel=bool(d["sequence_parallel"]),
                schedule=d["schedule"],
                interleave=d["interleave"],
                stage_layers=tuple(d.get("stage_layers") or ()),
                dtype=d.get("dtype", "bfloat16"),
                flash_attention=bool(d.get("flash_attention", True)),
                cluster=str(d.get("cluster") or ""),
                settings=RunSettings.from_dict(d),
                estimate=None if d.get("estimate") is None else StepEstimate.from_dict(d["estimate"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{source}: malformed plan ({type(exc).__name__}: {exc})") from None
        try:
            plan.validate()
        except PlanError as exc:  # the rules name flags; a file's reader looks for its keys
            exc.args = (
                f"{source}: "
                + re.sub(r"--([a-z][a-z0-9-]*)", lambda m: _FILE_KEYS.get(m[1], m[1].replace("-", "_")), str(exc)),
            )
            raise
        if plan.stage_layers and plan.stage_layers == balanced_split(plan.model.layers, plan.virtual_stages):
            plan = plan.replace(stage_layers=())  # the default split is stored as "balanced"
        _check_derived(plan, d, source)
        return plan

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def save(self, path: str | Path) -> None:
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        return cls.from_dict(read_json(path), source=str(path))


_REQUIRED = (
    "model",
    "tp",
    "pp",
    "dp",
    "micro_batch",
    "global_batch",
    "zero_stage",
    "recompute",
    "sequence_parallel",
    "schedule",
    "interleave",
)
_OPTIONAL = (
    "version",
    "cluster",
    "gpus",
    "num_microbatches",
    "stage_layers",
    "dtype",
    "flash_attention",
    "estimate",
    "ep",
    "cp",
    *NAMES,
)


def _check_keys(d: Mapping[str, Any], source: str) -> None:
    """A one-line UserError for a plan object with a key missing, a key it cannot have, or no or another
    version."""
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        raise UserError(f"{source}: missing plan key(s) {', '.join(missing)}")
    unknown = sorted(set(d) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise UserError(f"{source}: unknown plan key(s) {', '.join(unknown)}")
    if "version" not in d:
        raise UserError(
            f"{source}: no plan version (a plan written by `exatrain estimate/search --out` has "
            f'"version": {PLAN_VERSION})'
        )
    if d.get("version") != PLAN_VERSION:
        raise UserError(f"{source}: plan version {d.get('version')!r} is not {PLAN_VERSION}")


def _check_derived(plan: Plan, d: Mapping[str, Any], source: str) -> None:
    """A one-line UserError where a plan object's derived counts (gpus, num_microbatches) disagree with its
    layout."""
    if "gpus" in d and d["gpus"] != plan.gpus:
        raise UserError(f"{source}: gpus {d['gpus']} != tp*cp*pp*dp = {plan.gpus}")
    if "num_microbatches" in d and d["num_microbatches"] != plan.num_microbatches:
        raise UserError(
            f"{source}: num_microbatches {d['num_microbatches']} != "
            f"global_batch/(micro_batch*dp) = {plan.num_microbatches}"
        )


@dataclass(frozen=True)
class Measured:
    """What a run measured. Times are medians over the steps after warm-up."""

    steps: int
    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float | None = None
    mfu: float | None = None
    peak_memory_bytes: float | None = None  # max over ranks
    peak_memory_by_stage: tuple[float, ...] = ()  # max over the ranks of each pipeline stage
    first_loss: float | None = None
    last_loss: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["peak_memory_by_stage"] = list(self.peak_memory_by_stage)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Measured":
        known = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["peak_memory_by_stage"] = tuple(kw.get("peak_memory_by_stage") or ())
        for k, v in kw.items():  # numbers only (a bool is not one): a TypeError names the field
            values = v if k == "peak_memory_by_stage" else (v,)
            if any(x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))) for x in values):
                raise TypeError(f"measured {k} must be a number, got {v!r}")
        return cls(**kw)


@dataclass(frozen=True)
class RunRecord:
    """One training run: the plan, the prediction made for it, and what was measured.
    Appended as one JSON line to a runs file; read back by calibrate, validate and tune."""

    plan: Plan
    measured: Measured | None
    status: str = "ok"  # ok | failed | oom | timeout | interrupted (stopped by a signal: trainer/health.py)
    device: str = ""  # e.g. "cpu", "NVIDIA H200"
    env: Mapping[str, Any] = field(default_factory=dict)  # torch version, host, backend, date ...
    error: str = ""
    # A failed run: the rank that failed (or hung) first, and where. Keys: rank, tp, pp, dp, step (the step
    # it was running, 1-based), phase, kind (error | signal | hung | interrupted | ...), cause, exit_code, log;
    # a hang adds not_arrived (ranks) and ranks (each rank's last step and phase). None for a run that ended.
    failure: Mapping[str, Any] | None = None
    # Per-rank step times over the straggler windows (trainer/health.py): steps measured, then per rank (in
    # rank order) the mean compute_s and wait_s per step, and the stragglers named. None before one window.
    rank_times: Mapping[str, Any] | None = None

    @property
    def predicted(self) -> StepEstimate | None:
        return self.plan.estimate

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "run_record",
            "plan": self.plan.to_dict(),
            "predicted": None if self.predicted is None else self.predicted.to_dict(),
            "measured": None if self.measured is None else self.measured.to_dict(),
            "status": self.status,
            "device": self.device,
            "env": dict(self.env),
            "error": self.error,
            "failure": None if self.failure is None else dict(self.failure),
            "rank_times": None if self.rank_times is None else dict(self.rank_times),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "run record") -> "RunRecord":
        try:
            plan_d = dict(d["plan"])
            if d.get("predicted") is not None:
                plan_d["estimate"] = d["predicted"]
            return cls(
                plan=Plan.from_dict(plan_d, source=source),
                measured=None if d.get("measured") is None else Measured.from_dict(d["measured"]),
                status=str(d.get("status", "ok")),
                device=str(d.get("device", "")),
                env=dict(d.get("env") or {}),
                error=str(d.get("error", "")),
                failure=_optional_mapping(d.get("failure"), "failure"),
                rank_times=_optional_mapping(d.get("rank_times"), "rank_times"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{source}: malformed run record ({type(exc).__name__}: {exc})") from None


def _optional_mapping(value: Any, key: str) -> dict[str, Any] | None:
    """An optional object field of a record (absent in records written before it existed)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"{key} must be an object or null, got {type(value).__name__}")
    return dict(value)


__all__ = [
    "Measured",
    "MemoryBreakdown",
    "ParallelDims",
    "Plan",
    "RunRecord",
    "StepEstimate",
    "TimeBreakdown",
    "TrainShape",
    "balanced_split",
]
