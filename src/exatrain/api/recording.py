"""``record``: a run measured anywhere, as a RunRecord appended to a runs file, for ``calibrate`` and ``validate``.

Two ways in: a plan (``estimate --out`` / ``search --out``, any file ``load_plan`` reads) and the step time it
ran at; or the run's own launch (as ``estimate --from`` reads it) and its engine's log, whose steady-state step
time (the median after warm-up) and peak memory ``engine_configs.read_logs`` reads. Either way the record holds
the plan, the prediction made for it on its cluster, and the measurement beside it; its ``env`` names the
overlaps it was priced with, which ``calibrate`` prices it with again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exatrain.api.requests import ClusterQuery, Engine, RecordedRun, coerce, routed
from exatrain.catalog import ClusterSpec
from exatrain.errors import UserError
from exatrain.paths import check_input_file, check_output_file
from exatrain.plan import Measured, Plan, RunRecord

GIB = 2.0**30
WARMUP = (
    RecordedRun.warmup
)  # logged steps up to this number are warm-up, beside the first logged line (read_logs.steady_values)


@dataclass(frozen=True)
class RecordResult:
    record: RunRecord
    out: str
    created: bool  # the runs file did not exist before
    how: str  # where the measurement came from

    def summary_lines(self) -> list[str]:
        r, m = self.record, self.record.measured
        est = r.predicted
        line = (
            f"{r.plan.label} ({r.plan.runtime} on {r.env.get('cluster', '?')}): measured {m.step_time_s:.3f} s a step"
        )
        if est is not None and est.time_s is not None:
            line += f", predicted {est.time_s.step:.3f} s ({est.time_s.step / m.step_time_s - 1:+.1%})"
        if m.peak_memory_bytes:
            line += f"; peak memory {m.peak_memory_bytes / GIB:.1f} GiB"
        return [line, f"  {self.how}", f"-> {'created ' if self.created else 'appended to '}{self.out}"]

    def to_dict(self) -> dict[str, Any]:
        return {"out": self.out, "created": self.created, "how": self.how, "record": self.record.to_dict()}


def _estimate_default_overlap() -> str | None:
    """What ``estimate`` prices when --overlap is not given (None: each engine's own defaults)."""
    return Engine().overlap


def _measured(plan: Plan, step_s: float, peak_bytes: float | None, steps: int, peak: float | None) -> Measured:
    from exatrain.accounting.flops import model_flops_per_step

    tflops = model_flops_per_step(plan.model, plan.global_batch) / step_s / plan.gpus / 1e12
    return Measured(
        steps=steps,
        step_time_s=step_s,
        tokens_per_s=plan.tokens_per_step / step_s,
        model_tflops_per_gpu=tflops,
        mfu=None if not peak else tflops * 1e12 / peak,
        peak_memory_bytes=peak_bytes,
    )


def _positive(value: float | None, flag: str) -> None:
    if value is not None and not (value > 0 and value < float("inf")):
        raise UserError(f"{flag} must be a positive number of {'seconds' if 'time' in flag else 'GiB'}, got {value!r}")


def _from_plan(
    plan_path: str | Path,
    step_time: float,
    peak_memory_gib: float | None,
    cluster: ClusterSpec | None,
    overlap: str | None,
) -> tuple[Plan, ClusterSpec, str, Measured, str]:
    from exatrain.api.plans import load_plan
    from exatrain.catalog import get_cluster
    from exatrain.planner.estimate import estimate_plan

    plan = load_plan(plan_path)
    if cluster is None:
        if not plan.cluster:
            raise UserError(f"{plan_path}: the plan names no cluster; say which it ran on: --cluster or --cluster-file")
        cluster = get_cluster(plan.cluster)
    plan = plan.replace(cluster=cluster.name)
    overlap = overlap or _estimate_default_overlap()
    if plan.estimate is None or plan.estimate.time_s is None:
        plan = plan.with_estimate(estimate_plan(plan, cluster, None, overlap))
    peak = None if peak_memory_gib is None else peak_memory_gib * GIB
    m = _measured(plan, step_time, peak, 0, cluster.device.peak_flops(plan.dtype))
    return plan, cluster, overlap, m, f"step time {step_time:g} s given (--step-time) for the plan in {plan_path}"


def _from_launch(
    launch: str | Path,
    log: str | Path,
    cluster: ClusterSpec,
    gpus: int | None,
    vocab: int | None,
    warmup: int,
    overlap: str | None,
) -> tuple[Plan, ClusterSpec, str, Measured, str]:
    from exatrain.api.planning import estimate
    from exatrain.api.plans import from_launch, warner
    from exatrain.engine_configs.read_logs import read_log, steady_step_s

    log_path = check_input_file(log, "--log")
    try:
        data = log_path.read_bytes()
    except OSError as exc:
        raise UserError(f"{log}: cannot read ({exc.strerror or exc})") from None
    said: list[str] = []  # the launch's warning lines, said once the log is read too (a refusal is one line)
    values = from_launch(launch, gpus=gpus, shape={"vocab": vocab} if vocab else None, warn=said.append)
    read = read_log(data, source=str(log), runtime=str(values.get("runtime") or ""))
    steady_step_s(read, warmup, tokens_per_step=1, global_batch=1, gpus=1, source=str(log))  # refused before planning
    for line in said:
        warner(None)(line)
    overlap = overlap or values.pop("overlap", None) or _estimate_default_overlap()
    values.pop("overlap", None)
    plan = estimate(**values, cluster=cluster, overlap=overlap)
    step_s, n = steady_step_s(
        read,
        warmup,
        tokens_per_step=plan.tokens_per_step,
        global_batch=plan.global_batch,
        gpus=plan.gpus,
        source=str(log),
    )
    m = _measured(plan, step_s, read.peak_bytes, n, cluster.device.peak_flops(plan.dtype))
    how = f"{read.engine} log {log}: median of {n} logged step(s) after warm-up ({read.unit})" + (
        f", peak memory its {read.memory_kind}" if read.peak_bytes else ", no memory logged"
    )
    return plan, cluster, overlap, m, how


def record(
    out: str | Path,
    plan: str | Path | None = None,
    cluster: ClusterQuery | str | ClusterSpec | None = None,
    *,
    run: RecordedRun | None = None,
    **pins: Any,
) -> RecordResult:
    """Append a RunRecord for a run measured anywhere to the runs file ``out`` (created if needed): ``plan`` and
    ``run.step_time`` (seconds; ``run.peak_memory_gib`` if known), or the launch ``run.from_file`` (as ``estimate
    --from`` reads it) and the engine's ``run.log``. ``cluster``: where it ran (a plan's own cluster otherwise; a
    launch needs one; its ``gpus``, and ``run.vocab``: a launch's world size or vocabulary where it leaves them to
    its launcher or tokenizer). ``run.warmup``: logged steps up to this number are warm-up (the first logged line
    is, always). ``run.overlap``: the overlaps the run had on, as ``estimate --overlap`` names them (default: the
    launch's, else estimate's). Every field may be given flat by name (``record("runs.jsonl", "plan.json",
    step_time=1.9)``)."""
    parts = {"cluster": coerce(ClusterQuery, cluster, "cluster"), "run": coerce(RecordedRun, run, "")}
    r = routed("record", pins, parts)
    if r["settings"]:
        raise TypeError(f"record() got an unexpected keyword argument {next(iter(r['settings']))!r}")
    return _record(out, plan, r["cluster"], r["run"])


def _record(out: str | Path, plan: str | Path | None, cq: ClusterQuery, run: RecordedRun) -> RecordResult:
    step_time, peak_memory_gib, from_file, log = run.step_time, run.peak_memory_gib, run.from_file, run.log
    gpus, vocab, warmup, overlap = cq.gpus, run.vocab, run.warmup, run.overlap
    from exatrain.api.plans import resolve_cluster
    from exatrain.records import append_run_record

    by_plan, by_log = plan is not None or step_time is not None, from_file is not None or log is not None
    if by_plan == by_log:
        raise UserError("give --plan PLAN --step-time SECONDS, or --from LAUNCH --log LOG (one of the two)")
    if by_plan and (plan is None or step_time is None):
        raise UserError("--plan and --step-time go together")
    if by_plan and (gpus is not None or vocab is not None):
        raise UserError("--gpus and --vocab go with --from (a plan states both)")
    if by_log and (from_file is None or log is None):
        raise UserError("--from and --log go together")
    if by_log and peak_memory_gib is not None:
        raise UserError("--peak-memory-gib goes with --plan; with --log the memory comes from the log")
    if warmup < 0:
        raise UserError(f"--warmup must be 0 or more, got {warmup}")
    _positive(step_time, "--step-time")
    _positive(peak_memory_gib, "--peak-memory-gib")
    out_path = check_output_file(out, "--out")
    if out_path.is_file() and out_path.stat().st_size:
        from exatrain.records import read_run_records

        read_run_records(out_path)  # appended to only when it is a runs file (a malformed line is the one line)
    c = None if cq.cluster is None and cq.cluster_file is None else resolve_cluster(cq.cluster, cq.cluster_file)
    if by_plan:
        p, c, overlap, m, how = _from_plan(plan, float(step_time), peak_memory_gib, c, overlap)
    else:
        if c is None:
            raise UserError("say which cluster the run ran on: --cluster NAME or --cluster-file PATH")
        p, c, overlap, m, how = _from_launch(from_file, log, c, gpus, vocab, warmup, overlap)
    rec = RunRecord(
        plan=p,
        measured=m,
        device=c.device.name,
        env={"recorded_by": "exatrain record", "cluster": c.name, "overlap": overlap, "measured": how},
    )
    created = not Path(out_path).exists()
    append_run_record(out_path, rec)
    return RecordResult(rec, str(out), created, how)


__all__ = ["RecordResult", "record"]
