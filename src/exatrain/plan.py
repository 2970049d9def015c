"""The contract between planner, trainer, launchers and reports.

A ``Plan`` is one training layout for one model: the parallel degrees, batch sizes and execution
options. It is the unit of reproducibility: ``exatrain search``/``estimate`` write it as JSON,
``exatrain launch`` renders it, ``exatrain train`` executes it, and every run appends a
``RunRecord`` (the plan, what the cost model predicted, what was measured) that calibration and
tuning read back. JSON keys are exact: loading rejects unknown or missing keys.

This module imports neither torch nor the planner. The plan's vocabularies and run settings are
``exatrain.settings``; JSON files are read and written by ``exatrain.jsonio``, RunRecord files by
``exatrain.records``.
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
from exatrain.jsonio import read_json, write_json_atomic
from exatrain.settings import NAMES, V_SCHEDULES, RunSettings, full_rerun_layers, holds_settings

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


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes held by one rank at its peak, by kind (see the accounting for the conventions)."""

    weights: float = 0.0
    gradients: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0
    other: float = 0.0

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.other

    def to_dict(self) -> dict[str, float]:
        d = dataclasses.asdict(self)
        d["total"] = self.total
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "MemoryBreakdown":
        return cls(
            **{k: float(data[k]) for k in ("weights", "gradients", "optimizer", "activations", "other") if k in data}
        )


@dataclass(frozen=True)
class TimeBreakdown:
    """Seconds per optimizer step. ``step`` is the total; the rest are its exposed parts, which add
    up to it: compute (busy time of the busiest rank), bubble (pipeline idle), exposed communication
    of each kind, the optimizer update, other fixed per-step work (data, logging, launches), and the slowest
    GPU's lag (on N GPUs the step waits for the slowest)."""

    step: float
    compute: float
    bubble: float = 0.0
    tp_comm: float = 0.0
    pp_comm: float = 0.0
    dp_comm: float = 0.0
    optimizer: float = 0.0
    other: float = 0.0
    ep_comm: float = 0.0  # expert all-to-all (mixture of experts), exposed
    cp_comm: float = 0.0  # context-parallel K,V exchange, exposed
    straggler: float = 0.0  # the slowest GPU's lag: the step runs at its pace (planner/cost/variability.py)
    offload: float = 0.0  # host-memory offload: the CPU's Adam and the host copies compute does not hide

    def to_dict(self) -> dict[str, float]:
        d = dataclasses.asdict(self)
        # only where a plan has them (a host's plans have no lag)
        for k in ("ep_comm", "cp_comm", "straggler", "offload"):
            if not d[k]:
                del d[k]
        return d


