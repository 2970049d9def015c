"""`exatrain tune`: Bayesian optimisation of the layout over short real runs (exatrain.tune).

Flags map onto typed config here and nowhere else: the model/cluster/layout flags as in `search`
(layout flags pin a dimension), the study (an Optuna storage URL; a plain path means SQLite), the
runs (steps, per-trial timeout, a launcher template) and the budget (trials, time).
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
from pathlib import Path

from exatrain.cli.common import (add_cluster_args, add_layout_args, add_model_args, make_console, nonneg_int,
                                 positive_int, print_json, resolve_cluster, resolve_model)
from exatrain.errors import UserError

DEFAULT_STUDY = "sqlite:///tune.db"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune", help="find the fastest layout by short real runs (Bayesian optimisation)",
        description="Tune the layout on the real machine: every memory-feasible layout `search` finds is a "
                    "candidate; the cost model's best predictions run first and its ranking is the prior of "
                    "a Bayesian optimiser (Optuna study in SQLite: it survives a crash and resumes). Each "
                    "trial trains a few steps and measures tokens/s after warm-up; out-of-memory, hangs and "
                    "crashes are failed trials, hopeless runs are stopped early. --trials is the study's "
                    "total, so a rerun with a larger number adds trials.",
        epilog="example: exatrain tune --model gpt-1.4b --cluster frontier --gpus 32 --global-batch 320 "
               "--trials 20 --time-budget 2h --study sqlite:///tune.db "
               "--launcher 'srun -N4 --ntasks-per-node 8 {cmd}'")
    add_model_args(p)
    add_cluster_args(p, default="local-cpu")
    add_layout_args(p)
    g = p.add_argument_group("tuning")
    g.add_argument("--trials", type=positive_int, default=20, help="finished runs the study holds in total "
                   "(default 20)")
    g.add_argument("--time-budget", metavar="DURATION", default=None,
                   help="start no trial after this long, e.g. 2h, 90m, 1h30m, 600 (seconds)")
    g.add_argument("--study", metavar="URL", default=DEFAULT_STUDY,
                   help=f"Optuna storage URL or a SQLite file path (default {DEFAULT_STUDY})")
    g.add_argument("--study-name", default=None, help="default: derived from the model, cluster, gpus, batch")
    g.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="default: cuda for a GPU cluster, cpu for local-cpu")
    g.add_argument("--steps", type=positive_int, default=8,
                   help="optimizer steps per trial, at least 3: the first 2 are warm-up (default 8)")
    g.add_argument("--seed", type=nonneg_int, default=0, help="the runs' weights and data order (default 0)")
    g.add_argument("--trial-timeout", metavar="DURATION", default="15m",
                   help="a run still going after this is a hang: killed, a failed trial (default 15m)")
    g.add_argument("--launcher", metavar="TEMPLATE", default=None,
                   help="start each run through this command, {cmd} = `python -m exatrain.train ...`, "
                        "e.g. 'srun -N4 --ntasks-per-node 8 {cmd}' (default: local ranks)")
    g.add_argument("--candidates", type=positive_int, default=256,
                   help="tune over the N best predicted feasible layouts (default 256)")
    g.add_argument("--seed-trials", type=int, default=2,
                   help="first trials: the best predicted layout of each of the N best tp x pp meshes (default 2)")
    g.add_argument("--prune-ratio", type=float, default=0.5,
                   help="stop a run below this x the best run after warm-up; 0 = never (default 0.5)")
    g.add_argument("--calibration", metavar="PATH", help="cost-model parameters (see estimate --help)")
    g.add_argument("--out", metavar="PATH", default=None, help="the best plan as JSON (default: beside the study)")
    g.add_argument("--runs-file", metavar="PATH", default=None,
                   help="append a RunRecord per finished run (default: beside the study)")
    g.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_tune)


def parse_duration(text: str, flag: str) -> float:
    """'2h', '90m', '1h30m', '45s', '600' -> seconds (> 0)."""
    t = text.strip().lower()
    m = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?", t)
    if not t or m is None or not any(m.groups()):
        raise UserError(f"{flag} {text!r} is not a duration: write e.g. 2h, 90m, 1h30m or 600 (seconds)")
    h, mi, s = (float(x) if x else 0.0 for x in m.groups())
    seconds = 3600 * h + 60 * mi + s
    if seconds <= 0:
        raise UserError(f"{flag} {text!r} must be longer than zero")
    return seconds


def study_url(text: str) -> str:
    """A URL as given; a plain path is a SQLite file."""
    return text if "://" in text else f"sqlite:///{Path(text).expanduser()}"


def _beside(url: str) -> Path:
    """The stem that default files get: tune.db -> tune (.runs.jsonl, .trials/, .best.json)."""
    if url.startswith("sqlite:///") and url[len("sqlite:///"):] not in ("", ":memory:"):
        path = Path(url[len("sqlite:///"):])
        return path.with_suffix("") if path.suffix else path
    return Path("exatrain-tune")


def cmd_tune(args: argparse.Namespace) -> int:
    from exatrain.cli.planner_cmds import _no_feasible, _space_options, calibrated

    if args.gpus is None or args.global_batch is None:
        raise UserError("tune needs --gpus (ranks) and --global-batch")
    if args.steps < 3:
        raise UserError(f"--steps {args.steps}: a trial needs at least 3 steps (the first 2 are warm-up)")
    if not 0 <= args.prune_ratio < 1:
        raise UserError(f"--prune-ratio must be in [0, 1), got {args.prune_ratio}")
    if args.seed_trials < 0:
        raise UserError(f"--seed-trials must be >= 0, got {args.seed_trials}")
    budget = None if args.time_budget is None else parse_duration(args.time_budget, "--time-budget")
    trial_timeout = parse_duration(args.trial_timeout, "--trial-timeout")
    from exatrain.tune.runner import SubprocessRunner, check_launcher

    launcher = check_launcher(args.launcher)
    options = _space_options(args)
    model = resolve_model(args)
    cluster, params = calibrated(args, resolve_cluster(args))
    device = args.device or ("cpu" if cluster.device.name == "cpu" else "cuda")
    dtype = args.dtype or ("float32" if device == "cpu" else "bfloat16")
    flash = True if args.flash_attention is None else args.flash_attention
    url = study_url(args.study)

    from exatrain.planner.search.search import search
    from exatrain.tune.study import Problem, StudyFiles, TuneSettings, open_storage, tune
    from exatrain.tune.sampler import Candidates

    result = search(model, cluster, args.gpus, args.global_batch, top=args.candidates, options=options,
                    params=params, dtype=dtype, flash=flash, runtime="exatrain")
    if not result.ranked:
        raise _no_feasible(result, args.gpus, cluster)
    cands = Candidates.from_plans(result.ranked, gpus=args.gpus, global_batch=args.global_batch)
    problem = Problem(model, cluster.name, args.gpus, args.global_batch, device, dtype, flash, options)
    settings = TuneSettings(trials=args.trials, time_budget_s=budget, seed_trials=args.seed_trials,
                            prune_ratio=args.prune_ratio)
    storage = open_storage(url, settings)
    name = args.study_name or problem.study_name()
    stem = _beside(url)
    files = StudyFiles(trials_dir=Path(f"{stem}.trials") / name,
                       runs_file=Path(args.runs_file) if args.runs_file else Path(f"{stem}.runs.jsonl"))
    runner = SubprocessRunner(steps=args.steps, seed=args.seed, device=device, timeout_s=trial_timeout,
                              launcher=launcher)
    err = make_console(stderr=True)
    # SIGTERM (e.g. SLURM's time limit) ends the tuner like Ctrl-C: the running trial's ranks are ended
    # and its layout queued again, instead of leaving them for the next run to clean up.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        out = tune(problem, cands, runner, files, storage, settings, study_name=name,
                   progress=lambda v: err.print(f"trial {v.number}: {_describe(v)}", markup=False, highlight=False))
    finally:
        signal.signal(signal.SIGTERM, previous)
    best_path = Path(args.out) if args.out else Path(f"{stem}.best.json")
    if out.best is not None:
        out.best.plan.save(best_path)
    if args.json:
        print_json({**out.to_dict(), "storage": url, "runs_file": str(files.runs_file),
                    "best_file": str(best_path) if out.best else None})
    else:
        _print_table(out, url, files, best_path)
    if out.best is None:
        sys.stderr.write(f"exatrain tune: no run succeeded ({out.finished} finished); see the trials' "
                         f"errors and {files.trials_dir}\n")
        return 1
    return 0


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _layout(p) -> str:
    sched = "" if p.pp == 1 else " " + p.schedule + (f"×{p.interleave}" if p.interleave > 1 else "")
    return (f"tp{p.tp}·pp{p.pp}·dp{p.dp} mb{p.micro_batch} ZeRO-{p.zero_stage} {p.recompute}"
            f"{' SP' if p.sequence_parallel else ''}{sched}")


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _describe(v) -> str:
    line = f"{_layout(v.plan)} [{v.source or 'sampler'}]: {v.status}"
    if v.measured_tokens_per_s is not None:
        line += f", {_num(v.measured_tokens_per_s)} tokens/s"
    line += f" (predicted {_num(v.predicted_tokens_per_s)})"
    if v.duration_s is not None:
        line += f", {v.duration_s:.0f} s"
    return line + (f" — {v.error}" if v.error and v.status != "ok" else "")


def _print_table(out, url: str, files, best_path: Path) -> None:
    from rich.table import Table

    con = make_console()
    t = Table(title=f"study {out.study_name} ({url}): {out.finished} finished runs, {out.candidates} candidates")
    for col in ("#", "trial", "layout", "predicted tok/s", "measured tok/s", "status", "note"):
        t.add_column(col, justify="left" if col in ("layout", "status", "note") else "right")
    for rank, v in enumerate(out.trials, 1):
        t.add_row(str(rank), str(v.number), _layout(v.plan), _num(v.predicted_tokens_per_s),
                  _num(v.measured_tokens_per_s), v.status, v.error[:80] if v.status != "ok" else v.source)
    con.print(t)
    con.print(f"stopped: {out.stopped}; {out.ran} run(s) this time. Runs file: {files.runs_file}")
    if out.best is not None:
        b = out.best
        con.print(f"best: trial {b.number}, {_layout(b.plan)}: {_num(b.measured_tokens_per_s)} tokens/s "
                  f"(predicted {_num(b.predicted_tokens_per_s)}); plan saved to {best_path}")


__all__ = ["parse_duration", "register", "study_url"]
