"""Tune: Bayesian optimisation of the layout over short real training runs, seeded by the cost model.

The Frontier study tuned TP, PP and micro-batch with DeepHyper (Bayesian optimisation, UCB) on the
measured throughput of short runs (Dash et al. 2023, arXiv 2312.12705, Sec. IV). This module does the
same over every memory-feasible layout ``search`` finds, with the cost model doing three jobs:

1. **Seeds.** A new study enqueues the best predicted layout of each of the best predicted (tp, pp)
   meshes (``TuneSettings.seed_trials``) as its first trials.
2. **Prior.** The sampler (``sampler.CostModelSampler``) models measured throughput as the
   prediction times a Gaussian-process correction learned from the runs so far, and runs the untried
   layout with the largest upper confidence bound next; layouts whose bound is below the best run are
   hopeless and never run (the study stops when only those are left).
3. **Pruning.** A run whose post-warm-up throughput is below ``prune_ratio`` x the best run is
   stopped (Optuna pruner, fed each step the trainer writes) and recorded as pruned.

The study lives in Optuna's RDB storage (SQLite by default), so it survives a crash: the storage's
heartbeat marks a trial whose tuner died as failed (at once when that tuner ran on this host and its
process is gone, else after the grace period); its leftover ranks are ended and its layout is queued
again. ``settings.trials`` is the study's total of finished runs, so a rerun with a larger number adds
runs, and a finished layout is never run twice. Every run's outcome (ok, pruned, oom, timeout,
failed) is a trial status and a RunRecord appended to the runs file, which ``exatrain calibrate``
reads like any other runs file. A plan the trainer refuses outright (exit 2 before any rank starts,
e.g. a combination it cannot run yet) is a "rejected" trial: never tried again, not counted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import signal
import socket
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from exatrain.catalog.models import ModelSpec
from exatrain.errors import UserError
from exatrain.plan import Plan, RunRecord
from exatrain.procs import pid_alive
from exatrain.records import append_run_record
from exatrain.planner.search.space import SpaceOptions
from exatrain.settings import SETTINGS
from exatrain.tuning.runner import RunOutcome, TrialRunner
from exatrain.tuning.sampler import (
    PARAM_NAMES,
    RUN_STATUSES,
    Candidates,
    CostModelSampler,
    GPSettings,
    HopelessPruner,
    layout_key,
    trial_key,
    trial_status,
)


@dataclass(frozen=True)
class TuneSettings:
    trials: int = 20  # finished runs the study should hold in total
    time_budget_s: float | None = None  # no trial starts after this much wall time (this invocation)
    seed_trials: int = 2  # best predicted layouts (of distinct tp x pp meshes) enqueued by a new study
    prune_ratio: float = 0.5  # stop a run below this x the best run after warm-up; 0 never prunes
    prune_min_steps: int = 2  # post-warm-up steps seen before a run may be pruned
    same_error_limit: int = 3  # stop when this many runs in a row fail with the same error
    heartbeat_s: int = 10
    grace_s: int = 60
    gp: GPSettings = GPSettings()


# The planner-only space fields (ep, cp and the run settings but the runtime, settings.SETTINGS) and the values a
# study made before they existed implicitly had.
_PLANNER_ONLY = {
    "ep": (None,),
    "cp": (None,),
    **{
        s.name: (s.default, list(s.default)) if isinstance(s.default, tuple) else (s.default,)
        for s in SETTINGS
        if s.name != "runtime"
    },
}


def _space_fields(options: SpaceOptions) -> dict[str, Any]:
    """The space's fields, its run settings flat among them, without the planner-only ones at their defaults, so a
    study started before they existed keeps its name and problem."""
    d = dataclasses.asdict(options)
    d.update({k: v for k, v in d.pop("settings").items() if k != "runtime"})
    for k, default in _PLANNER_ONLY.items():
        if d.get(k) in default:
            d.pop(k, None)
    return d


@dataclass(frozen=True)
class Problem:
    """What a study optimises; a study refuses to continue under a different one."""

    model: ModelSpec
    cluster: str
    gpus: int
    global_batch: int
    device: str
    dtype: str
    flash_attention: bool
    options: SpaceOptions = SpaceOptions()

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.to_dict(),
            "cluster": self.cluster,
            "gpus": self.gpus,
            "global_batch": self.global_batch,
            "device": self.device,
            "dtype": self.dtype,
            "flash_attention": self.flash_attention,
            "space": json.loads(json.dumps(_space_fields(self.options))),
        }

    def study_name(self) -> str:
        digest = hashlib.sha1(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:6]
        name = f"{self.model.name}_{self.gpus}x{self.cluster}_gb{self.global_batch}_{self.device}_{digest}"
        return re.sub(r"[^A-Za-z0-9._-]+", "-", name)


@dataclass(frozen=True)
class StudyFiles:
    trials_dir: Path  # one folder per trial: plan.json, metrics.jsonl, stdout/stderr, command
    runs_file: Path  # RunRecords of every finished run


@dataclass(frozen=True)
class TrialView:
    number: int
    plan: Plan  # with its estimate when the layout is still a candidate
    status: str
    predicted_tokens_per_s: float | None
    measured_tokens_per_s: float | None
    error: str = ""
    source: str = ""  # seed | sampler | retry
    duration_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "plan": self.plan.with_estimate(None).to_dict(),
            "status": self.status,
            "predicted_tokens_per_s": self.predicted_tokens_per_s,
            "measured_tokens_per_s": self.measured_tokens_per_s,
            "error": self.error,
            "source": self.source,
            "duration_s": self.duration_s,
        }


@dataclass(frozen=True)
class TuneResult:
    study_name: str
    trials: tuple[TrialView, ...]  # ranked: ok by measured throughput, then pruned, then the rest
    best: TrialView | None
    stopped: str  # why this invocation ended
    ran: int  # finished runs added by this invocation
    finished: int  # finished runs in the study
    candidates: int
    storage: str = ""  # the study's storage URL
    runs_file: str = ""  # where every finished run's RunRecord was appended
    trials_dir: str = ""  # one folder per trial
    best_file: str | None = None  # the best plan as JSON, when there is one

    def to_dict(self) -> dict[str, Any]:
        best = None
        if self.best is not None:
            best = {**self.best.to_dict(), "plan": self.best.plan.to_dict()}
        return {
            "study": self.study_name,
            "candidates": self.candidates,
            "finished": self.finished,
            "ran": self.ran,
            "stopped": self.stopped,
            "trials": [t.to_dict() for t in self.trials],
            "best": best,
            "storage": self.storage,
            "runs_file": self.runs_file,
            "best_file": self.best_file,
        }


class TrialFailed(Exception):
    """A run ended as oom, timeout or failed: the trial is FAIL, the tuner carries on."""


# ---- storage and study -------------------------------------------------------------------------
def open_storage(
    url: str,
    settings: TuneSettings = TuneSettings(),
    on_interrupted: Callable[[optuna.Study, FrozenTrial], None] | None = None,
) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage with heartbeats; an unusable URL is a UserError."""
    kwargs: dict[str, Any] = {"heartbeat_interval": settings.heartbeat_s, "grace_period": settings.grace_s}
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            warnings.simplefilter("ignore", FutureWarning)
            try:
                return optuna.storages.RDBStorage(
                    url, engine_kwargs=engine, **kwargs, heartbeat_stale_trial_callback=on_interrupted
                )
            except TypeError:  # optuna < 4.9 names the callback failed_trial_callback
                return optuna.storages.RDBStorage(
                    url, engine_kwargs=engine, **kwargs, failed_trial_callback=on_interrupted
                )
    except Exception as exc:  # sqlalchemy/driver errors of every kind: the URL is the problem
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"cannot open the study storage {url!r}: {first}") from None


