"""Op orders of the two V schedules, zbv and dualpipev, and the activations in flight they make a rank hold.

Both place two stages on each of the pp ranks in a V: rank r holds stage r (chunk 0) and stage 2 pp - 1 - r
(chunk 1), so rank 0 holds the first and the last stage (torch ``generate_stage_to_rank_mapping`` style "v").
The orders are torch.distributed.pipelining's (2.13), tests/planner/test_vschedules.py checks them action by
action against the ``pipeline_order`` torch builds:

- zbv (``ScheduleZBVZeroBubble``; Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 6 ZB-V): warm-up
  2 (pp - r) - 1 forwards of chunk 0, r pairs (F chunk 1, F chunk 0), pp - r triples (F, B, W) of chunk 1; a
  steady state of F0 B0 W0 F1 B1 W1; a cool-down of r pairs of input backwards, pp - r (B0, W0), and the
  deferred weight passes. It runs max(2 pp - 1, m) micro-batches and drops those past m.
- dualpipev (``ScheduleDualPipeV``; DeepSeek-V3 technical report Sec. 3.2.1, folded into a V): warm-up
  forwards, then pairs of one chunk's forward with the other's whole backward (torch runs such a pair's two
  halves one after the other), and zero-bubble input/weight splits at the ends.

Each op is (kind, stage, micro-batch, full): kind 0 forward, 1 backward (the input gradient; the whole backward
where ``full``), 2 weight gradient. Counts only (no time): the cost model (``planner.cost.schedule``) times them.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

F, B, W = 0, 1, 2


def v_stages(rank: int, pp: int) -> tuple[int, int]:
    """The two stages of ``rank`` under a V placement: (chunk 0, chunk 1)."""
    return rank, 2 * pp - 1 - rank


def v_rank_of_stages(pp: int) -> np.ndarray:
    """The rank of each of the 2 pp stages under a V placement."""
    k = np.arange(2 * pp)
    return np.where(k < pp, k, 2 * pp - 1 - k)


def _zbv(rank: int, pp: int, m: int) -> list[tuple[int, int, int, bool]]:
    n = max(2 * pp - 1, m)
    s0, s1 = v_stages(rank, pp)
    ops: list[tuple[int, int, int, bool]] = []
    cnt = {(F, 0): 0, (F, 1): 0, (B, 0): 0, (B, 1): 0, (W, 0): 0, (W, 1): 0}
    stage = (s0, s1)

    def op(kind: int, chunk: int) -> None:
        ops.append((kind, stage[chunk], cnt[kind, chunk], False))
        cnt[kind, chunk] += 1

    for _ in range(2 * (pp - rank) - 1):
        op(F, 0)
    for _ in range(rank):
        op(F, 1)
        op(F, 0)
    for _ in range(pp - rank):
        op(F, 1), op(B, 1), op(W, 1)
    while cnt[F, 1] < cnt[F, 0] or cnt[F, 0] < n:
        if cnt[F, 0] < n:
            op(F, 0)
        op(B, 0), op(W, 0)
        op(F, 1), op(B, 1), op(W, 1)
    for _ in range(rank):
        op(B, 0), op(B, 1)
    for _ in range(pp - rank):
        op(B, 0), op(W, 0)
    while cnt[W, 1] < cnt[B, 1]:
        op(W, 1)
    while cnt[W, 0] < cnt[B, 0]:
        op(W, 0)
    return [o for o in ops if o[2] < m]


def _dualpipev(rank: int, pp: int, m: int) -> list[tuple[int, int, int, bool]]:
    s0, s1 = v_stages(rank, pp)
    ops: list[tuple[int, int, int, bool]] = []
    nf = {s0: 0, s1: 0}
    nb = {s0: 0, s1: 0}
    pending: list[tuple[int, int]] = []  # (stage, micro-batch) of input backwards whose weight pass waits

    def fwd(s: int) -> None:
        ops.append((F, s, nf[s], False))
        nf[s] += 1

    def bwd(s: int, full: bool) -> None:
        ops.append((B, s, nb[s], full))
        if not full:
            pending.append((s, nb[s]))
        nb[s] += 1

    def weight() -> None:
        if pending:
            s, j = pending.pop(0)
            ops.append((W, s, j, False))

    for _ in range(2 * (pp - rank - 1)):
        fwd(s0)
    for _ in range(rank + 1):
        fwd(s0), fwd(s1)
    for _ in range(pp - rank - 1):
        bwd(s1, False), weight(), fwd(s1)
    for _ in range(m - 2 * pp + rank + 1):  # a forward of one chunk with the other's whole backward, twice
        fwd(s0), bwd(s1, True)
        fwd(s1), bwd(s0, True)
    for _ in range(pp - rank - 1):
        bwd(s1, True)
        fwd(s1), bwd(s0, True)
    split = False
    half = (rank + 1) // 2
    for i in range(rank + 1):  # the second half of the last backwards split for zero bubble
        split = split or (i == half and rank % 2 == 1)
        bwd(s1, not split)
        split = split or (i == half and rank % 2 == 0)
        bwd(s0, not split)
    for _ in range(pp - rank - 1):
        weight(), bwd(s0, not split)
    for _ in range(rank + 1):
        weight()
    return ops


@lru_cache(maxsize=512)
def v_order(schedule: str, rank: int, pp: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(kind, stage, micro-batch, full) of every op of ``rank`` in execution order under ``schedule``."""
    ops = (_zbv if schedule == "zbv" else _dualpipev)(rank, pp, m)
    kind, stage, micro, full = (np.array(x) for x in zip(*ops))
    return kind.astype(np.int64), stage.astype(np.int64), micro.astype(np.int64), full.astype(bool)


def steady_from(pp: int) -> int:
    """Micro-batches from which a V schedule's orders only lengthen their steady state (one more steady step per
    micro-batch), so the activations a rank holds at most no longer change (tests check it)."""
    return 6 * pp


@lru_cache(maxsize=1 << 16)
def v_peak_in_flight(schedule: str, pp: int, m: int, rank: int) -> int:
    """Most (micro-batch, stage) activation sets ``rank`` holds at once: a forward adds one, the pass that frees
    its saved inputs (the weight pass, or a whole backward) takes it off. Kept per case (an int each): every search
    over a space asks for the same cases again, and building their op orders is most of its memory counts' time."""
    kind, _, _, full = v_order(schedule, int(rank), int(pp), int(min(m, steady_from(pp))))
    delta = (kind == F).astype(np.int64) - (kind == W) - ((kind == B) & full)
    return int(np.cumsum(delta).max())


__all__ = ["steady_from", "v_order", "v_peak_in_flight", "v_rank_of_stages", "v_stages"]
