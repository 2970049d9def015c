"""Results as terminal text (rich tables): what `exatrain estimate`, `search`, `scaling`, `models`, `hardware`,
`validate` and `tune` print, callable from a script or notebook on what the API returns
(``render_estimate(exatrain.estimate(...))``)."""

from __future__ import annotations

from exatrain.plan import Plan
from exatrain.planner.memory_band import tight_window
from exatrain.report.console import (
    VERDICT_STYLE,
    in_gib,
    goodput_lines,
    make_console,
    memory_verdict_text,
    opt,
    progress_lines,
    run_cells,
    run_columns,
    run_lines,
    run_titles,
    table,
)
from exatrain.settings import trainer_cannot_build
from exatrain.units import GiB, count_text


def _layout_line(plan: Plan, est) -> str:
    """The estimate's first line: model, parameters, cluster, the layout and the run settings."""
    return (
        f"[bold]{plan.model.name}[/] ({count_text(est.params)} params) on {plan.gpus} x {plan.cluster}: "
        f"tp {plan.tp} · pp {plan.pp} · dp {plan.dp}"
        + "".join(f" · {k} {n}" for k, n in (("cp", plan.cp), ("ep", plan.ep)) if n != 1)
        + f", micro-batch {plan.micro_batch}, "
        f"global batch {plan.global_batch} ({plan.num_microbatches} micro-batches), ZeRO-{plan.zero_stage}, "
        f"recompute {plan.recompute}, SP {'on' if plan.sequence_parallel else 'off'}, schedule {plan.schedule}"
        + (f" x{plan.interleave}" if plan.interleave > 1 else "")
        + f", {plan.dtype}, runtime {plan.runtime}"
        + (f", FP8 GEMMs ({plan.fp8} scaling)" if plan.fp8 else "")
        + plan.settings_label
    )


def _memory_table(plan: Plan, est, con) -> None:
    """Memory per rank of each pipeline stage, by kind, and its share of the device's capacity."""
    t = table(
        f"memory per rank, GiB (capacity {in_gib(est.capacity_bytes)})",
        (
            "stage",
            "layers",
            "params",
            "weights",
            "gradients",
            "optimizer",
            "activations",
            "other",
            "total",
            "of capacity",
        ),
    )
    layers = plan.layers_per_stage()
    for r, mb in enumerate(est.memory_by_stage):
        share = mb.total / est.capacity_bytes
        style = "red" if share > 1 else ("yellow" if share > 0.9 else "")
        t.add_row(
            str(r),
            str(sum(layers[v] for v in plan.stages_of_rank(r))),
            count_text(est.params_by_stage[r], 3),
            *(in_gib(x) for x in (mb.weights, mb.gradients, mb.optimizer, mb.activations, mb.other, mb.total)),
            f"[{style}]{share:.0%}[/]" if style else f"{share:.0%}",
        )
    con.print(t)


def _memory_and_flops_lines(plan: Plan, est, con) -> None:
    """The worst stage's memory and verdict, the memory advice and band, exatrain's own trainer's memory where
    another runtime is planned, and the FLOPs and bytes per step."""
    con.print(
        f"worst stage: {in_gib(est.memory_bytes.total)} GiB of {in_gib(est.capacity_bytes)} GiB — "
        f"{memory_verdict_text(est)} (as {plan.runtime} runs it)"
    )
    if est.memory_advice:
        con.print(f"memory: {est.memory_advice['text']}")
    if est.memory_band and est.memory_band.get("widened"):
        con.print(f"memory band: {est.memory_band['text']}")
    if est.trainer_memory_bytes is not None and plan.runtime != "exatrain":
        tv = "[green]fits[/]" if est.trainer_fits else "[red]does not fit[/]"
        con.print(f"with exatrain's own trainer as it runs today: {in_gib(est.trainer_memory_bytes.total)} GiB — {tv}")
    con.print(
        f"FLOPs per step: model {est.model_flops_per_step:.3e}, hardware {est.hardware_flops_per_step:.3e}; "
        "bytes sent per rank per step: " + ", ".join(f"{k} {v / 1e9:,.2f} GB" for k, v in est.comm_bytes.items())
    )


