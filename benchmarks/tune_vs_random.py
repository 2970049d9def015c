"""How many trials does each tuning strategy need to find the best layout? Replayed on a measured table.

1. The table: every memory-feasible layout `search` finds for gpt-tiny on 4 CPU ranks (global batch 8),
   each trained --steps steps by the real trainer (gloo, OMP_NUM_THREADS=1 per rank) and measured as the
   trainer's RunRecord does (median tokens/s after 2 warm-up steps); the 16 fastest are measured a second
   time to estimate run-to-run noise. Cached in benchmarks/data/; --measure measures again.
2. The replay, over --seeds seeds, counting runs (a plan the trainer refuses costs no run, for every
   strategy) until the best layout of the table has run, and until one within 10% of it has (runs on this
   shared machine repeat only to about 20%, so "the best" is partly luck and 10% is as close as it resolves):
   * cost-model tuning: exatrain's tuner itself (`exatrain.tuning.study.tune`, in-memory study) with a
     runner that answers from the table - seeds, GP-UCB prior and hopeless-run pruning included; its
     early stop is switched off for the counts and reported apart (where it stops, with what best);
     deterministic on a noise-free table, so it is also replayed with every run's value drawn with the
     measured noise (a fresh draw per seed);
   * random search: the table's layouts in a random order;
   * plain Optuna: TPE (optuna defaults) over the structured parameters (tp, pp, micro-batch, ZeRO,
     recompute, SP, schedule with its interleave), no cost model; equivalent spellings mapped to one layout,
     combinations that are still no feasible layout and repeats of a measured layout answered without a
     run; at most 5,000 asks.

    python benchmarks/tune_vs_random.py [--measure] [--steps 6] [--seeds 20]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the replays' small GP fits: threads only contend here

import argparse
import dataclasses
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import optuna

from exatrain.catalog import get_cluster, get_model
from exatrain.plan import Measured, Plan
from exatrain.planner.search.search import search
from exatrain.tuning.study import Problem, StudyFiles, TuneSettings, tune
from exatrain.tuning.runner import RunOutcome
from exatrain.tuning.sampler import Candidates, GPSettings, layout_key, plan_params

MODEL, GPUS, GLOBAL_BATCH = "gpt-tiny", 4, 8
TABLE = Path(__file__).parent / "data" / "tune_table_gpt-tiny_4cpu_gb8.json"
CHUNK = 12  # layouts trained one after another in one set of rank processes


def candidates() -> Candidates:
    result = search(get_model(MODEL), get_cluster("local-cpu"), GPUS, GLOBAL_BATCH, top=100_000, dtype="float32")
    return Candidates.from_plans(result.ranked, gpus=GPUS, global_batch=GLOBAL_BATCH)


# ---- 1. measure ----------------------------------------------------------------------------------
def measure(plans: list[Plan], steps: int, tmp: Path) -> dict[str, dict]:
    """key -> {"status", "tokens_per_s", "step_time_s", "error"} from real runs of ``plans``."""
    from exatrain.errors import RunFailed, UserError
    from exatrain.trainer.config import TrainConfig
    from exatrain.trainer.spawn import launch_local

    out: dict[str, dict] = {}
    configs = []
    for p in plans:
        key = layout_key(plan_params(p))
        try:
            configs.append(
                (key, TrainConfig(plan=p, steps=steps, metrics_file=str(tmp / f"{key}.jsonl"), quiet=True).check())
            )
        except UserError as exc:  # what `exatrain train` refuses with exit 2
            out[key] = {"status": "rejected", "error": str(exc)}
    for start in range(0, len(configs), CHUNK):
        chunk = configs[start : start + CHUNK]
        try:
            launch_local([c for _, c in chunk], stall_s=120)
        except RunFailed:  # one layout failed: run them one by one to see which
            for key, c in chunk:
                Path(c.metrics_file).unlink(missing_ok=True)
                try:
                    launch_local([c], stall_s=240)
                except RunFailed as exc:
                    out[key] = {"status": "failed", "error": str(exc).strip().splitlines()[-1][:200]}
        for key, c in chunk:
            if key in out:
                continue
            lines = [json.loads(x) for x in Path(c.metrics_file).read_text().splitlines()]
            m = Measured.from_dict(next(x for x in lines if x["kind"] == "run_record")["measured"])
            out[key] = {"status": "ok", "tokens_per_s": m.tokens_per_s, "step_time_s": m.step_time_s}
            Path(c.metrics_file).unlink()
        done = start + len(chunk)
        print(f"measured {done}/{len(configs)} layouts", file=sys.stderr, flush=True)
    return out


def build_table(steps: int) -> dict:
    import torch

    cands = candidates()
    t0 = time.time()
    # Measured in a shuffled order, so that a shared machine's changing load is not correlated with
    # the cost model's ranking (the candidates come best predicted first).
    order = [cands.plans[i] for i in np.random.default_rng(0).permutation(len(cands))]
    with tempfile.TemporaryDirectory() as tmp:
        runs = measure(order, steps, Path(tmp))
        fastest = sorted((k for k in runs if runs[k]["status"] == "ok"), key=lambda k: -runs[k]["tokens_per_s"])[:16]
        again = measure([cands.plans[cands.index[k]] for k in fastest], steps, Path(tmp))
    layouts = [
        {"key": k, "predicted_tokens_per_s": float(cands.predicted[i]), **runs[k]} for i, k in enumerate(cands.keys)
    ]
    return {
        "meta": {
            "model": MODEL,
            "gpus": GPUS,
            "global_batch": GLOBAL_BATCH,
            "steps": steps,
            "dtype": "float32",
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": "2-core CPU sandbox",
            "torch": torch.__version__,
            "python": platform.python_version(),
            "wall_s": round(time.time() - t0),
        },
        "layouts": layouts,
        "repeats": {k: [runs[k]["tokens_per_s"], again[k].get("tokens_per_s")] for k in fastest},
    }


# ---- 2. replay -----------------------------------------------------------------------------------
BUDGETS = (10, 20)  # runs after which the best layout found so far is reported


@dataclasses.dataclass(frozen=True)
class Replay:
    to_best: int | None  # runs until the table's best layout ran (None: never)
    to_near: int | None  # runs until a layout within 10% of it ran
    best_within: tuple[float, ...]  # after each of BUDGETS runs: best layout run so far / the best


class Found(Exception):
    """The replay has what it counts: stop the tuner."""


class Tracker:
    """Counts runs (a refused plan is no run, for every strategy) and what they found."""

    def __init__(self, table: dict[str, dict], best: str, near: set[str]) -> None:
        self.table, self.best, self.near = table, best, near
        self.runs, self.to_best, self.to_near, self.seen = 0, None, None, 0.0
        self.within = [0.0] * len(BUDGETS)

    def ran(self, key: str) -> None:
        self.runs += 1
        self.seen = max(self.seen, self.table[key].get("tokens_per_s") or 0.0)
        for j, b in enumerate(BUDGETS):
            if self.runs <= b:
                self.within[j] = self.seen / self.table[self.best]["tokens_per_s"]
        if key == self.best and self.to_best is None:
            self.to_best = self.runs
        if key in self.near and self.to_near is None:
            self.to_near = self.runs

    @property
    def done(self) -> bool:  # nothing left to learn: the best has run (so has a near one)
        return self.to_best is not None

    def result(self) -> Replay:
        return Replay(self.to_best, self.to_near, tuple(self.within))


class TableRunner:
    """Answers the tuner's runs from the table (each value drawn with noise when noise > 0)."""

    def __init__(self, tracker: Tracker, noise: float, rng, stop_when_found: bool = True) -> None:
        self.tracker, self.noise, self.rng, self.stop_when_found = tracker, noise, rng, stop_when_found

    def run(self, plan: Plan, trial_dir: Path, *, should_stop, on_start) -> RunOutcome:
        key = layout_key(plan_params(plan))
        row = self.tracker.table[key]
        if row["status"] == "rejected":
            return RunOutcome("rejected", None, None, row.get("error", ""), 2)
        self.tracker.ran(key)
        if self.stop_when_found and self.tracker.done:
            raise Found
        if row["status"] != "ok":
            return RunOutcome(row["status"], None, None, row.get("error", ""), 1)
        v = row["tokens_per_s"] * (math.exp(self.rng.normal(0, self.noise)) if self.noise else 1.0)
        stop = [should_stop(step, v) for step in (3, 4)][-1]  # the steps after warm-up, as the runner reports
        return RunOutcome("pruned" if stop else "ok", Measured(steps=6, step_time_s=1.0, tokens_per_s=v), None, "", 0)


