"""``demo``: the whole loop on this machine in a few minutes: measure, plan, train, compare.

``exatrain bench --quick`` measures this machine's cost-model parameters; ``search`` ranks every
layout of a small GPT on this machine's CPU ranks with them; ``train`` runs the best one with the
prediction attached; the end compares the predicted step time (with its band, planner/band.py)
against the measured one. What each step writes goes into one folder (default a new
``runs/demo-<time>/``), the same files the separate commands write.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from exatrain.errors import UserError
from exatrain.paths import check_output_dir

DEMO_MODEL = "gpt-small"
DEMO_GLOBAL_BATCH = 16
DEMO_STEPS = 60
MAX_RANKS = 8  # more CPU ranks than this give a 2.7M-parameter model nothing more to show
FILES = {
    "calibration": "calib.json",
    "plan": "plan.json",
    "metrics": "metrics.jsonl",
    "ranks": "metrics.ranks",
    "summary": "summary.txt",
}
WHAT = {
    "calibration": "this machine's cost-model parameters",
    "plan": "the best layout with its prediction",
    "metrics": "a line per step, then the RunRecord",
    "ranks": "each rank's log and heartbeat",
    "summary": "these lines",
}


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def default_ranks(cores: int | None = None) -> int:
    """One rank per core, rounded down to a power of two (so the global batch of 16 divides), from 2
    (the fewest that have a layout to choose) to MAX_RANKS."""
    cores = usable_cores() if cores is None else cores
    ranks = 2
    while ranks * 2 <= min(cores, MAX_RANKS):
        ranks *= 2
    return ranks


def default_out(root: str | Path = "runs") -> Path:
    """A new folder runs/demo-<YYYYmmdd-HHMMSS> (a suffix when that second's is taken)."""
    base = Path(root) / time.strftime("demo-%Y%m%d-%H%M%S")
    out, n = base, 1
    while out.exists():
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{int(seconds // 60)} min {seconds % 60:02.0f} s"


@dataclass(frozen=True)
class DemoResult:
    out: Path  # the folder everything went into
    ranks: int
    bench: Any  # bench.machine.BenchResult
    search: Any  # planner.search.search.SearchResult, ranked with this machine's parameters
    train: Any  # api.training.TrainResult of the best layout
    files: dict[str, Path] = field(default_factory=dict)  # what was written, by role (FILES)
    seconds: dict[str, float] = field(default_factory=dict)  # bench, search, train, total

    def summary_lines(self) -> list[str]:
        """The loop in a few lines: what was measured, what the search chose, predicted against
        measured step time with the band, the files written and the time it took."""
        from exatrain.planner.compare import compare, summary_lines
        from exatrain.planner.search.explain import describe

        best = self.search.ranked[0]
        # GEMM throughput, memory and overheads, the links: the figures the search's ranking leans on here
        measured = [line for line in self.bench.summary_lines() if line.startswith(("GEMM:", "memory:", "links ("))]
        lines = [
            f"1. measured this machine (bench --quick, {_duration(self.bench.seconds)}): {measured[0]}",
            *(f"   {line}" for line in measured[1:]),
            f"2. searched {self.search.legal:,} layouts of {best.model.name} on {self.ranks} CPU ranks, "
            f"global batch {best.global_batch}: best {describe(best)}, "
            f"predicted {best.estimate.time_s.step:.3f} s/step",
        ]
        for i, p in enumerate(self.search.ranked[1:3], start=2):
            lines.append(f"   #{i} {describe(p)}: {p.estimate.time_s.step:.3f} s/step")
        record = self.train.record
        if record is not None and record.measured is not None:
            m = record.measured
            loss = (
                f", loss {m.first_loss:.3f} -> {m.last_loss:.3f}"
                if m.first_loss is not None and m.last_loss is not None
                else ""
            )
            lines.append(f"3. trained it {m.steps} steps: {record.status}{loss}, {m.tokens_per_s:,.0f} tokens/s")
            c = compare(record)
            compared = [
                line for line in summary_lines(c, self.train.calibrated) if not line.startswith("peak memory")
            ]  # step time, and the load's change where it changed
            if c.load_line is not None and c.load_line not in compared:
                compared.append(c.load_line)  # the demo says the load in any case: bench and training, side by side
            lines += [("4. " if i == 0 else "   ") + line for i, line in enumerate(compared)]
        else:
            lines.append("3. trained it: no RunRecord came back, nothing to compare")
        lines.append(
            f"wrote {self.out}/: "
            + ", ".join(
                f"{p.name}{'/' if role == 'ranks' else ''} ({WHAT[role]})"
                for role, p in self.files.items()
                if p.exists() or role == "summary"
            )
        )
        s = self.seconds
        lines.append(
            f"took {_duration(s['total'])} (bench {_duration(s['bench'])}, search {s['search']:.1f} s, "
            f"train {_duration(s['train'])})"
        )
        return lines


def demo(
    *,
    out: str | Path | None = None,
    ranks: int | None = None,
    steps: int = DEMO_STEPS,
    model: str = DEMO_MODEL,
    global_batch: int = DEMO_GLOBAL_BATCH,
    quiet: bool = False,
    warn: Callable[[str], None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> DemoResult:
    """Measure this machine (``bench(quick=True)`` over ``ranks`` local ranks), search the best layout
    of ``model`` on ``ranks`` CPU ranks at ``global_batch`` with those measurements, train it for
    ``steps`` steps and compare its predicted step time (and band) with the measured one.
    ``ranks``: default one per core, a power of two from 2 to 8 (``default_ranks``). ``out``: a new or
    empty folder (default a new ``runs/demo-<time>``) that gets calib.json, plan.json, metrics.jsonl
    (with metrics.ranks/, the trainer's per-rank logs) and summary.txt. ``progress`` hears each phase,
    ``warn`` the warnings; ``quiet`` hides the trainer's step lines. Returns a DemoResult
    (``summary_lines()`` is what ``exatrain demo`` prints)."""
    from exatrain.api.measuring import bench
    from exatrain.api.planning import search
    from exatrain.api.training import train

    say = progress or (lambda message: None)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 4:
        raise UserError(
            f"--steps must be an integer of at least 4 (the first 2 are warm-up, not measured), got {steps!r}"
        )
    ranks = default_ranks() if ranks is None else ranks
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise UserError(f"--ranks must be a positive integer, got {ranks!r}")
    folder = default_out() if out is None else Path(out)
    check_output_dir(folder, "--out")
    if folder.is_dir() and any(folder.iterdir()):
        raise UserError(
            f"--out {folder}: already holds files; give a new or empty folder (the default makes a new "
            "runs/demo-<time>)"
        )
    files = {role: folder / name for role, name in FILES.items()}
    t0 = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    say(f"1/3 measuring this machine (bench --quick, {ranks} ranks for the collectives)")
    measured = bench(out=files["calibration"], ranks=ranks, quick=True, progress=progress)
    t1 = time.perf_counter()
    say(f"2/3 searching every layout of {model} on {ranks} CPU ranks with those measurements")
    found = search(
        model=model,
        cluster="local-cpu",
        gpus=ranks,
        global_batch=global_batch,
        dtype="float32",
        runtime="exatrain",
        top=3,
        calibration=files["calibration"],
        out=files["plan"],
    )
    t2 = time.perf_counter()
    say(f"3/3 training the best layout for {steps} steps")
    trained = train(
        plan=files["plan"],
        steps=steps,
        calibration=files["calibration"],
        metrics_file=files["metrics"],
        quiet=quiet,
        warn=warn,
        progress=progress,
    )
    t3 = time.perf_counter()
    result = DemoResult(
        out=folder,
        ranks=ranks,
        bench=measured,
        search=found,
        train=trained,
        files=files,
        seconds={"bench": t1 - t0, "search": t2 - t1, "train": t3 - t2, "total": t3 - t0},
    )
    files["summary"].write_text("\n".join(result.summary_lines()) + "\n", encoding="utf-8")
    return result


__all__ = [
    "DEMO_GLOBAL_BATCH",
    "DEMO_MODEL",
    "DEMO_STEPS",
    "DemoResult",
    "default_out",
    "default_ranks",
    "demo",
    "usable_cores",
]