def _step_time_lines(plan: Plan, est, con) -> None:
    """The step-time breakdown, its out-of-sample range, throughput and MFU, and the MFU flag."""
    ts = est.time_s
    cols = ("step", "compute", "bubble", "tp_comm", "pp_comm", "dp_comm", "optimizer", "other")
    cols += tuple(
        c
        for c, on in (
            ("ep_comm", plan.model.is_moe),
            ("cp_comm", plan.cp > 1),
            ("straggler", ts.straggler > 0),
            ("offload", plan.offload != "none"),
        )
        if on
    )
    tt = table("step time, seconds", tuple(c.replace("_", " ") for c in cols))
    tt.add_row(*(f"{getattr(ts, c):.3f}" for c in cols))
    con.print(tt)
    if est.step_range_s is not None:  # the out-of-sample band (planner/band.py)
        con.print(
            f"step {ts.step:,.3g} s ({est.step_range_s[0]:,.3g}–{est.step_range_s[1]:,.3g} s, "
            f"{(est.band or {}).get('text', '')})"
        )
    line = f"{est.tokens_per_s:,.0f} tokens/s, {est.model_tflops_per_gpu:.1f} model TFLOPS per GPU"
    con.print(
        line
        + (
            f" (MFU {est.mfu:.1%}, HFU {est.hfu:.1%}" + (f", against the {plan.dtype} peak" if plan.fp8 else "") + ")"
            if est.mfu is not None
            else ""
        )
    )
    if est.mfu_above_published:
        con.print(f"[yellow]flag: {est.mfu_above_published['text']}[/]")


def render_estimate(plan: Plan, con=None) -> None:
    """A plan's estimate as the terminal shows it: the layout, memory per stage, the verdict, FLOPs
    and bytes, the step-time breakdown with its out-of-sample range, throughput and the notes."""
    est = plan.estimate
    assert est is not None
    con = con or make_console()
    con.print(_layout_line(plan, est))
    _memory_table(plan, est, con)
    _memory_and_flops_lines(plan, est, con)
    if est.time_s is not None:
        _step_time_lines(plan, est, con)
    if est.time_to_train is not None:
        for line in run_lines(est.time_to_train):
            con.print(line)
    for note in est.notes:
        con.print(f"[dim]· {note}[/]")


def _search_table(result, runs: tuple[str, ...], gpus: int, global_batch: int):
    """The ranked layouts as one table: layout, step time, throughput, MFU, memory and the whole-run columns."""
    first = result.ranked[0]
    t = table(
        f"{first.model.name} on {gpus} × {first.cluster}, global batch {global_batch}, runtime {first.runtime}",
        (
            "#",
            "layout",
            "mb",
            "ZeRO",
            "recompute",
            "SP",
            "schedule",
            "step s",
            "tokens/s",
            "TFLOPS/GPU",
            "MFU",
            "memory GiB",
            "memory",
            *run_titles(runs),
        ),
        left=("layout", "recompute", "schedule"),
    )
    for i, p in enumerate(result.ranked, 1):
        e = p.estimate
        mem = e.memory_bytes
        t.add_row(
            str(i),
            p.label,
            str(p.micro_batch),
            str(p.zero_stage),
            p.recompute_label,
            "on" if p.sequence_parallel else "off",
            p.schedule_label,
            f"{e.time_s.step:.2f}",
            f"{e.tokens_per_s:,.0f}",
            f"{e.model_tflops_per_gpu:.1f}",
            opt(e.mfu, "{:.1%}"),
            f"{mem.total / GiB:.1f}/{e.capacity_bytes / GiB:.0f}",
            f"[{VERDICT_STYLE[e.verdict]}]{e.verdict}[/]",
            *run_cells(p, runs),
        )
    return t


def _memory_marks(result, con) -> None:
    """Which ranked layouts are tight or over capacity, and the fastest that fits outright where the first
    does not."""
    first = result.ranked[0]
    marked: dict[str, list[int]] = {}
    for i, p in enumerate(result.ranked, 1):
        b = p.estimate.memory_band
        if p.estimate.verdict == "tight" and b:
            marked.setdefault("{:.2f}–{:.2f}".format(*tight_window(b)), []).append(i)
    if marked:
        con.print(
            "tight: "
            + "; ".join(
                ", ".join(f"#{i}" for i in ids) + f" (capacity inside {ends} of the prediction)"
                for ends, ids in marked.items()
            )
            + " — measured peaks of such plans (out of sample) lie within that window around the prediction, "
            "and the device's capacity falls inside it: they may run out of memory; kept, --strict-memory "
            "drops them"
        )
    over = [i for i, p in enumerate(result.ranked, 1) if p.estimate.memory_bytes.total > p.estimate.capacity_bytes]
    if over:
        con.print(
            "over capacity: " + ", ".join(f"#{i}" for i in over) + " (predicted above the device's memory: "
            "ranked after every layout predicted within it)"
        )
    if result.ranked and first.estimate.verdict != "fits" and not getattr(result, "strict_memory", False):
        best, rank = getattr(result, "best_fitting", None), getattr(result, "best_fitting_rank", 0)
        if best is None:
            con.print("no kept layout fits outright: each is tight")
        else:
            e = best.estimate
            con.print(
                f"fastest that fits outright: #{rank:,} {best.label} mb{best.micro_batch} ZeRO-{best.zero_stage} "
                f"{best.recompute_label} {best.schedule_label}, {e.time_s.step:.2f} s/step "
                f"({e.time_s.step / first.estimate.time_s.step - 1:+.1%}), "
                f"{e.memory_bytes.total / GiB:.1f}/{e.capacity_bytes / GiB:.0f} GiB"
            )