def _run_tuner(cands: Candidates, runner: TableRunner, settings: TuneSettings) -> None:
    problem = Problem(get_model(MODEL), "local-cpu", GPUS, GLOBAL_BATCH, "cpu", "float32", True)
    with tempfile.TemporaryDirectory() as tmp:
        files = StudyFiles(Path(tmp) / "trials", Path(tmp) / "runs.jsonl")
        try:
            tune(problem, cands, runner, files, optuna.storages.InMemoryStorage(), settings)
        except Found:
            pass


def replay_tuner(cands: Candidates, table, best, near, noise: float, seed: int) -> Replay:
    """The tuner with its early stop switched off (see replay_tuner_stop for where it would stop)."""
    tracker = Tracker(table, best, near)
    never_stop = TuneSettings(trials=len(cands), gp=dataclasses.replace(GPSettings(), stop_kappa=math.inf))
    _run_tuner(cands, TableRunner(tracker, noise, np.random.default_rng(seed)), never_stop)
    return tracker.result()


def replay_tuner_stop(cands: Candidates, table, best, near, noise: float, seed: int) -> tuple[int, float]:
    """The tuner with its defaults: after how many runs does it stop by itself, with what best?"""
    tracker = Tracker(table, best, near)
    _run_tuner(
        cands,
        TableRunner(tracker, noise, np.random.default_rng(seed), stop_when_found=False),
        TuneSettings(trials=len(cands)),
    )
    return tracker.runs, tracker.seen / table[best]["tokens_per_s"]


