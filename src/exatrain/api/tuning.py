"""``tune``: find the fastest layout by short real runs, the cost model's ranking as the prior.

Wires the parts: the candidates are what ``search`` finds feasible for this trainer
(``runtime="exatrain"``), the study lives in Optuna storage (a plain path is a SQLite file), each
trial is a ``python -m exatrain.train`` subprocess (``tune.runner``), and the trainer's torch-free
checks run before each trial (``training.check_cpu_memory``), so a layout it would refuse for
memory is an oom trial without a run.
"""

from __future__ import annotations

import dataclasses
import re
import signal
from pathlib import Path
from typing import Any

from exatrain.api.plans import calibrated, layout_values, resolve_cluster, resolve_model, space_options
from exatrain.api.requests import ClusterQuery, Engine, Layout, ModelQuery, TuneOptions, coerce, routed
from exatrain.catalog import ClusterSpec, ModelSpec
from exatrain.errors import UserError
from exatrain.paths import check_output_dir, check_output_file

DEFAULT_STUDY = "sqlite:///tune.db"
TUNE_CLUSTER = "local-cpu"


def parse_duration(text: str | float | int, flag: str) -> float:
    """'2h', '90m', '1h30m', '45s', '600' (or a number of seconds) -> seconds (> 0)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        t = str(text).strip().lower()
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


def _stem(url: str) -> Path:
    """The stem that default files get: tune.db -> tune (.runs.jsonl, .trials/, .best.json)."""
    if url.startswith("sqlite:///") and url[len("sqlite:///") :] not in ("", ":memory:"):
        path = Path(url[len("sqlite:///") :])
        return path.with_suffix("") if path.suffix else path
    return Path("exatrain-tune")


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def tune(
    model: ModelQuery | str | ModelSpec | None = None,
    cluster: ClusterQuery | str | ClusterSpec | None = None,
    *,
    layout: Layout | None = None,
    engine: Engine | None = None,
    options: TuneOptions | None = None,
    **pins: Any,
):
    """Tune the layout of the model on ``cluster.gpus`` ranks at ``layout.global_batch`` by real runs of
    ``options.steps`` steps (cluster default local-cpu). ``options.trials`` is the study's total of finished runs,
    so a rerun with more adds runs; ``time_budget`` (e.g. '2h') stops starting trials; ``launcher`` is a command
    template with {cmd} (e.g. 'srun -N4 --ntasks-per-node 8 {cmd}'). Writes the best plan to ``out`` (default
    beside the study, e.g. tune.best.json) and a RunRecord per finished run to ``runs_file`` (default
    tune.runs.jsonl). Returns a TuneResult (every trial, ranked; the best). ``progress`` hears one line per finished
    trial. ``engine.runtime``: the trials run exatrain's own trainer, so its candidates are ranked as that runtime
    runs them; no other is accepted (None: exatrain); ``engine.calibration``: predict with it. Every field may be
    given flat by name (``tune(model="gpt-tiny", gpus=4, global_batch=8, trials=4)``)."""
    parts = {"model": coerce(ModelQuery, model, "model"), "cluster": coerce(ClusterQuery, cluster, "cluster")}
    parts.update(layout=coerce(Layout, layout, ""), engine=coerce(Engine, engine, ""))
    r = routed("tune", pins, {**parts, "options": coerce(TuneOptions, options, "")})
    if r["settings"] or r["engine"].overlap is not None:
        raise TypeError(f"tune() got an unexpected keyword argument {next(iter(r['settings']), 'overlap')!r}")
    return _tune(r["model"], r["cluster"], r["layout"], r["engine"], r["options"])


def _tune(mq: ModelQuery, cq: ClusterQuery, lay: Layout, engine: Engine, o: TuneOptions):
    from exatrain.api.planning import check_runtime

    runtime = "exatrain" if engine.runtime is None else engine.runtime
    if check_runtime(runtime) != "exatrain":
        raise UserError(
            f"tune runs exatrain's own trainer: --runtime must be exatrain, got {runtime!r} "
            "(`exatrain search --runtime {runtime}` ranks layouts for it)".replace("{runtime}", runtime)
        )
    gpus, global_batch = cq.gpus, lay.global_batch
    if gpus is None or global_batch is None:
        raise UserError("tune needs --gpus (ranks) and --global-batch")
    if o.steps < 3:
        raise UserError(f"--steps {o.steps}: a trial needs at least 3 steps (the first 2 are warm-up)")
    if not 0 <= o.prune_ratio < 1:
        raise UserError(f"--prune-ratio must be in [0, 1), got {o.prune_ratio}")
    if o.seed_trials < 0:
        raise UserError(f"--seed-trials must be >= 0, got {o.seed_trials}")
    budget = None if o.time_budget is None else parse_duration(o.time_budget, "--time-budget")
    timeout = parse_duration(o.trial_timeout, "--trial-timeout")
    from exatrain.tuning.runner import check_launcher

    launcher = check_launcher(o.launcher)
    url = study_url(o.study)
    stem = _stem(url)
    if url.startswith("sqlite:///") and url[len("sqlite:///") :] not in ("", ":memory:"):
        check_output_file(url[len("sqlite:///") :], "--study")
    best_path = Path(o.out) if o.out is not None else Path(f"{stem}.best.json")
    runs_path = Path(o.runs_file) if o.runs_file is not None else Path(f"{stem}.runs.jsonl")
    check_output_file(best_path, "--out")
    check_output_file(runs_path, "--runs-file")
    check_output_dir(Path(f"{stem}.trials"), "trials folder")
    options = space_options(**layout_values(lay.values()))
    cluster = resolve_cluster(cq.cluster, cq.cluster_file, default=TUNE_CLUSTER)
    c, params = calibrated(cluster, engine.calibration, "exatrain")
    m = resolve_model(mq.model, mq.model_file, **mq.shape())
    device = o.device or ("cpu" if c.device.name == "cpu" else "cuda")
    dtype = lay.dtype or ("float32" if device == "cpu" else "bfloat16")
    flash = True if lay.flash_attention is None else lay.flash_attention
    from exatrain.planner.scaling import no_feasible_layout
    from exatrain.planner.search.search import search
    from exatrain.tuning.study import Problem

    result = search(
        m, c, gpus, global_batch, top=o.candidates, options=options, params=params, dtype=dtype, flash=flash,
        runtime="exatrain",
    )  # fmt: skip
    if not result.ranked:
        raise no_feasible_layout(result, gpus, c)
    problem = Problem(m, c.name, gpus, global_batch, device, dtype, flash, options)
    return _study(problem, result.ranked, o, (url, stem, best_path, runs_path), budget, timeout, launcher)


def _study(problem, ranked, o: TuneOptions, where: tuple, budget, timeout, launcher):
    """Run the study of ``problem`` over the ranked candidates; write the best plan; the TuneResult."""
    url, stem, best_path, runs_path = where
    from exatrain.api.training import check_cpu_memory
    from exatrain.tuning.sampler import Candidates
    from exatrain.tuning.study import StudyFiles, TuneSettings, open_storage
    from exatrain.tuning.study import tune as run_study

    from exatrain.tuning.runner import SubprocessRunner

    cands = Candidates.from_plans(ranked, gpus=problem.gpus, global_batch=problem.global_batch)
    settings = TuneSettings(trials=o.trials, time_budget_s=budget, seed_trials=o.seed_trials, prune_ratio=o.prune_ratio)
    storage = open_storage(url, settings)
    name = o.study_name or problem.study_name()
    files = StudyFiles(trials_dir=Path(f"{stem}.trials") / name, runs_file=runs_path)
    local_cpu = problem.device == "cpu" and launcher is None  # the trainer's memory check is about this machine
    runner = SubprocessRunner(
        steps=o.steps,
        seed=o.seed,
        device=problem.device,
        timeout_s=timeout,
        launcher=launcher,
        preflight=check_cpu_memory if local_cpu else None,
    )
    # SIGTERM (e.g. SLURM's time limit) ends the tuner like Ctrl-C: the running trial's ranks are ended
    # and its layout queued again, instead of leaving them for the next run to clean up.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        from exatrain.planner.search.explain import describe

        def on_trial(v) -> None:
            if (progress := o.progress) is not None:
                line = f"trial {v.number}: {describe(v.plan)} [{v.source or 'sampler'}]: {v.status}"
                if v.measured_tokens_per_s is not None:
                    line += f", {v.measured_tokens_per_s:,.0f} tokens/s"
                if v.predicted_tokens_per_s is not None:
                    line += f" (predicted {v.predicted_tokens_per_s:,.0f})"
                progress(line + (f" — {v.error}" if v.error and v.status != "ok" else ""))

        out_result = run_study(problem, cands, runner, files, storage, settings, study_name=name, progress=on_trial)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if out_result.best is not None:
        out_result.best.plan.save(best_path)

    return dataclasses.replace(
        out_result,
        storage=url,
        runs_file=str(files.runs_file),
        trials_dir=str(files.trials_dir),
        best_file=str(best_path) if out_result.best is not None else None,
    )


__all__ = ["DEFAULT_STUDY", "parse_duration", "study_url", "tune"]