def render_search(result, lines: list[str] | None, gpus: int, global_batch: int, con=None) -> None:
    """The ranked table of a search, its runtime, what was examined and rejected, and ``lines`` (the
    explanation of the winner, when asked for)."""
    first = result.ranked[0]
    con = con or make_console()
    runs = run_columns(result.ranked)
    con.print(_search_table(result, runs, gpus, global_batch))
    _memory_marks(result, con)
    for line in run_lines(first.estimate.time_to_train, per_row=True) if runs else ():
        con.print(line)
    if first.fp8:
        con.print(f"FP8 GEMMs ({first.fp8} scaling); MFU against the {first.dtype} peak")
    con.print(
        f"memory and overlaps: {first.runtime}"
        + (" (exatrain's own trainer as it runs today)" if first.runtime == "exatrain" else "")
    )
    if first.runtime == "exatrain" and (cannot := trainer_cannot_build(first.model)):
        con.print(cannot)
    for note in getattr(result, "notes", ()):
        con.print(note)
    rej = ", ".join(f"{k}: {v:,}" for k, v in result.rejected.items() if v)
    tight = getattr(result, "tight", 0)
    kept = "" if getattr(result, "strict_memory", False) or not tight else f" ({tight:,} of them tight, kept)"
    con.print(
        f"{result.examined:,} candidates examined, {result.collapsed:,} equivalent spellings collapsed, "
        f"{result.legal:,} legal, {result.feasible:,} kept by memory{kept}. Rejected — {rej or 'none'}."
    )
    for line in lines or ():
        con.print(f"· {line}")


def render_scaling(result, con=None) -> None:
    """The points of a scaling study: best layout, step time, MFU and efficiency per GPU count, and
    the study's measured efficiencies where the catalog holds them."""
    con = con or make_console()
    runs = run_columns([pt.plan for pt in result.points])
    t = table(
        f"{result.mode} scaling of {result.model.name} on {result.cluster.name}, runtime "
        f"{result.points[0].plan.runtime}",
        (
            "GPUs",
            "global batch",
            "layout",
            "mb",
            "ZeRO",
            "recompute",
            "schedule",
            "step s",
            "TFLOPS/GPU",
            "MFU",
            "efficiency",
            *run_titles(runs),
        ),
        left=("layout", "recompute", "schedule"),
    )
    for pt in result.points:
        p, e = pt.plan, pt.plan.estimate
        t.add_row(
            str(pt.gpus),
            str(pt.global_batch),
            p.label,
            str(p.micro_batch),
            str(p.zero_stage),
            p.recompute_label,
            p.schedule_label,
            f"{e.time_s.step:.2f}",
            f"{e.model_tflops_per_gpu:.1f}",
            opt(e.mfu, "{:.1%}"),
            f"{pt.efficiency:.1%}",
            *run_cells(p, runs),
        )
    con.print(t)
    for line in run_lines(result.points[0].plan.estimate.time_to_train, per_row=True) if runs else ():
        con.print(line)
    if result.points and result.points[0].plan.fp8:
        p = result.points[0].plan
        con.print(f"FP8 GEMMs ({p.fp8} scaling); MFU against the {p.dtype} peak")
    if result.measured:
        con.print(
            f"{result.measured[0].source} measured: "
            + ", ".join(
                f"{m.mode} {m.efficiency:.0%}" + (f" to {m.gpus:,} GPUs" if m.range_stated else "")
                for m in result.measured
            )
        )


def _human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(int(n))


def render_models(presets, con=None) -> None:
    """The catalog's model presets (name -> ModelSpec) with their parameter counts."""
    from exatrain.accounting.params import total_params

    t = table(
        "model presets",
        ("name", "arch", "layers", "hidden", "heads", "kv", "ffn", "seq", "vocab", "params"),
        left=("name", "arch"),
    )
    for m in presets.values():
        t.add_row(
            m.name,
            m.arch,
            *(str(x) for x in (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.seq_len, m.vocab)),
            _human(total_params(m)),
        )
    (con or make_console()).print(t)