@dataclass(frozen=True)
class StepEstimate:
    """What the planner predicts for a plan: memory per stage, and (when a cost model ran) time."""

    params: int  # whole model
    params_by_stage: tuple[int, ...]  # held by one rank of each pipeline stage (after TP)
    memory_bytes: MemoryBreakdown  # the worst stage
    memory_by_stage: tuple[MemoryBreakdown, ...]
    capacity_bytes: int
    fits: bool
    model_flops_per_step: float = 0.0  # whole job, one optimizer step (Korthikanti Eq. 7)
    hardware_flops_per_step: float = 0.0  # including recomputation
    comm_bytes: Mapping[str, float] = field(default_factory=dict)  # per rank per step: tp, pp, dp
    time_s: TimeBreakdown | None = None
    tokens_per_s: float | None = None
    model_tflops_per_gpu: float | None = None
    mfu: float | None = None
    hardware_tflops_per_gpu: float | None = None
    hfu: float | None = None
    traced_memory_bytes: MemoryBreakdown | None = None
    # What exatrain's own trainer keeps today (accounting.trainer_memory), worst stage and per stage;
    # memory_bytes above is the lean reference (Megatron-LM's tensors), which `fits` judges.
    trainer_memory_bytes: MemoryBreakdown | None = None
    trainer_memory_by_stage: tuple[MemoryBreakdown, ...] = ()
    notes: tuple[str, ...] = ()
    # Where the step is likely to land (planner/band.py): [low, high] seconds and tokens/s from the
    # out-of-sample error of published runs, and which cell of that table (engine, family, n) it is.
    step_range_s: tuple[float, float] | None = None
    tokens_per_s_range: tuple[float, float] | None = None
    band: Mapping[str, Any] | None = None
    # The whole run at a token budget (planner/time_to_train.py): steps, days, GPU-hours, energy and cost,
    # each with the band's low and high; None unless a token budget was given.
    time_to_train: Mapping[str, Any] | None = None
    # Whether the worst stage fits (planner/memory_band.py): "fits", "tight" (capacity inside the band of its
    # measured peak) or "does not fit" (capacity below the band), and that band; ``fits`` is "not does not fit".
    # Left "" (files written before the verdict existed, estimates without a band) it is taken from ``fits``
    # on construction, so a saved and reloaded estimate equals the one saved.
    memory_verdict: str = ""
    memory_band: Mapping[str, Any] | None = None
    # Model states kept in host memory (Plan.offload; accounting.offload): {"bytes_per_node", "capacity_bytes" (the
    # node's), "fits"}; a plan whose node cannot hold them does not fit, whatever its devices hold. None: no offload.
    host_memory: Mapping[str, Any] | None = None
    # What dominates the worst stage and what each of four changes frees (planner/memory_advice.py).
    memory_advice: Mapping[str, Any] | None = None
    # Set where the predicted MFU is above the highest published for the device's class and precision
    # (catalog/data/studies.toml [[mfu]]): that reference's mfu, run and source.
    mfu_above_published: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.memory_verdict:
            object.__setattr__(self, "memory_verdict", "fits" if self.fits else "does not fit")

    def replace(self, **changes: Any) -> "StepEstimate":
        return dataclasses.replace(self, **changes)

    @property
    def verdict(self) -> str:
        """ "fits", "tight" or "does not fit" (an estimate without a band: "fits" or "does not fit" from ``fits``)."""
        return self.memory_verdict

    @property
    def trainer_fits(self) -> bool | None:
        if self.trainer_memory_bytes is None:
            return None
        return self.trainer_memory_bytes.total <= self.capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": self.params,
            "params_by_stage": list(self.params_by_stage),
            "memory_bytes": self.memory_bytes.to_dict(),
            "memory_by_stage": [m.to_dict() for m in self.memory_by_stage],
            "capacity_bytes": self.capacity_bytes,
            "fits": self.fits,
            "model_flops_per_step": self.model_flops_per_step,
            "hardware_flops_per_step": self.hardware_flops_per_step,
            "comm_bytes": dict(self.comm_bytes),
            "time_s": None if self.time_s is None else self.time_s.to_dict(),
            "tokens_per_s": self.tokens_per_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu,
            "hfu": self.hfu,
            "traced_memory_bytes": (None if self.traced_memory_bytes is None else self.traced_memory_bytes.to_dict()),
            "trainer_memory_bytes": (
                None if self.trainer_memory_bytes is None else self.trainer_memory_bytes.to_dict()
            ),
            "trainer_memory_by_stage": [m.to_dict() for m in self.trainer_memory_by_stage],
            "trainer_fits": self.trainer_fits,
            "notes": list(self.notes),
            **(
                {
                    "step_range_s": list(self.step_range_s),
                    "tokens_per_s_range": list(self.tokens_per_s_range or ()),
                    "band": dict(self.band or {}),
                }
                if self.step_range_s is not None
                else {}
            ),
            **({"time_to_train": dict(self.time_to_train)} if self.time_to_train is not None else {}),
            "memory_verdict": self.verdict,
            **({"memory_band": dict(self.memory_band)} if self.memory_band is not None else {}),
            **({"host_memory": dict(self.host_memory)} if self.host_memory is not None else {}),
            **({"memory_advice": dict(self.memory_advice)} if self.memory_advice is not None else {}),
            **({"mfu_above_published": dict(self.mfu_above_published)} if self.mfu_above_published else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StepEstimate":
        t = d.get("time_s")
        tm = d.get("traced_memory_bytes")
        trm = d.get("trainer_memory_bytes")
        return cls(
            params=int(d["params"]),
            params_by_stage=tuple(int(x) for x in d.get("params_by_stage", ())),
            memory_bytes=MemoryBreakdown.from_dict(d["memory_bytes"]),
            memory_by_stage=tuple(MemoryBreakdown.from_dict(m) for m in d.get("memory_by_stage", ())),
            capacity_bytes=int(d["capacity_bytes"]),
            fits=bool(d["fits"]),
            model_flops_per_step=float(d.get("model_flops_per_step", 0.0)),
            hardware_flops_per_step=float(d.get("hardware_flops_per_step", 0.0)),
            comm_bytes={k: float(v) for k, v in (d.get("comm_bytes") or {}).items()},
            time_s=None if t is None else TimeBreakdown(**{k: float(v) for k, v in t.items()}),
            tokens_per_s=d.get("tokens_per_s"),
            model_tflops_per_gpu=d.get("model_tflops_per_gpu"),
            mfu=d.get("mfu"),
            hardware_tflops_per_gpu=d.get("hardware_tflops_per_gpu"),
            hfu=d.get("hfu"),
            traced_memory_bytes=None if tm is None else MemoryBreakdown.from_dict(tm),
            trainer_memory_bytes=None if trm is None else MemoryBreakdown.from_dict(trm),
            trainer_memory_by_stage=tuple(MemoryBreakdown.from_dict(m) for m in d.get("trainer_memory_by_stage", ())),
            notes=tuple(d.get("notes", ())),
            step_range_s=_pair(d.get("step_range_s")),
            tokens_per_s_range=_pair(d.get("tokens_per_s_range")),
            band=dict(d["band"]) if isinstance(d.get("band"), Mapping) else None,
            time_to_train=dict(d["time_to_train"]) if isinstance(d.get("time_to_train"), Mapping) else None,
            memory_verdict=_verdict(d.get("memory_verdict")),
            memory_band=dict(d["memory_band"]) if isinstance(d.get("memory_band"), Mapping) else None,
            host_memory=dict(d["host_memory"]) if isinstance(d.get("host_memory"), Mapping) else None,
            memory_advice=dict(d["memory_advice"]) if isinstance(d.get("memory_advice"), Mapping) else None,
            mfu_above_published=(
                dict(d["mfu_above_published"]) if isinstance(d.get("mfu_above_published"), Mapping) else None
            ),
        )


def _verdict(v: Any) -> str:
    """A stored memory verdict ("" when absent: files written before it existed)."""
    if v in (None, ""):
        return ""
    if v not in ("fits", "tight", "does not fit"):
        raise ValueError(f"memory_verdict must be fits, tight or does not fit, got {v!r}")
    return str(v)


def _pair(v: Any) -> tuple[float, float] | None:
    """A [low, high] pair from JSON (None when absent: plans written before ranges existed)."""
    return None if v is None else (float(v[0]), float(v[1]))


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
class Plan:
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
    # a constructor keyword (Plan(model=m, runtime="torchtitan")): settings.holds_settings
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
        required = (
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
        optional = (
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
        missing = [k for k in required if k not in d]
        if missing:
            raise UserError(f"{source}: missing plan key(s) {', '.join(missing)}")
        unknown = sorted(set(d) - set(required) - set(optional))
        if unknown:
            raise UserError(f"{source}: unknown plan key(s) {', '.join(unknown)}")
        if "version" not in d:
            raise UserError(
                f"{source}: no plan version (a plan written by `exatrain estimate/search --out` has "
                f'"version": {PLAN_VERSION})'
            )
        if d.get("version") != PLAN_VERSION:
            raise UserError(f"{source}: plan version {d.get('version')!r} is not {PLAN_VERSION}")
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
        if "gpus" in d and d["gpus"] != plan.gpus:
            raise UserError(f"{source}: gpus {d['gpus']} != tp*cp*pp*dp = {plan.gpus}")
        if "num_microbatches" in d and d["num_microbatches"] != plan.num_microbatches:
            raise UserError(
                f"{source}: num_microbatches {d['num_microbatches']} != "
                f"global_batch/(micro_batch*dp) = {plan.num_microbatches}"
            )
        return plan

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def save(self, path: str | Path) -> None:
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        return cls.from_dict(read_json(path), source=str(path))


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
