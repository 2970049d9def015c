"""Stragglers: each step's compute and wait seconds (``StepClock``), gathered over the ranks every few steps
(``StragglerWindows``), a rank slow against its stage peers two windows running named a straggler
(``slow_ranks``, ``straggler_lines``), and the test-only fault injection of a slow rank (SLOW_RANK_ENV).
exatrain.trainer.health's module doc says what compute and wait are on CPU and CUDA."""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Mapping, Sequence

COMPUTE_PHASES = frozenset({"data", "forward", "backward", "forward/backward", "optimizer"})
SLOW_RATIO = 1.3  # compute per step above this many times the stage peers' median: slow
SLOW_MIN_EXCESS_S = 0.002  # ... and above it by at least this much per step (timer noise on tiny steps)
SLOW_WINDOWS = 2  # slow in this many windows running: a straggler
SLOW_RANK_ENV = "EXATRAIN_SLOW_RANK"  # fault injection for tests: "RANK:SECONDS" of extra compute per step


def slow_ranks(compute_s: Sequence[float], stage_of: Sequence[int]) -> list[int]:
    """The ranks whose compute per step is above SLOW_RATIO x the median of their stage peers' (and
    above it by SLOW_MIN_EXCESS_S); ranks alone on their stage are not judged."""
    out = []
    for r, c in enumerate(compute_s):
        peers = [compute_s[q] for q in range(len(compute_s)) if q != r and stage_of[q] == stage_of[r]]
        if not peers:
            continue
        m = statistics.median(peers)
        if c > SLOW_RATIO * m and c - m > SLOW_MIN_EXCESS_S:
            out.append(r)
    return out


class StepClock:
    """Compute and wait seconds of each step (see the module docstring for what each is on CPU and CUDA)."""

    def __init__(self, device: Any) -> None:
        self.cuda = getattr(device, "type", "cpu") == "cuda"
        self.slowed = False
        self._events: list[tuple[str, Any]] = []
        self._wall0 = self._cpu0 = 0.0

    def begin(self) -> None:
        self.slowed = False
        self._events = []
        self._wall0, self._cpu0 = time.perf_counter(), time.thread_time()

    def mark(self, phase: str) -> None:
        if self.cuda:
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._events.append((phase, ev))

    def end(self) -> tuple[float, float]:
        """(compute, wait) of the step just finished; on CUDA after the trainer's per-step synchronise."""
        wall = time.perf_counter() - self._wall0
        if not self.cuda:
            compute = min(wall, time.thread_time() - self._cpu0)
        else:
            import torch

            last = torch.cuda.Event(enable_timing=True)
            last.record()
            last.synchronize()
            spans = self._events + [("end", last)]
            compute = sum(
                a.elapsed_time(b) / 1e3 for (phase, a), (_, b) in zip(spans, spans[1:]) if phase in COMPUTE_PHASES
            )
            compute = min(wall, compute)
        return compute, max(0.0, wall - compute)


class StragglerWindows:
    """Every ``every`` steps: the ranks' compute and wait per step (one all_gather), who is slow, who is
    a straggler (slow two windows running). Every rank calls ``add`` after every step (a collective
    every ``every`` steps); each returns the same window line."""

    def __init__(self, every: int, plan: Any, device: Any) -> None:
        from exatrain.trainer.parallel.ranks import coordinates

        self.every, self.device = every, device
        self.coords = [coordinates(r, plan) for r in range(plan.gpus)]  # (pp, dp, tp)
        self.stage_of = [c[0] for c in self.coords]
        self.windows: list[dict[str, Any]] = []
        self._compute = self._wait = 0.0
        self._steps = 0
        self._first = 0
        self._recent: list[set[int]] = []  # the slow ranks of the last SLOW_WINDOWS windows

    def add(self, step: int, compute_s: float, wait_s: float) -> dict[str, Any] | None:
        if not self.every:
            return None
        if self._steps == 0:
            self._first = step
        self._compute += compute_s
        self._wait += wait_s
        self._steps += 1
        if step % self.every:
            return None
        import torch
        import torch.distributed as dist

        mine = torch.tensor([self._compute, self._wait, float(self._steps)], dtype=torch.float64, device=self.device)
        every = [torch.zeros_like(mine) for _ in self.coords]
        dist.all_gather(every, mine)
        rows = [t.tolist() for t in every]
        compute = [c / max(1.0, n) for c, _, n in rows]
        wait = [w / max(1.0, n) for _, w, n in rows]
        slow = slow_ranks(compute, self.stage_of)
        self._recent = (self._recent + [set(slow)])[-SLOW_WINDOWS:]
        named = sorted(set.intersection(*self._recent)) if len(self._recent) == SLOW_WINDOWS else []
        window = {
            "kind": "ranks",
            "first_step": self._first,
            "last_step": step,
            "compute_s": [round(x, 6) for x in compute],
            "wait_s": [round(x, 6) for x in wait],
            "coords": [[tp, pp, dp] for pp, dp, tp in self.coords],
            "slow": slow,
            "stragglers": named,
        }
        self.windows.append(window)
        self._compute = self._wait = 0.0
        self._steps = 0
        return window


def straggler_lines(window: Mapping[str, Any]) -> list[str]:
    """One log line per straggler a window names."""
    out = []
    compute, stage = window["compute_s"], [c[1] for c in window["coords"]]
    for r in window["stragglers"]:
        peers = [compute[q] for q in range(len(compute)) if q != r and stage[q] == stage[r]]
        m = statistics.median(peers)
        tp, pp, dp = window["coords"][r]
        out.append(
            f"straggler: rank {r} (tp {tp}, pp {pp}, dp {dp}) computes {compute[r]:.3f} s/step, "
            f"{compute[r] / m:.1f}x its stage peers' median {m:.3f} s, {SLOW_WINDOWS} windows running "
            f"(steps {window['first_step']}-{window['last_step']}); wait {window['wait_s'][r]:.3f} s/step"
        )
    return out


def slow_injection(rank: int) -> float:
    """Seconds of extra compute per step this rank spins for (EXATRAIN_SLOW_RANK=RANK:SECONDS), else 0."""
    spec = os.environ.get(SLOW_RANK_ENV, "")
    if not spec:
        return 0.0
    try:
        who, seconds = spec.split(":")
        return float(seconds) if int(who) == rank else 0.0
    except ValueError:
        return 0.0


def spin_cpu(seconds: float) -> None:
    """``seconds`` of this thread's CPU time, busy: extra compute as a slow device would spend it (a
    sleep would count as waiting on the CPU clock, and wall time as less compute on a loaded machine)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


__all__ = [
    "COMPUTE_PHASES",
    "SLOW_RANK_ENV",
    "SLOW_RATIO",
    "StepClock",
    "StragglerWindows",
    "slow_ranks",
    "straggler_lines",
]