def render_hardware(devices, clusters, con=None) -> None:
    """The catalog's devices and clusters (name -> spec each), a cluster with its link tiers."""
    con = con or make_console()
    t = table(
        "devices", ("name", "vendor", "bf16 TFLOPS", "fp32 TFLOPS", "memory GiB", "HBM TB/s"), left=("name", "vendor")
    )
    for d in devices.values():
        t.add_row(
            d.name,
            d.vendor,
            opt(d.peak_tflops, "{:g}"),
            opt(d.peak_tflops_fp32, "{:g}"),
            f"{d.hbm_bytes / 2**30:.1f}",
            f"{d.hbm_bytes_per_s / 1e12:.2f}",
        )
    c = table(
        "clusters",
        ("name", "device", "per node", "link tiers (span: GB/s per rank, latency)"),
        left=("name", "device", "link tiers (span: GB/s per rank, latency)"),
    )
    for cl in clusters.values():
        c.add_row(
            cl.name,
            cl.device.name,
            str(cl.gpus_per_node),
            "; ".join(
                f"{t.name} ({t.span or 'network'}: {t.bytes_per_s / 1e9:g} GB/s, {t.latency_s * 1e6:g} us)"
                for t in cl.tiers
            ),
        )
    con.print(t)
    con.print(c)


def render_comparisons(result, calibration=None, con=None) -> None:
    """Predicted against measured step time and memory of recorded runs (``planner.compare``'s result), and the
    distribution of the errors; ``calibration``: the file the predictions were made again with, if any."""
    from exatrain.planner.compare import size

    con = con or make_console()
    source = "re-predicted with " + str(calibration) if calibration else "predictions stored in the records"
    t = table(
        f"predicted vs measured ({source})",
        ("run", "device", "pred s/step", "meas s/step", "error", "trainer model", "measured", "mem error"),
        left=("run", "device"),
    )
    for c in result.comparisons:
        t.add_row(
            c.label,
            c.device,
            opt(c.predicted_step_s, "{:.4f}"),
            opt(c.measured_step_s, "{:.4f}"),
            opt(c.step_error, "{:+.1%}"),
            "-" if c.trainer_memory_bytes is None else size(c.trainer_memory_bytes),
            ("-" if not c.measured_memory_bytes else size(c.measured_memory_bytes))
            + ("" if c.device_memory else " RSS"),
            opt(c.memory_error("trainer"), "{:+.1%}"),
        )
    con.print(t)
    for what, dist in result.distribution.items():
        if dist["n"]:
            con.print(
                f"{what.replace('_', ' ')} |error| over {dist['n']} runs: median {dist['median']:.1%}, "
                f"p90 {dist['p90']:.1%}, max {dist['max']:.1%}"
            )


def render_tune(out, con=None) -> None:
    """A tuning study's trials, best first, and its best run (``tuning.TuneResult``)."""
    from exatrain.planner.search.explain import describe

    con = con or make_console()
    t = table(
        f"study {out.study_name} ({out.storage}): {out.finished} finished runs, {out.candidates} candidates",
        ("#", "trial", "layout", "predicted tok/s", "measured tok/s", "status", "note"),
        left=("layout", "status", "note"),
    )
    for rank, v in enumerate(out.trials, 1):
        t.add_row(
            str(rank),
            str(v.number),
            describe(v.plan),
            opt(v.predicted_tokens_per_s, "{:,.0f}"),
            opt(v.measured_tokens_per_s, "{:,.0f}"),
            v.status,
            v.error[:80] if v.status != "ok" else v.source,
        )
    con.print(t)
    con.print(f"stopped: {out.stopped}; {out.ran} run(s) this time. Runs file: {out.runs_file}")
    if out.best is not None:
        b = out.best
        con.print(
            f"best: trial {b.number}, {describe(b.plan)}: {opt(b.measured_tokens_per_s, '{:,.0f}')} tokens/s "
            f"(predicted {opt(b.predicted_tokens_per_s, '{:,.0f}')}); plan saved to {out.best_file}"
        )


__all__ = [
    "VERDICT_STYLE",
    "goodput_lines",
    "make_console",
    "memory_verdict_text",
    "opt",
    "progress_lines",
    "render_comparisons",
    "render_estimate",
    "render_hardware",
    "render_models",
    "render_scaling",
    "render_search",
    "render_tune",
    "run_cells",
    "run_columns",
    "run_lines",
    "run_titles",
    "table",
]
