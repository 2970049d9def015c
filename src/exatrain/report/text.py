"""Results as terminal text (rich tables): what `exatrain estimate`, `search`, `scaling`, `models`, `hardware`,
`validate` and `tune` print, callable from a script or notebook on what the API returns
(``render_estimate(exatrain.estimate(...))``)."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Callable, Iterator

from exatrain.plan import Plan
from exatrain.planner.memory_band import tight_window
from exatrain.settings import trainer_cannot_build
from exatrain.units import GiB, count_text


def make_console(stderr: bool = False) -> Any:
    """A rich Console; when output is not a terminal, wide enough that tables are not squeezed."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else int(os.environ.get("COLUMNS", "160"))
    return Console(file=stream, width=width)


@contextlib.contextmanager
def progress_lines(title: str, force: bool = False) -> Iterator[Callable[[str], None] | None]:
    """A callback printing progress lines (and a spinner on a terminal) to stderr; off a terminal each message is
    one plain line, flushed, and only when ``force`` asks for them (a command's --progress), else None."""
    if not sys.stderr.isatty():

        def plain(message: str) -> None:
            sys.stderr.write(f"{title}: {' '.join(message.split())}\n")
            sys.stderr.flush()

        yield plain if force else None
        return
    from rich.markup import escape

    con = make_console(stderr=True)

    def line(message: str) -> None:
        con.print(f"[dim]{escape(f'{title}: {message}')}[/]", highlight=False)

    with con.status(title) as status:

        def update(message: str) -> None:
            line(message)
            status.update(f"{title}: {message}")

        yield update


def table(title: str, columns: tuple[str, ...], left: tuple[str, ...] = ()) -> Any:
    """A rich Table, numbers right-aligned."""
    from rich.table import Table

    t = Table(title=title)
    for col in columns:
        t.add_column(col, justify="left" if col in left else "right")
    return t


def opt(x: float | None, fmt: str) -> str:
    """``fmt`` of x, or '-' when there is none."""
    return "-" if x is None else fmt.format(x)


def _gib(x: float) -> str:
    return f"{x / GiB:,.2f}"


# The whole run's figures (planner/time_to_train.py): (key, column title, format), cost only where priced.
RUN_FIGURES = (
    ("days", "days", "{:,.1f}"),
    ("gpu_hours", "GPU-hours", "{:,.0f}"),
    ("energy_mwh", "MWh", "{:,.1f}"),
    ("cost", "cost", "{:,.0f}"),
)