def replay_random(table, best, near, seed: int) -> Replay:
    tracker = Tracker(table, best, near)
    for key in np.random.default_rng(seed).permutation(sorted(table)):
        if table[key]["status"] != "rejected":
            tracker.ran(str(key))
        if tracker.done and tracker.to_near is not None and tracker.runs >= max(BUDGETS):
            break
    return tracker.result()


def replay_tpe(cands: Candidates, table, best, near, seed: int, max_asks: int = 5_000) -> Replay:
    """TPE over the structured parameters, as an Optuna user would write it: tp, pp, micro-batch, ZeRO,
    recompute, SP and schedule (with its interleave) as categoricals, equivalent spellings mapped to one
    layout (no schedule without a pipeline, no SP without tp, no ZeRO without dp - as search collapses
    them); a combination that is still no feasible layout, a refused one or a repeat is answered without a
    run (pruned: TPE learns to avoid it)."""
    params = [cands.params(i) for i in range(len(cands))]
    values = {
        name: sorted({p[name] for p in params}, key=str)
        for name in ("tp", "pp", "micro_batch", "zero_stage", "recompute", "sequence_parallel")
    }
    values["schedule"] = sorted({f"{p['schedule']}:{p['interleave']}" for p in params})
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    tracker = Tracker(table, best, near)
    seen: dict[str, float | None] = {}
    for _ in range(max_asks):
        trial = study.ask()
        p = {name: trial.suggest_categorical(name, choices) for name, choices in values.items()}
        sched, v = p.pop("schedule").split(":")
        p.update(schedule=sched, interleave=int(v))
        dp = GPUS // (p["tp"] * p["pp"]) if GPUS % (p["tp"] * p["pp"]) == 0 else 0
        if p["pp"] == 1:
            p.update(schedule="1f1b", interleave=1)
        if p["tp"] == 1:
            p["sequence_parallel"] = False
        if dp == 1:
            p["zero_stage"] = 0
        key = layout_key(p)
        row = table.get(key) if dp and key in cands.index else None
        if row is None or row["status"] == "rejected":
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        if key not in seen:
            tracker.ran(key)
            seen[key] = row.get("tokens_per_s")
        if seen[key] is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, seen[key])
        if tracker.done and tracker.to_near is not None and tracker.runs >= max(BUDGETS):
            break
    return tracker.result()


