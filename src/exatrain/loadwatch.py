"""How busy the machine was while something ran, so a measurement can say when it shared the cores.

Three figures over a window: the 1-minute load average (``os.getloadavg``, sampled each second, averaged); the cores'
worth of CPU time *other* processes used (the machine's busy time from /proc/stat less this process's and its reaped
children's, ``os.times``); and the fraction of CPU time a hypervisor took (/proc/stat's steal). The load average counts
this run's own ranks too, so the comparison below uses the other processes' share.

The rule that turns two windows (the calibration's bench, then training) into an expected slowdown is fair sharing,
stated here and not fitted: ``n`` runnable threads on ``c`` cores each get ``min(1, c / n)`` of a core, and steal takes
its fraction off what is left. The other work competing with a window's ``own`` busy threads is the larger of the
cores' worth of CPU time other processes used and the load average less ``own`` (on a saturated machine the CPU time
others get is capped by the cores, while the load average still counts every thread waiting to run). The window runs
``slowdown = max(1, (own + other work) / cores) / (1 - steal)`` times slower than on an idle machine; training on
``ranks`` ranks after a bench measured on one thread is expected ``slowdown(train, ranks) / slowdown(bench, 1)`` times
slower than the calibration predicts (``contention``).
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

SAMPLE_S = 1.0  # load-average samples a second
CHANGED = 1.1  # an expected slowdown (or speed-up) beyond 10% is a change worth a line


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _proc_stat() -> tuple[float, float, float, int] | None:
    """(busy, steal, total seconds of CPU time since boot, CPUs) from /proc/stat, or None where there is none."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    head = next((line.split() for line in lines if line.startswith("cpu ")), None)
    if head is None or len(head) < 5:
        return None
    v = [float(x) for x in head[1:9]] + [0.0] * (9 - len(head))  # user nice system idle iowait irq softirq steal
    hz = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
    busy = v[0] + v[1] + v[2] + v[5] + v[6]
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return busy / hz, v[7] / hz, sum(v[:8]) / hz, max(cpus, 1)


def _own_cpu_s() -> float:
    """CPU seconds of this process and of its children it has reaped (a run's ranks, once joined)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return None


@dataclass(frozen=True)
class MachineLoad:
    """The machine's load over one window (the module doc): ``others`` and ``steal`` are None without /proc/stat."""

    seconds: float
    cores: int  # the cores this process may run on
    load_average: float | None  # mean of the 1-minute load average over the window
    others: float | None  # cores' worth of CPU time other processes used, on this process's cores
    steal: float | None  # fraction of CPU time the hypervisor took

    def slowdown(self, own: float) -> float:
        """How many times slower ``own`` busy threads run than on an idle machine, by fair share (module doc)."""
        waiting = (self.load_average or 0.0) - own  # threads of others runnable beside ours (the module doc)
        busy = own + max(self.others or 0.0, waiting)
        return max(1.0, busy / self.cores) / (1.0 - min(self.steal or 0.0, 0.9))

    def describe(self) -> str:
        parts = [f"load average {self.load_average:.1f}" if self.load_average is not None else "no load average"]
        if self.others is not None:
            parts.append(f"other processes {self.others:.1f} of {self.cores} core{'s' if self.cores != 1 else ''}")
        if self.steal:
            parts.append(f"steal {self.steal:.0%}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "cores": self.cores,
            "load_average": self.load_average,
            "others": self.others,
            "steal": self.steal,
        }

    @classmethod
    def from_dict(cls, d: Any) -> "MachineLoad | None":
        """The load a file recorded, or None for anything else (a record written before loads were kept)."""
        if not isinstance(d, Mapping):
            return None
        try:

            def num(k: str) -> float | None:
                v = d.get(k)
                return None if v is None or isinstance(v, bool) else float(v)

            cores = int(d["cores"])
            if cores < 1 or not math.isfinite(float(d["seconds"])):
                return None
            return cls(
                seconds=float(d["seconds"]),
                cores=cores,
                load_average=num("load_average"),
                others=num("others"),
                steal=num("steal"),
            )
        except (KeyError, TypeError, ValueError):
            return None


class LoadWatch:
    """``with LoadWatch() as w: ...`` then ``w.load``: the MachineLoad of the block (a thread samples the load
    average; /proc/stat and the CPU times are read at both ends)."""

    def __init__(self) -> None:
        self.load: MachineLoad | None = None
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        while True:
            v = _loadavg()
            if v is not None:
                self._samples.append(v)
            if self._stop.wait(SAMPLE_S):
                return

    def __enter__(self) -> "LoadWatch":
        self._t0, self._stat0, self._own0 = time.perf_counter(), _proc_stat(), _own_cpu_s()
        self._thread = threading.Thread(target=self._sample, name="exatrain-loadwatch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        wall = max(time.perf_counter() - self._t0, 1e-9)
        end = _loadavg()
        samples = self._samples + ([end] if end is not None else [])
        cores, others, steal = usable_cores(), None, None
        stat1 = _proc_stat()
        if self._stat0 is not None and stat1 is not None:
            busy, stolen, total = (b - a for a, b in zip(self._stat0[:3], stat1[:3]))
            own = _own_cpu_s() - self._own0
            cpus = stat1[3]
            # other work on the whole machine, spread evenly over its CPUs: the share that fell on ours
            others = max(0.0, (busy - own) / wall) * min(1.0, cores / cpus)
            steal = stolen / total if total > 0 else 0.0
        self.load = MachineLoad(
            seconds=wall,
            cores=cores,
            load_average=sum(samples) / len(samples) if samples else None,
            others=others,
            steal=steal,
        )


@dataclass(frozen=True)
class Contention:
    """The load during the calibration's bench against the load during training (the module doc's rule)."""

    bench: MachineLoad
    train: MachineLoad
    ranks: int  # the training's busy threads (its ranks on this machine)

    @property
    def factor(self) -> float:
        """Expected measured / predicted step time from the change of load alone (1: no change)."""
        return self.train.slowdown(self.ranks) / self.bench.slowdown(1)

    @property
    def changed(self) -> bool:
        return not (1 / CHANGED <= self.factor <= CHANGED)

    def widen(self, low: float, high: float) -> tuple[float, float]:
        """A step-time band widened by the change: its high end times the factor when the load rose, its low end
        when it fell; unchanged when the load did not change."""
        if not self.changed:
            return low, high
        return (low, high * self.factor) if self.factor > 1 else (low * self.factor, high)

    def line(self) -> str:
        head = f"load: {self.bench.describe()} during bench; {self.train.describe()} during training"
        if not self.changed:
            return head + ": about the same"
        how = "slower" if self.factor > 1 else "faster"
        times = max(self.factor, 1 / self.factor)
        return (
            f"{head}: the machine's contention changed, so the measurement runs about {times:.2f}× {how} than "
            f"the calibration predicts (fair share of {self.train.cores} cores, loadwatch.py); the band is "
            "widened by it"
        )


def contention(bench: Any, train: Any, ranks: int) -> Contention | None:
    """The Contention of two recorded loads (dicts, as MachineLoad.to_dict writes them), None where either is
    missing or malformed."""
    b, t = MachineLoad.from_dict(bench), MachineLoad.from_dict(train)
    if b is None or t is None or not isinstance(ranks, int) or ranks < 1:
        return None
    return Contention(bench=b, train=t, ranks=ranks)


__all__ = ["CHANGED", "Contention", "LoadWatch", "MachineLoad", "contention", "usable_cores"]
