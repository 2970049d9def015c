"""What every picture shares: the lazily imported matplotlib canvas, colours, and the ``Figure`` record.

matplotlib is imported only when a picture is drawn (planning commands start fast and run without
it), and only through ``matplotlib.figure.Figure`` with the Agg canvas: no pyplot, so no global
figure state and no GUI backend is ever touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exatrain.errors import UserError
from exatrain.units import GiB
DPI = 100

# Memory kinds in the order they stack (bottom to top), and their colours.
MEMORY_KINDS = ("weights", "gradients", "optimizer", "activations", "other")
MEMORY_COLORS = {"weights": "#4C72B0", "gradients": "#DD8452", "optimizer": "#55A868",
                 "activations": "#C44E52", "other": "#8172B3"}
# Step-time terms of ``TimeBreakdown`` in the order they stack, and their colours.
TIME_TERMS = ("compute", "bubble", "tp_comm", "pp_comm", "dp_comm", "optimizer", "other")
TIME_COLORS = {"compute": "#4C72B0", "bubble": "#BBBBBB", "tp_comm": "#DD8452", "pp_comm": "#C44E52",
               "dp_comm": "#8172B3", "optimizer": "#55A868", "other": "#937860"}
CAPACITY_COLOR = "#D62728"


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
        rgb.quantize(colors=palette, method=Image.Quantize.FASTOCTREE,
                     dither=Image.Dither.NONE).save(path, format="PNG")


def gib(x: float) -> str:
    return f"{x / GiB:,.1f} GiB"


def seconds(x: float) -> str:
    return f"{x:,.3g} s" if x < 100 else f"{x:,.1f} s"


def describe(plan: Any) -> str:
    """One line naming a plan: model, layout, batch, options and cluster."""
    where = f" on {plan.gpus} × {plan.cluster}" if plan.cluster else f" on {plan.gpus} devices"
    return (f"{plan.model.name}{where}: {plan.label}, micro-batch {plan.micro_batch}, global batch "
            f"{plan.global_batch}, ZeRO-{plan.zero_stage}, recompute {plan.recompute}"
            f"{', SP' if plan.sequence_parallel else ''}, {plan.schedule_label}")
