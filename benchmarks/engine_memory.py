"""Predicted per-GPU memory under each engine profile vs what published runs measured.

Reads benchmarks/data/published_runs_by_engine.csv, keeps the rows that state a measured memory per
GPU, and plans each exactly as benchmarks/prediction_error.py does (``load_rows``: the row's dtype, its
gradient-accumulation dtype, FP8 recipe, context and expert parallelism, loss, compile and MoE routing,
as a user would plan it with flags). It prints, for every engine profile (accounting.engines), the
worst pipeline stage's predicted memory through the planner's evaluation path
(``planner.memory_advice.worst_stage``, the memory ``estimate`` gives) and its error against the
measurement; then the median and maximum absolute error per profile, over all rows and over the
rows each profile's own engine ran (its "own rows", the figure docs/accuracy.md states).

Memory has no fitted factor (nothing in accounting.memory or accounting.engines takes a number from
these rows). Some mechanisms were found by looking into a row's miss, their values then taken from the
engine's code (``FOUND_ON``): those rows are not an independent check of that mechanism, so each
profile's own rows are also summarised without them ("check rows"). A row measured as torch's max
*allocated* memory is compared with the prediction before the allocator allowance, a *reserved* one
with the prediction including it; a row that states both (Megatron's memory line) is compared on each.
A profile that cannot plan a row (a ZeRO stage or gradient dtype it lacks) prints n/a.

    python benchmarks/engine_memory.py [--csv PATH]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import prediction_error as pe  # noqa: E402

from exatrain.accounting.engines import get_engine  # noqa: E402
from exatrain.errors import UserError  # noqa: E402
from exatrain.planner.memory_advice import worst_stage  # noqa: E402
from exatrain.settings import RUNTIMES  # noqa: E402

GIB = 2.0**30
PROFILES = RUNTIMES
# Rows (index into the csv) whose miss led to a memory mechanism, and which (module doc).
_LUMI = "DeepSpeed's type:transformer stage split (the stage_layers column) and the embedding-dropout masks"
FOUND_ON: dict[int, str] = {
    56: "the first stage's embedding-dropout masks (accounting.memory.EMBEDDING_DROPOUT_ENGINES)",
    **{i: _LUMI for i in range(234, 239)},
}


def predicted_gib(row: "pe.Row", profile: str, allocated: bool | None = None) -> float | None:
    """The row's worst stage in GiB as ``profile`` runs its plan (without the allocator allowance where the figure
    compared, ``allocated``, default the row's own, is allocated bytes); None where the profile cannot run it."""
    try:
        plan = row.plan if profile == row.runtime else row.plan.replace(runtime=profile).validate()
        _, worst = worst_stage(plan, row.cluster)
    except (UserError, ValueError):
        return None
    allowance = get_engine(profile).allocator_allowance
    allocated = row.memory_allocated if allocated is None else allocated
    return (worst.total / (1 + allowance) if allocated else worst.total) / GIB


def figures(row: "pe.Row") -> list[tuple[float, bool]]:
    """The row's measured peaks, (GiB, allocated?): its own, and the max reserved it states beside max allocated."""
    return [(row.memory_gib, row.memory_allocated)] + (
        [(row.memory_reserved_gib, False)] if row.memory_reserved_gib is not None else []
    )


def line(name: str, errs: list[float]) -> str:
    """One summary line: n, median and max of |error|."""
    if not errs:
        return f"{name:42} n= 0"
    a = np.abs(np.array(errs))
    return f"{name:42} n={a.size:2d}  median {np.median(a):6.1%}  max {a.max():6.1%}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=pe.CSV_PATH)
    args = ap.parse_args(argv)
    if not args.csv.is_file():
        print(f"{args.csv}: no such file", file=sys.stderr)
        return 2
    rows = [r for r in pe.load_rows(args.csv) if r.memory_gib is not None and r.plan is not None]
    errors: dict[str, list[float]] = {p: [] for p in PROFILES}
    own: dict[str, list[float]] = {p: [] for p in PROFILES}
    check: dict[str, list[float]] = {p: [] for p in PROFILES}
    by_kind: dict[str, list[float]] = {}
    head = " ".join(f"{p[:18]:>18}" for p in PROFILES)
    print(f"{'row':>3} {'run':52} {'engine':18} {'measured':>9} {head}  notes")
    for r, (measured, allocated) in ((r, f) for r in rows for f in figures(r)):
        cells = []
        for p in PROFILES:
            got = predicted_gib(r, p, allocated)
            if got is None:
                cells.append(f"{'n/a':>18}")
                continue
            err = got / measured - 1
            errors[p].append(err)
            if p == r.runtime:
                own[p].append(err)
                by_kind.setdefault(f"{p}, {r.kind}", []).append(err)
                if r.index not in FOUND_ON:
                    check[p].append(err)
            cells.append(f"{got:9.1f} {err:+7.1%} ")
        kind = "alloc" if allocated else "resv"
        notes = "; ".join(r.notes + ([f"found on it: {FOUND_ON[r.index]}"] if r.index in FOUND_ON else []))
        print(f"{r.index:3d} {r.name[:52]:52} {r.engine:18} {measured:6.1f}{kind:>5} {' '.join(cells)}  {notes}")
    print("\n|predicted / measured - 1| of the memory per GPU")
    for p in PROFILES:
        print(line(f"{p}: every row it can plan", errors[p]))
    for p in PROFILES:
        print(line(f"{p}: its own engine's rows", own[p]))
    for p in PROFILES:
        print(line(f"{p}: own check rows", check[p]))
    for k in sorted(by_kind):
        print(line(f"{k}: own rows", by_kind[k]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
