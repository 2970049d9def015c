"""The small typed values the cost model's terms return (``cost.stage``, ``cost.step``): each term's seconds
per micro-batch or per step, what of them is exposed and what an overlap hid, so that a step is the plain
composition of its terms."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class PassSeconds:
    """Seconds per micro-batch of each layout and virtual stage, (N, S) arrays (or scalars): the forward, the
    input-gradient backward, and the weight-gradient pass (0 where the backward holds it)."""

    fwd: np.ndarray | float
    bwd: np.ndarray | float
    wgrad: np.ndarray | float = 0.0


@dataclass(frozen=True, eq=False)
class CommTerm:
    """A communication term, per micro-batch and stage ((N, S) arrays or scalars): the seconds it leaves exposed
    in the forward and in the backward, and the seconds an overlap hid behind compute (``hidden``)."""

    fwd: np.ndarray | float
    bwd: np.ndarray | float
    hidden: np.ndarray | float = 0.0

    @property
    def exposed(self):
        return self.fwd + self.bwd


@dataclass(frozen=True, eq=False)
class DpTerm:
    """A step's data-parallel collectives, (N,) seconds: ``exposed`` (with ``contention``, the slowdown of the
    compute the hidden ones overlap), ``hidden`` (behind compute or the pipeline's drain); ``reduce`` and
    ``gather`` (N, pp): each pipeline rank's gradient reductions and parameter gathers before any overlap."""

    exposed: np.ndarray
    contention: np.ndarray
    hidden: np.ndarray
    reduce: np.ndarray
    gather: np.ndarray


@dataclass(frozen=True, eq=False)
class RankShare:
    """The busiest pipeline rank's seconds a step, (N,): compute, TP collectives, the exposed expert all-to-all
    and context-parallel exchange together (``ext``) and the all-to-all's part of them (``ep``)."""

    compute: np.ndarray
    tp: np.ndarray
    ext: np.ndarray
    ep: np.ndarray


__all__ = ["CommTerm", "DpTerm", "PassSeconds", "RankShare"]
