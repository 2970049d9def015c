"""What the terminal renderings share (exatrain.report.text): a rich console and table, progress lines, number
formats, the run-table columns, the time-to-train and goodput lines, and the memory verdict's words."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Callable, Iterator

from exatrain.plan import Plan
from exatrain.planner.memory_band import tight_window
from exatrain.units import GiB


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


def in_gib(x: float) -> str:
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


__all__ = [
    "VERDICT_STYLE",
    "in_gib",
    "goodput_lines",
    "make_console",
    "memory_verdict_text",
    "opt",
    "progress_lines",
    "run_cells",
    "run_columns",
    "run_lines",
    "run_titles",
    "table",
]