class _Interrupted:
    """A trial whose tuner died or was stopped mid-run: end its leftover ranks (same host only, and
    only the run this trial started), then queue its layout again once."""

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        _end_leftovers(trial)
        self.requeue(study, trial.number, trial.params, trial.user_attrs)

    @staticmethod
    def requeue(study: optuna.Study, number: int, params: dict[str, Any], attrs: dict[str, Any]) -> None:
        if "retry_of" in attrs or not all(k in params for k in PARAM_NAMES):
            return  # a retry that was interrupted again is not retried a second time
        study.enqueue_trial(dict(params), user_attrs={"source": "retry", "retry_of": number})


def _end_leftovers(trial: FrozenTrial) -> None:
    attrs = trial.user_attrs
    pgid, plan_path = attrs.get("run_pgid"), str(Path(str(attrs.get("trial_dir", ""))) / "plan.json")
    if attrs.get("tuner_host") != socket.gethostname() or not pgid:
        return
    try:  # the group leader must still be this trial's run (pids are reused)
        cmdline = Path(f"/proc/{int(pgid)}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError):
        return
    if plan_path in cmdline:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(int(pgid), sig)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(1.0)


def _fail_abandoned(study: optuna.Study, storage: optuna.storages.BaseStorage, on_interrupted: _Interrupted) -> None:
    """Running trials whose tuner process on this host is gone are failed now, not after the grace."""
    host = socket.gethostname()
    study_id = storage.get_study_id_from_name(study.study_name)
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.user_attrs.get("tuner_host") != host or pid_alive(t.user_attrs.get("tuner_pid")):
            continue
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
        try:
            storage.set_trial_user_attr(trial_id, "status", "interrupted")
            if storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
                on_interrupted(study, storage.get_trial(trial_id))
        except UpdateFinishedTrialError:
            pass  # another process got there first


def load_study(
    problem: Problem,
    cands: Candidates,
    storage: optuna.storages.BaseStorage,
    settings: TuneSettings,
    study_name: str | None = None,
) -> optuna.Study:
    """Create or resume the study; a new one is seeded, an old one must be for the same problem."""
    name = study_name or problem.study_name()
    study = optuna.create_study(
        study_name=name,
        storage=storage,
        direction="maximize",
        load_if_exists=True,
        sampler=CostModelSampler(cands, settings.gp),
        pruner=HopelessPruner(settings.prune_ratio, settings.prune_min_steps),
    )
    wanted = json.loads(json.dumps(problem.to_dict()))
    have = study.user_attrs.get("problem")
    if have is None:
        study.set_user_attr("problem", wanted)
        for i in cands.seeds(min(settings.seed_trials, settings.trials)):
            study.enqueue_trial(cands.params(i), user_attrs={"source": "seed"}, skip_if_exists=True)
    elif have != wanted:
        diff = sorted(k for k in set(have) | set(wanted) if have.get(k) != wanted.get(k))
        raise UserError(
            f"study {name!r} was made for another problem (different {', '.join(diff)}); "
            "use another --study or --study-name, or the study's original flags"
        )
    return study


# ---- the loop ----------------------------------------------------------------------------------
def finished_runs(trials: list[FrozenTrial]) -> int:
    return sum(1 for t in trials if t.user_attrs.get("ran") and trial_status(t) in RUN_STATUSES)


def any_ok(study: optuna.Study) -> bool:
    return any(trial_status(t) == "ok" for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


class _Objective:
    """Optuna's objective: run the trial's layout once (a layout outside the candidates, or one that already ran,
    is pruned without a run), record what the run measured on the trial and in the runs file, and return its
    tokens per second."""

    def __init__(
        self,
        study: optuna.Study,
        problem: Problem,
        cands: Candidates,
        runner: TrialRunner,
        files: StudyFiles,
        interrupted: _Interrupted,
    ) -> None:
        self.study, self.problem, self.cands, self.runner, self.files = study, problem, cands, runner, files
        self.interrupted, self.host = interrupted, socket.gethostname()

    def __call__(self, trial: optuna.Trial) -> float:
        params = {}
        for name, dist in self.cands.distributions.items():
            if isinstance(dist, optuna.distributions.IntDistribution):
                params[name] = trial.suggest_int(name, dist.low, dist.high)
            else:
                params[name] = trial.suggest_categorical(name, dist.choices)  # type: ignore[attr-defined]
        i = self._candidate(trial, layout_key(params))
        plan = self.cands.plans[i]
        trial_dir = self.files.trials_dir / f"trial-{trial.number:04d}"
        for k, v in {
            "source": trial.user_attrs.get("source", "sampler"),
            "plan": plan.with_estimate(None).to_dict(),
            "predicted_tokens_per_s": float(self.cands.predicted[i]),
            "tuner_host": self.host,
            "tuner_pid": os.getpid(),
            "trial_dir": str(trial_dir.resolve()),
            "ran": True,
        }.items():
            trial.set_user_attr(k, v)
        outcome = self._run(trial, plan, trial_dir, params)
        return self._score(trial, plan, outcome)

    def _candidate(self, trial: optuna.Trial, key: str) -> int:
        """The candidate index of the trial's layout; TrialPruned for one that is not a candidate or already ran."""
        trial.set_user_attr("layout", key)
        i = self.cands.index.get(key)
        if i is None:  # a queued layout that no longer fits this problem's candidates: no run
            trial.set_user_attr("status", "infeasible")
            raise optuna.TrialPruned("not a feasible candidate")
        done = [
            t
            for t in self.study.get_trials(deepcopy=False)
            if t.number != trial.number and trial_key(t) == key and trial_status(t) in RUN_STATUSES
        ]
        if done:  # never run a finished layout twice
            trial.set_user_attr("status", "duplicate")
            trial.set_user_attr("same_as", done[0].number)
            raise optuna.TrialPruned(f"layout already ran in trial {done[0].number}")
        return i

    def _run(self, trial: optuna.Trial, plan: Plan, trial_dir: Path, params: dict[str, Any]) -> RunOutcome:
        """The run, reporting to the pruner at each step; on Ctrl-C or a bug the run is ended (runner) and its
        layout queued again."""

        def should_stop(step: int, tokens_per_s: float) -> bool:
            trial.report(tokens_per_s, step)
            return trial.should_prune()

        try:
            return self.runner.run(
                plan, trial_dir, should_stop=should_stop, on_start=lambda pid: trial.set_user_attr("run_pgid", pid)
            )
        except BaseException:
            trial.set_user_attr("status", "interrupted")
            self.interrupted.requeue(self.study, trial.number, params, trial.user_attrs)
            raise

    def _score(self, trial: optuna.Trial, plan: Plan, outcome: RunOutcome) -> float:
        """The outcome on the trial and in the runs file; the measured tokens/s, or TrialPruned / TrialFailed."""
        measured = outcome.measured.tokens_per_s if outcome.measured else None
        for k, v in {
            "status": outcome.status,
            "measured_tokens_per_s": measured,
            "error": outcome.error,
            "duration_s": round(outcome.duration_s, 3),
            "returncode": outcome.returncode,
        }.items():
            trial.set_user_attr(k, v)
        if outcome.status != "rejected":  # a refused plan never ran: nothing for calibration
            record = _record(outcome, plan, self.problem, self.study.study_name, trial.number)
            append_run_record(self.files.runs_file, record)
        if outcome.status == "ok":
            return float(measured)  # type: ignore[arg-type]
        if outcome.status == "pruned":
            raise optuna.TrialPruned(outcome.error)
        raise TrialFailed(f"{outcome.status}: {outcome.error}")


class _ErrorStreak:
    """The same error again and again means the environment is broken (no GPU, a bad launcher). Refusals count
    only until a run has worked: after that they are about the layouts (e.g. a schedule the trainer cannot
    combine with FSDP), not the machine."""

    def __init__(self) -> None:
        self.repeats, self.last_error = 0, ""

    def count(self, view: TrialView, study: optuna.Study) -> None:
        counted = ("oom", "timeout", "failed") + (() if any_ok(study) else ("rejected",))
        if view.status in counted:
            self.repeats = self.repeats + 1 if view.error == self.last_error else 1
            self.last_error = view.error
        elif view.status != "rejected":  # a later refusal neither breaks nor extends a streak
            self.repeats, self.last_error = 0, ""


def _stop_reason(study: optuna.Study, settings: TuneSettings, start: float, streak: _ErrorStreak) -> str:
    """Why the study stops now, or "": enough finished runs, the time budget spent, every candidate run, none
    left that could beat the best run, or the same error too many runs in a row (``start``: the study's start on
    the monotonic clock)."""
    sampler: CostModelSampler = study.sampler  # type: ignore[assignment]
    trials = study.get_trials(deepcopy=False)
    done = finished_runs(trials)
    queued = any(t.state == TrialState.WAITING for t in trials)
    choice = None if queued else sampler.next_choice(trials)
    if done >= settings.trials:
        return f"the study holds {done} finished runs (--trials {settings.trials})"
    if settings.time_budget_s is not None and time.monotonic() - start >= settings.time_budget_s:
        return f"time budget of {settings.time_budget_s:g} s spent"
    if choice is not None and choice.index is None:
        return "every candidate layout has run"
    if choice is not None and choice.hopeless:
        return "no untried layout can beat the best run, even optimistically"
    if streak.repeats >= settings.same_error_limit:
        return f"{streak.repeats} runs in a row failed with: {streak.last_error}"
    return ""


def tune(
    problem: Problem,
    cands: Candidates,
    runner: TrialRunner,
    files: StudyFiles,
    storage: optuna.storages.BaseStorage,
    settings: TuneSettings = TuneSettings(),
    *,
    study_name: str | None = None,
    progress: Callable[[TrialView], None] | None = None,
) -> TuneResult:
    """Run trials until the study holds ``settings.trials`` finished runs, the time budget is spent,
    or no untried layout could beat the best run; return every trial, ranked."""
    if len(cands) == 0:
        raise UserError("no feasible layout to tune")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    logging.getLogger("optuna").setLevel(logging.ERROR)
    study = load_study(problem, cands, storage, settings, study_name)
    interrupted = _Interrupted()
    _fail_abandoned(study, storage, interrupted)
    objective = _Objective(study, problem, cands, runner, files, interrupted)
    start, ran, streak = time.monotonic(), 0, _ErrorStreak()
    while True:
        stopped = _stop_reason(study, settings, start, streak)
        if stopped:
            break
        just_ran: list[FrozenTrial] = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            study.optimize(
                objective,
                n_trials=1,
                catch=(TrialFailed,),
                gc_after_trial=False,
                callbacks=[lambda _study, t: just_ran.append(t)],
            )
        for last in just_ran:
            if not last.user_attrs.get("ran"):
                continue
            view = _view(last, cands)
            ran += view.status in RUN_STATUSES
            if progress is not None:
                progress(view)
            streak.count(view, study)
    trials = study.get_trials(deepcopy=False)
    views = _ranked([_view(t, cands) for t in trials if t.user_attrs.get("ran")])
    best = next((v for v in views if v.status == "ok"), None)
    return TuneResult(study.study_name, tuple(views), best, stopped, ran, finished_runs(trials), len(cands))


def _record(outcome: RunOutcome, plan: Plan, problem: Problem, study: str, number: int) -> RunRecord:
    tag = {"tune_study": study, "tune_trial": number}
    if outcome.record is not None:
        rec = outcome.record
        return dataclasses.replace(
            rec, env={**rec.env, **tag}, plan=rec.plan if rec.plan.estimate is not None else plan
        )
    return RunRecord(
        plan=plan,
        measured=outcome.measured,
        status=outcome.status,
        device=problem.device,
        env={**tag, "returncode": outcome.returncode, "wall_s": round(outcome.duration_s, 3)},
        error=outcome.error,
    )


def _view(t: FrozenTrial, cands: Candidates) -> TrialView:
    a = t.user_attrs
    i = cands.index.get(str(a.get("layout")))
    plan = cands.plans[i] if i is not None else Plan.from_dict(a["plan"], source=f"trial {t.number}")
    measured = a.get("measured_tokens_per_s")
    return TrialView(
        t.number,
        plan,
        trial_status(t),
        a.get("predicted_tokens_per_s"),
        None if measured is None or not math.isfinite(measured) else float(measured),
        str(a.get("error") or ""),
        str(a.get("source", "")),
        a.get("duration_s"),
    )


def _ranked(views: list[TrialView]) -> list[TrialView]:
    order = {"ok": 0, "pruned": 1}
    return sorted(
        views,
        key=lambda v: (
            order.get(v.status, 2),
            -(v.measured_tokens_per_s or 0.0) if v.status in order else 0.0,
            v.number,
        ),
    )


__all__ = [
    "Problem",
    "TrialFailed",
    "StudyFiles",
    "TrialView",
    "TuneResult",
    "TuneSettings",
    "finished_runs",
    "load_study",
    "open_storage",
    "tune",
]
