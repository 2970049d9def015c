"""Many layouts of one model as parallel numpy arrays: what the planner evaluates at once.

The search's candidates and a single plan take the same form, so one evaluation path serves both
(a plan is a batch of one). Categorical choices are stored as indices (``RECOMPUTE``,
``SCHEDULES``) so that every field is an array.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exatrain.plan import Plan
from exatrain.settings import RECOMPUTE, SCHEDULES


@dataclass(frozen=True, eq=False)
class Layouts:
    """N layouts (every field an array of N entries). ``stage_layers``: one custom split, in
    layers per virtual stage, shared by every layout (a plan's own); () = ``balanced_split``.
    ``ep`` (expert parallelism, adds no ranks: ``plan.ParallelDims``) and ``cp`` (context parallelism, adds ranks:
    tp*cp*pp*dp) default to 1 each; ``recompute_layers``: the layers of each virtual stage a full recomputation
    covers, the first ones (``Plan.recompute_layers``; default 0: all). The run settings the layouts share are the
    evaluation's (``accounting.engines.Resolved``)."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    micro_batch: np.ndarray
    num_microbatches: np.ndarray
    zero_stage: np.ndarray
    recompute: np.ndarray  # index into RECOMPUTE
    sequence_parallel: np.ndarray  # bool
    schedule: np.ndarray  # index into SCHEDULES
    interleave: np.ndarray
    stage_layers: tuple[int, ...] = ()
    ep: np.ndarray | None = None
    cp: np.ndarray | None = None
    recompute_layers: np.ndarray | None = None

    def __post_init__(self) -> None:
        for name, default in (("ep", 1), ("cp", 1), ("recompute_layers", 0)):
            value = getattr(self, name)
            value = np.full(self.tp.shape, default, dtype=np.int64) if value is None else value
            object.__setattr__(self, name, np.broadcast_to(np.asarray(value, dtype=np.int64), self.tp.shape).copy())

    def __len__(self) -> int:
        return int(self.tp.size)

    @property
    def gpus(self) -> np.ndarray:
        return self.tp * self.cp * self.pp * self.dp

    @classmethod
    def of(
        cls,
        *,
        tp,
        pp,
        dp,
        micro_batch,
        num_microbatches,
        zero_stage,
        recompute,
        sequence_parallel,
        schedule,
        interleave,
        stage_layers: tuple[int, ...] = (),
        ep=1,
        cp=1,
        recompute_layers=0,
    ) -> "Layouts":
        ints = [
            np.asarray(x, dtype=np.int64).reshape(-1)
            for x in (tp, pp, dp, micro_batch, num_microbatches, zero_stage, recompute)
        ]
        return cls(
            *ints,
            sequence_parallel=np.asarray(sequence_parallel, dtype=bool).reshape(-1),
            schedule=np.asarray(schedule, dtype=np.int64).reshape(-1),
            interleave=np.asarray(interleave, dtype=np.int64).reshape(-1),
            stage_layers=tuple(stage_layers),
            ep=np.asarray(ep, dtype=np.int64).reshape(-1),
            cp=np.asarray(cp, dtype=np.int64).reshape(-1),
            recompute_layers=np.asarray(recompute_layers, dtype=np.int64).reshape(-1),
        )

    @classmethod
    def from_plan(cls, plan: Plan) -> "Layouts":
        return cls.of(
            tp=plan.tp,
            pp=plan.pp,
            dp=plan.dp,
            micro_batch=plan.micro_batch,
            num_microbatches=plan.num_microbatches,
            zero_stage=plan.zero_stage,
            recompute=RECOMPUTE.index(plan.recompute),
            sequence_parallel=plan.sequence_parallel,
            schedule=SCHEDULES.index(plan.schedule),
            interleave=plan.interleave,
            stage_layers=plan.stage_layers,
            ep=plan.ep,
            cp=plan.cp,
            recompute_layers=plan.recompute_layers,
        )

    def take(self, idx) -> "Layouts":
        """The layouts at ``idx`` (an index array or boolean mask)."""
        return Layouts(
            *(getattr(self, f)[idx] for f in _ARRAYS),
            stage_layers=self.stage_layers,
            ep=self.ep[idx],
            cp=self.cp[idx],
            recompute_layers=self.recompute_layers[idx],
        )


_ARRAYS = (
    "tp",
    "pp",
    "dp",
    "micro_batch",
    "num_microbatches",
    "zero_stage",
    "recompute",
    "sequence_parallel",
    "schedule",
    "interleave",
)

__all__ = ["Layouts"]
