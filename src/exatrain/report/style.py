"""What every picture shares: the lazily imported matplotlib canvas, colours, and the ``Figure`` record.

matplotlib is imported only when a picture is drawn (planning commands start fast and run without
it), and only through ``matplotlib.figure.Figure`` with the Agg canvas: no pyplot, so no global
figure state and no GUI backend is ever touched.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from exatrain.errors import UserError

from exatrain.units import GiB

MiB = 1024**2
KiB = 1024
DPI = 100

# Colour-blind-safe palettes. Okabe & Ito, "Color Universal Design" (2008): eight colours told apart
# under the common colour-vision deficiencies; used for the fixed kinds below. Paul Tol, "Colour
# schemes", SRON/EPS/TN/09-002 (2021), qualitative "muted" scheme: nine colours for series whose
# number varies (tp·pp families, runs); more series than that are grouped as "other" in grey.
OKABE_ITO = {
    "orange": "#E69F00",
    "sky": "#56B4E9",
    "green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "purple": "#CC79A7",
    "black": "#000000",
}
TOL_MUTED = ("#332288", "#88CCEE", "#44AA99", "#117733", "#999933", "#DDCC77", "#CC6677", "#882255", "#AA4499")
OTHER_COLOR = "#BBBBBB"

# Memory kinds in the order they stack (bottom to top), and their colours.
MEMORY_KINDS = ("weights", "gradients", "optimizer", "activations", "other")
MEMORY_COLORS = {
    "weights": OKABE_ITO["blue"],
    "gradients": OKABE_ITO["sky"],
    "optimizer": OKABE_ITO["green"],
    "activations": OKABE_ITO["orange"],
    "other": OKABE_ITO["purple"],
}
# Step-time terms of ``TimeBreakdown`` in the order they stack, and their colours.
TIME_TERMS = ("compute", "bubble", "tp_comm", "pp_comm", "dp_comm", "optimizer", "other", "straggler", "offload")
TIME_COLORS = {
    "compute": OKABE_ITO["blue"],
    "bubble": OTHER_COLOR,
    "tp_comm": OKABE_ITO["orange"],
    "pp_comm": OKABE_ITO["vermillion"],
    "dp_comm": OKABE_ITO["purple"],
    "optimizer": OKABE_ITO["green"],
    "other": OKABE_ITO["yellow"],
    "straggler": OKABE_ITO["sky"],
    "offload": TOL_MUTED[7],
}
CAPACITY_COLOR = "#000000"  # a dashed black line: apart from every palette colour


def series_colors(n: int) -> list[str]:
    """``n`` distinct colours for n series (at most len(TOL_MUTED); see ``top_series``)."""
    if n > len(TOL_MUTED):
        raise ValueError(f"{n} series but {len(TOL_MUTED)} distinct colours; group the rest with top_series")
    return list(TOL_MUTED[:n])


def top_series(names: Sequence[str], limit: int = len(TOL_MUTED)) -> tuple[list[str], set[str]]:
    """The distinct names in first-seen order, split into the first ``limit`` - 1 (when there are more
    than ``limit``) that get their own colour, and the rest, drawn together in grey as "other"."""
    distinct = list(dict.fromkeys(names))
    if len(distinct) <= limit:
        return distinct, set()
    return distinct[: limit - 1], set(distinct[limit - 1 :])


@dataclass(frozen=True)
class Figure:
    """One picture of a report: its PNG (a name relative to the report folder), what it shows, and
    the numbers it drew, in the units of the JSON it came from (so a test can compare them)."""

    file: str
    title: str
    caption: str
    numbers: dict[str, Any]
    key_numbers: tuple[tuple[str, str], ...] = field(default_factory=tuple)


def new_figure(width_in: float, height_in: float, nrows: int = 1, ncols: int = 1, **kw: Any):
    """A matplotlib Figure on the Agg canvas and its axes (``squeeze``d like pyplot.subplots)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure as MplFigure
    except ImportError:
        raise UserError("pictures need matplotlib: pip install 'exatrain[report]'") from None
    fig = MplFigure(figsize=(width_in, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, **kw)
    return fig, axes


def save(fig: Any, path: Path, palette: int | None = None) -> None:
    """Write the figure as PNG (no software tag, so the same input gives the same bytes). With
    ``palette``, reduce it to that many colours (Pillow, which matplotlib itself requires): dense
    timelines blend colours per pixel and would otherwise weigh megabytes."""
    fig.savefig(path, format="png", dpi=DPI, metadata={"Software": None})
    if palette:
        from PIL import Image

        with Image.open(path) as im:
            rgb = im.convert("RGB")
        rgb.quantize(colors=palette, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(
            path, format="PNG"
        )


def byte_unit(max_bytes: float) -> tuple[int, str]:
    """The unit that reads at a glance for amounts up to ``max_bytes``: GiB from 1 GiB, MiB from
    1 MiB, KiB below (a 2-stage gpt-tiny plan holds a few MiB per rank, a 1T stage tens of GiB)."""
    if max_bytes >= GiB:
        return GiB, "GiB"
    if max_bytes >= MiB:
        return MiB, "MiB"
    return KiB, "KiB"


def human_bytes(x: float) -> str:
    """Bytes in the unit that fits them (``byte_unit``), one decimal."""
    div, unit = byte_unit(x)
    return f"{x / div:,.1f} {unit}"


def percent(x: float) -> str:
    """A share as a percentage with the digits it needs: 38%, 4.2%, 0.019%."""
    if x == 0 or abs(x) >= 0.1:
        return f"{x:.0%}"
    return f"{100 * x:.2g}%"


def compact(x: float) -> str:
    """A tick label without exponents: 0.05, 3, 750, 1.5k, 20k, 1.5M."""
    a = abs(x)
    if a >= 1e9:
        return f"{x / 1e9:,.3g}G"
    if a >= 1e6:
        return f"{x / 1e6:,.3g}M"
    if a >= 1e3:
        return f"{x / 1e3:,.3g}k"
    return f"{x:,.4g}"


def wrap(text: str, width_in: float, fontsize: float) -> str:
    """``text`` broken at spaces into lines no wider than ``width_in`` inches at ``fontsize``
    points (DejaVu Sans, matplotlib's default face, averages under 0.6 em per character)."""
    chars = max(16, int(width_in * 72 / (0.6 * fontsize)))
    return "\n".join(textwrap.wrap(text, chars, break_long_words=False, break_on_hyphens=False))


def log_or_linear(ax: Any, axis: str, lo: float, hi: float, min_ticks: int = 3) -> str:
    """Put ``axis`` ('x' or 'y') of ``ax`` over [lo, hi] on a log scale with at least ``min_ticks``
    labelled ticks (decades, else 1-2-5 or 1-2-3-5 per decade, else every integer multiple); a range too narrow
    for that is drawn linear. Returns the scale used."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter

    a = getattr(ax, f"{axis}axis")
    set_lim = ax.set_xlim if axis == "x" else ax.set_ylim
    set_scale = ax.set_xscale if axis == "x" else ax.set_yscale
    fmt = FuncFormatter(lambda v, _pos: compact(v))
    if lo > 0 and hi > lo:
        for subs in ((1,), (1, 2, 5), (1, 2, 3, 5), tuple(range(1, 10))):
            ticks = [
                s * 10.0**k
                for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
                for s in subs
                if lo <= s * 10.0**k <= hi
            ]
            if min_ticks <= len(ticks) <= 12:
                set_scale("log")
                set_lim(lo, hi)
                a.set_major_locator(FixedLocator(ticks))
                a.set_major_formatter(fmt)
                a.set_minor_formatter(NullFormatter())
                return "log"
    set_scale("linear")
    set_lim(lo, hi)
    a.set_major_locator(MaxNLocator(nbins=6, min_n_ticks=min_ticks))
    a.set_major_formatter(fmt)
    return "linear"


def legend_columns(labels: Sequence[str], width_in: float, fontsize: float) -> int:
    """The most legend columns that fit in ``width_in`` inches. matplotlib fills the columns top to
    bottom, ceil(n / ncol) entries each; a column is as wide as its longest label (``wrap``'s
    estimate per character) plus about four em for the handle and the gaps."""
    em_in = fontsize / 72
    lengths = [len(s) for s in labels] or [1]
    for ncol in range(len(lengths), 1, -1):
        rows = -(-len(lengths) // ncol)
        cols = [lengths[i : i + rows] for i in range(0, len(lengths), rows)]
        if sum((0.6 * max(c) + 4.0) * em_in for c in cols) <= width_in:
            return ncol
    return 1


def seconds(x: float) -> str:
    return f"{x:,.3g} s" if x < 100 else f"{x:,.1f} s"


def describe(plan: Any) -> str:
    """One line naming a plan: model, layout, batch, options and cluster."""
    where = f" on {plan.gpus} × {plan.cluster}" if plan.cluster else f" on {plan.gpus} devices"
    return (
        f"{plan.model.name}{where}: {plan.label}, micro-batch {plan.micro_batch}, global batch "
        f"{plan.global_batch}, ZeRO-{plan.zero_stage}, recompute {plan.recompute}"
        f"{', SP' if plan.sequence_parallel else ''}, {plan.schedule_label}"
        f"{plan.settings_label}"
    )