def summary(xs: list[int | None]) -> str:
    found = [x for x in xs if x is not None]
    if not found:
        return f"never (of {len(xs)})"
    s = f"median {statistics.median(found):g}, mean {statistics.mean(found):.1f}, range {min(found)}–{max(found)}"
    return s + (f"; not found: {len(xs) - len(found)}" if len(found) < len(xs) else "")


def quality(res: list[Replay]) -> str:
    parts = []
    for j, b in enumerate(BUDGETS):
        w = [r.best_within[j] for r in res]
        parts.append(f"after {b}: median {statistics.median(w):.0%}, worst {min(w):.0%}")
    return "; ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", action="store_true", help="measure the table again (about an hour here)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if args.measure or not TABLE.exists():
        TABLE.parent.mkdir(parents=True, exist_ok=True)
        TABLE.write_text(json.dumps(build_table(args.steps), indent=1) + "\n")
    data = json.loads(TABLE.read_text())
    table = {row["key"]: row for row in data["layouts"]}
    cands = candidates()
    missing = [k for k in cands.keys if k not in table]
    if missing:
        sys.exit(f"{TABLE} lacks {len(missing)} layouts of today's search (e.g. {missing[0]}): rerun with --measure")
    ok = {k: r["tokens_per_s"] for k, r in table.items() if r["status"] == "ok"}
    best = max(ok, key=ok.get)
    near = {k for k, v in ok.items() if v >= 0.90 * ok[best]}
    reps = [math.log(b / a) for a, b in data["repeats"].values() if a and b]
    noise = statistics.pstdev(reps) / math.sqrt(2) if len(reps) > 1 else 0.1
    rank_pred = sorted(ok, key=lambda k: -table[k]["predicted_tokens_per_s"]).index(best) + 1
    statuses = {s: sum(r["status"] == s for r in table.values()) for s in ("ok", "rejected", "failed")}
    print(
        f"table: {len(table)} layouts of {MODEL} on {GPUS} CPU ranks, global batch {GLOBAL_BATCH}, "
        f"{data['meta']['steps']} steps each ({data['meta']['date']}): {statuses}"
    )
    print(
        f"best measured: {best} at {ok[best]:,.0f} tokens/s (the cost model ranks it #{rank_pred} of "
        f"{len(ok)}); {len(near)} layouts within 10%; run-to-run noise {noise:.1%} (16 layouts measured twice)"
    )
    seeds = range(args.seeds)
    rows = {
        "cost-model tuning, noise-free table": [replay_tuner(cands, table, best, near, 0.0, 0)],
        f"cost-model tuning, runs with {noise:.0%} noise": [
            replay_tuner(cands, table, best, near, noise, s) for s in seeds
        ],
        "random search": [replay_random(table, best, near, s) for s in seeds],
        "plain Optuna (TPE, no cost model)": [replay_tpe(cands, table, best, near, s) for s in seeds],
    }
    n = sum(r["status"] != "rejected" for r in table.values())
    print(
        f"\nruns until the best layout has run ({n} runnable layouts; {args.seeds} seeds, the noise-free "
        "replay is deterministic):"
    )
    for name, res in rows.items():
        print(f"  {name:42s} {summary([r.to_best for r in res])}")
    print("runs until a layout within 10% of the best has run:")
    for name, res in rows.items():
        print(f"  {name:42s} {summary([r.to_near for r in res])}")
    print("best layout run after a budget of runs, as a share of the best layout's throughput:")
    for name, res in rows.items():
        print(f"  {name:42s} {quality(res)}")
    stops = [replay_tuner_stop(cands, table, best, near, 0.0, 0)]
    noisy = [replay_tuner_stop(cands, table, best, near, noise, s) for s in seeds]
    print(
        f"the tuner's own early stop (defaults): noise-free after {stops[0][0]} runs with {stops[0][1]:.0%} of "
        f"the best; with noise after median {statistics.median(r for r, _ in noisy):g} runs "
        f"(range {min(r for r, _ in noisy)}–{max(r for r, _ in noisy)}), its best median "
        f"{statistics.median(q for _, q in noisy):.0%}, worst {min(q for _, q in noisy):.0%} of the best"
    )


if __name__ == "__main__":
    main()
