"""Which layers a full recomputation reruns, per layout and virtual stage: the cost model's one reading of
``Plan.recompute_layers`` (the first N layers of each stage) and ``Plan.recompute_every`` (one layer in N of a
rank's, ``settings.full_rerun_layers``), shared by the step time (``cost.stage``) and the memory counts
(``planner.evaluate``)."""

from __future__ import annotations

import numpy as np

from exatrain.settings import full_rerun_layers


def rerun_layers(stage_layers, pp: int, first=0, every: int = 0) -> np.ndarray | None:
    """(N, S) layers of each virtual stage (``stage_layers`` (S,), model order, stage k on rank k % pp) that a full
    recomputation reruns, per layout: the first ``first`` of each stage (one per layout (N,), or one for all; 0:
    all of them), or with ``every`` one in ``every`` of a rank's layers ((1, S), the same for every layout). None
    where every layer of every layout is rerun."""
    split = np.asarray(stage_layers)[None, :]
    if every:
        return np.asarray(full_rerun_layers(split[0], pp, every=every))[None, :]
    n = np.asarray(first).reshape(-1, 1)
    if not np.any(n > 0):
        return None
    return np.where(n > 0, np.minimum(split, n), split)


def rerun_share(stage_layers, pp: int, first=0, every: int = 0):
    """The share of each stage's layers a full recomputation reruns, (N, S) (``rerun_layers`` over the stage's
    layers), or 1.0 where it reruns them all."""
    L = np.asarray(stage_layers, dtype=float)[None, :]
    counts = rerun_layers(stage_layers, pp, first, every)
    if counts is None:
        return 1.0
    if every:
        return counts.astype(float) / L
    n = np.asarray(first, dtype=float).reshape(-1, 1)
    return np.where(n > 0, counts / np.maximum(L, 1.0), 1.0)


def rerun_on_rank(stage_layers, pp: int, looped, first=0, every: int = 0, n: int = 1) -> np.ndarray | None:
    """(n, pp) layers of each pipeline rank a full recomputation reruns, of ``n`` layouts (``rerun_layers`` summed
    over a rank's stages; ``looped``: the stages in (chunk, rank) order), or None where it reruns them all."""
    counts = rerun_layers(stage_layers, pp, first, every)
    if counts is None:
        return None
    v = len(looped) // pp
    return np.broadcast_to(counts[:, looped].reshape(-1, v, pp).sum(axis=1), (n, pp))


__all__ = ["rerun_layers", "rerun_on_rank", "rerun_share"]
