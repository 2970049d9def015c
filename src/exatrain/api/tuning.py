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
from typing import Callable, Sequence

from exatrain.api.plans import calibrated, layout_values, resolve_cluster, resolve_model, shape_of, space_options
from exatrain.catalog import ClusterSpec, ModelSpec
from exatrain.errors import UserError
from exatrain.limits import check_counts
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
    *,
    model: str | ModelSpec | None = None,
    model_file: str | Path | None = None,
    arch: str | None = None,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    ffn_hidden: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
    cluster: str | ClusterSpec | None = None,
    cluster_file: str | Path | None = None,
    gpus: int | None = None,
    tp: int | None = None,
    pp: int | None = None,
    dp: int | None = None,
    micro_batch: int | None = None,
    global_batch: int | None = None,
    zero: int | None = None,
    recompute: str | None = None,
    sequence_parallel: bool | None = None,
    schedule: str | None = None,
    interleave: int | None = None,
    stage_layers: Sequence[int] | None = None,
    dtype: str | None = None,
    flash_attention: bool | None = None,
    trials: int = 20,
    time_budget: str | float | None = None,
    study: str = DEFAULT_STUDY,
    study_name: str | None = None,
    device: str | None = None,
    steps: int = 8,
    seed: int = 0,
    trial_timeout: str | float = "15m",
    launcher: str | None = None,
    candidates: int = 256,
    seed_trials: int = 2,
    prune_ratio: float = 0.5,
    runtime: str = "exatrain",
    calibration: str | Path | None = None,
    out: str | Path | None = None,
    runs_file: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
):
    """Tune the layout of ``model`` on ``gpus`` ranks at ``global_batch`` by real runs of ``steps``
    steps (cluster default local-cpu). ``trials`` is the study's total of finished runs, so a rerun
    with more adds runs; ``time_budget`` (e.g. '2h') stops starting trials; ``launcher`` is a command
    template with {cmd} (e.g. 'srun -N4 --ntasks-per-node 8 {cmd}'). Writes the best plan to ``out``
    (default beside the study, e.g. tune.best.json) and a RunRecord per finished run to
    ``runs_file`` (default tune.runs.jsonl). Returns a TuneResult (every trial, ranked; the best).
    ``progress`` hears one line per finished trial. ``runtime``: the trials run exatrain's own
    trainer, so its candidates are ranked as that runtime runs them; no other is accepted."""
    values = dict(locals())
    check_counts(values)
    from exatrain.api.planning import check_runtime

    if check_runtime(runtime) != "exatrain":
        raise UserError(
            f"tune runs exatrain's own trainer: --runtime must be exatrain, got {runtime!r} "
            "(`exatrain search --runtime {runtime}` ranks layouts for it)".replace("{runtime}", runtime)
        )
    if gpus is None or global_batch is None:
        raise UserError("tune needs --gpus (ranks) and --global-batch")
    if steps < 3:
        raise UserError(f"--steps {steps}: a trial needs at least 3 steps (the first 2 are warm-up)")
    if not 0 <= prune_ratio < 1:
        raise UserError(f"--prune-ratio must be in [0, 1), got {prune_ratio}")
    if seed_trials < 0:
        raise UserError(f"--seed-trials must be >= 0, got {seed_trials}")
    budget = None if time_budget is None else parse_duration(time_budget, "--time-budget")
    timeout = parse_duration(trial_timeout, "--trial-timeout")
    from exatrain.tuning.runner import SubprocessRunner, check_launcher

    launcher = check_launcher(launcher)
    url = study_url(study)
    stem = _stem(url)
    if url.startswith("sqlite:///") and url[len("sqlite:///") :] not in ("", ":memory:"):
        check_output_file(url[len("sqlite:///") :], "--study")
    best_path = Path(out) if out is not None else Path(f"{stem}.best.json")
    runs_path = Path(runs_file) if runs_file is not None else Path(f"{stem}.runs.jsonl")
    check_output_file(best_path, "--out")
    check_output_file(runs_path, "--runs-file")
    check_output_dir(Path(f"{stem}.trials"), "trials folder")
    options = space_options(**layout_values(values))
    c, params = calibrated(resolve_cluster(cluster, cluster_file, default=TUNE_CLUSTER), calibration, "exatrain")
    m = resolve_model(model, model_file, **shape_of(values))
    device = device or ("cpu" if c.device.name == "cpu" else "cuda")
    dtype = dtype or ("float32" if device == "cpu" else "bfloat16")
    flash = True if flash_attention is None else flash_attention

    from exatrain.api.training import check_cpu_memory
    from exatrain.planner.scaling import no_feasible_layout
    from exatrain.planner.search.search import search
    from exatrain.tuning.sampler import Candidates
    from exatrain.tuning.study import Problem, StudyFiles, TuneSettings, open_storage
    from exatrain.tuning.study import tune as run_study

    result = search(
        m,
        c,
        gpus,
        global_batch,
        top=candidates,
        options=options,
        params=params,
        dtype=dtype,
        flash=flash,
        runtime="exatrain",
    )
    if not result.ranked:
        raise no_feasible_layout(result, gpus, c)
    cands = Candidates.from_plans(result.ranked, gpus=gpus, global_batch=global_batch)
    problem = Problem(m, c.name, gpus, global_batch, device, dtype, flash, options)
    settings = TuneSettings(trials=trials, time_budget_s=budget, seed_trials=seed_trials, prune_ratio=prune_ratio)
    storage = open_storage(url, settings)
    name = study_name or problem.study_name()
    files = StudyFiles(trials_dir=Path(f"{stem}.trials") / name, runs_file=runs_path)
    local_cpu = device == "cpu" and launcher is None  # the trainer's memory check is about this machine
    runner = SubprocessRunner(
        steps=steps,
        seed=seed,
        device=device,
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
            if progress is not None:
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
