"""What the planner predicts for a plan (``Plan.estimate``): memory per stage by kind, the step's time by part,
throughput, and the verdicts and bands around them; read and written as the plan JSON's ``estimate``.

Torch-free and planner-free: ``plan.py`` carries it, the planner fills it (``planner.estimate``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping


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


__all__ = ["MemoryBreakdown", "StepEstimate", "TimeBreakdown"]