def _tokens(n: int) -> str:
    """300000000000 -> '300B' (the largest suffix that divides it), else the digits."""
    for suffix, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6)):
        if n % (scale // 10) == 0 and n >= scale:
            return f"{n / scale:g}{suffix}"
    return f"{n:,}"


GOODPUT_COLUMN = ("goodput_days", "days w/ failures", "{:,.1f}")  # planner/goodput.py's days, where carried


def run_columns(plans) -> tuple[str, ...]:
    """The whole-run figures every one of ``plans`` carries (none without a token budget)."""
    ttts = [p.estimate.time_to_train for p in plans if p.estimate is not None]
    if not ttts or any(t is None for t in ttts):
        return ()
    keys = tuple(key for key, _, _ in RUN_FIGURES if all(t.get(key) is not None for t in ttts))
    return keys + ((GOODPUT_COLUMN[0],) if all("goodput" in t for t in ttts) else ())


def run_titles(keys: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(title for key, title, _ in (*RUN_FIGURES, GOODPUT_COLUMN) if key in keys)


def run_cells(plan: Plan, keys: tuple[str, ...]) -> list[str]:
    ttt = plan.estimate.time_to_train or {}
    cells = [fmt.format(ttt[key]["value"]) for key, _, fmt in RUN_FIGURES if key in keys]
    if GOODPUT_COLUMN[0] in keys:
        days = ttt["goodput"]["days"]
        cells.append("never" if days is None else GOODPUT_COLUMN[2].format(days["value"]))
    return cells


def _span(f, fmt: str) -> str:
    """A figure as "value (low–high)", or the value alone without a band."""
    return fmt.format(f["value"]) + (
        f" ({fmt.format(f['low'])}–{fmt.format(f['high'])})" if f["low"] is not None else ""
    )


def goodput_lines(g) -> list[str]:
    """The goodput object of a time_to_train (planner/goodput.py) in three lines: the checkpoint and its interval,
    the interruptions and what they cost, the basis."""
    b = g["basis"]
    lines = [
        f"checkpoint {g['checkpoint_bytes'] / 1e12:,.2f} TB ({b['checkpoint']}): save {g['save_s']:,.1f} s, "
        f"load {g['load_s']:,.1f} s on {b['filesystem']}; every {g['interval_s'] / 60:,.1f} min of training "
        f"({g['interval_steps']:,} steps; Daly's optimum)"
    ]
    if b["never_finishes"]:
        lines.append(
            f"with failures: never finishes — each interruption costs {g['lost_each_s'] / 3600:,.2f} h, "
            f"more than the {g['mtbf_hours']:,.2f} h between them ({g['nodes']:,} nodes)"
        )
    else:
        lines.append(
            f"with failures: interruptions {_span(g['interruptions'], '{:,.0f}')} (one per "
            f"{g['mtbf_hours']:,.1f} h on {g['nodes']:,} nodes), lost {_span(g['lost_hours'], '{:,.0f}')} "
            f"h · days {_span(g['days'], '{:,.1f}')} · GPU-hours {_span(g['gpu_hours'], '{:,.0f}')}"
            + (f" · MWh {_span(g['energy_mwh'], '{:,.1f}')}" if g.get("energy_mwh") else "")
            + (f" · cost {_span(g['cost'], '{:,.0f}')}" if g.get("cost") else "")
            + f" · goodput {g['fraction']:.1%}"
        )
    lines.append(
        f"failures: node MTBF {g['node_mtbf_hours']:,.1f} h ({b['node_mtbf']}); restart "
        f"{g['restart_s'] / 60:,.1f} min ({b['restart']}); each costs the restart, the load and half a "
        "save period"
    )
    return lines


def run_lines(ttt, per_row: bool = False) -> list[str]:
    """What a whole-run figure is: the budget, its steps, the band, the power basis; ``per_row``: the figures are in a
    table's columns (one line of basis), else they follow here with their low and high."""
    head = f"{_tokens(ttt['tokens'])} tokens: {ttt['steps']:,} steps of {ttt['tokens_per_step']:,} tokens"
    if per_row:
        head = f"time to train {_tokens(ttt['tokens'])} tokens (value at the predicted step time)"
    lines = [head]
    if not per_row:
        figures = [(title, ttt[key]) for key, title, _ in RUN_FIGURES if ttt.get(key) is not None]
        fmts = {title: fmt for _, title, fmt in RUN_FIGURES}
        lines.append(
            "time to train: "
            + " · ".join(
                f"{t} {fmts[t].format(f['value'])}"
                + (f" ({fmts[t].format(f['low'])}–{fmts[t].format(f['high'])})" if f["low"] is not None else "")
                for t, f in figures
            )
            + (
                f" at {ttt['gpu_hour_price']:g} a GPU-hour"
                if ttt.get("cost") is not None
                else " · cost: give --gpu-hour-price"
            )
        )
    band = (
        f"each ×{ttt['days']['low'] / ttt['days']['value']:.2f}–×{ttt['days']['high'] / ttt['days']['value']:.2f}"
        if ttt["days"]["low"] is not None
        else "no band"
    )
    price = f"; cost at {ttt['gpu_hour_price']:g} a GPU-hour" if per_row and ttt.get("cost") is not None else ""
    lines.append(
        f"{'range' if not per_row else 'band'}: {band} ({ttt.get('band') or 'no published runs'}); "
        f"energy: {ttt['power']}{price}; not counted: {ttt['excludes']}"
    )
    if ttt.get("goodput") is not None:
        lines.extend(("first row's " if per_row else "") + line for line in goodput_lines(ttt["goodput"]))
    return lines


VERDICT_STYLE = {"fits": "green", "tight": "yellow", "does not fit": "red"}


def memory_verdict_text(est, markup: bool = True) -> str:
    """A StepEstimate's memory verdict as the estimate prints it, e.g. "tight (capacity inside 0.89–1.08 of the
    prediction)": where the capacity lies against the window in which a plan is tight (planner/memory_band.py
    ``tight_window``); the bare word where the estimate carries no band."""
    v = est.verdict
    word = f"[{VERDICT_STYLE[v]}]{v}[/]" if markup else v
    host = est.host_memory
    if host and not host.get("fits", True):  # the offloaded states overflow the node's host memory
        return (
            f"{word} (host memory: {host['bytes_per_node'] / 2**30:,.1f} GiB per node of "
            f"{host['capacity_bytes'] / 2**30:,.0f} GiB)"
        )
    b = est.memory_band
    if not b:
        return word
    ends = "{:.2f}–{:.2f}".format(*tight_window(b))
    where = {"fits": "above", "tight": "inside", "does not fit": "below"}[v]
    return f"{word} (capacity {where} {ends} of the prediction)"


def render_estimate(plan: Plan, con=None) -> None:
    """A plan's estimate as the terminal shows it: the layout, memory per stage, the verdict, FLOPs
    and bytes, the step-time breakdown with its out-of-sample range, throughput and the notes."""
    est = plan.estimate
    assert est is not None
    con = con or make_console()
    con.print(
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
    t = table(
        f"memory per rank, GiB (capacity {_gib(est.capacity_bytes)})",
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
            *(_gib(x) for x in (mb.weights, mb.gradients, mb.optimizer, mb.activations, mb.other, mb.total)),
            f"[{style}]{share:.0%}[/]" if style else f"{share:.0%}",
        )
    con.print(t)
    con.print(
        f"worst stage: {_gib(est.memory_bytes.total)} GiB of {_gib(est.capacity_bytes)} GiB — "
        f"{memory_verdict_text(est)} (as {plan.runtime} runs it)"
    )
    if est.memory_advice:
        con.print(f"memory: {est.memory_advice['text']}")
    if est.memory_band and est.memory_band.get("widened"):
        con.print(f"memory band: {est.memory_band['text']}")
    if est.trainer_memory_bytes is not None and plan.runtime != "exatrain":
        tv = "[green]fits[/]" if est.trainer_fits else "[red]does not fit[/]"
        con.print(f"with exatrain's own trainer as it runs today: {_gib(est.trainer_memory_bytes.total)} GiB — {tv}")
    con.print(
        f"FLOPs per step: model {est.model_flops_per_step:.3e}, hardware {est.hardware_flops_per_step:.3e}; "
        "bytes sent per rank per step: " + ", ".join(f"{k} {v / 1e9:,.2f} GB" for k, v in est.comm_bytes.items())
    )
    if est.time_s is not None:
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
                f" (MFU {est.mfu:.1%}, HFU {est.hfu:.1%}"
                + (f", against the {plan.dtype} peak" if plan.fp8 else "")
                + ")"
                if est.mfu is not None
                else ""
            )
        )
        if est.mfu_above_published:
            con.print(f"[yellow]flag: {est.mfu_above_published['text']}[/]")
    if est.time_to_train is not None:
        for line in run_lines(est.time_to_train):
            con.print(line)
    for note in est.notes:
        con.print(f"[dim]· {note}[/]")


def render_search(result, lines: list[str] | None, gpus: int, global_batch: int, con=None) -> None:
    """The ranked table of a search, its runtime, what was examined and rejected, and ``lines`` (the
    explanation of the winner, when asked for)."""
    first = result.ranked[0]
    con = con or make_console()
    runs = run_columns(result.ranked)
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
    con.print(t)
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
