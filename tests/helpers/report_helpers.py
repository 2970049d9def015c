"""Helpers shared by the report tests (imported by name: tests run in pytest's prepend import mode)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def write_json(path: Path, obj: Any) -> Path:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def assert_png_drawn(path: Path) -> np.ndarray:
    """The PNG opens, has a sensible size, and is not blank: its pixels vary and hold more than one
    colour. Returns the RGB pixels."""
    from PIL import Image

    assert path.is_file(), path
    with Image.open(path) as im:
        assert im.format == "PNG"
        rgb = np.asarray(im.convert("RGB"))
    assert rgb.shape[0] >= 200 and rgb.shape[1] >= 400, rgb.shape
    assert float(rgb.var()) > 0.0
    assert bool((rgb != rgb[0, 0]).any())  # more than one colour
    return rgb


# ---- layout: what a person needs to read a picture at a glance ---------------------------------------
def _drawn_tick_labels(axis) -> list:
    """The major tick labels an axis drew: those at locations inside its view interval."""
    lo, hi = sorted(axis.get_view_interval())
    tol = 1e-9 * max(1.0, abs(lo), abs(hi))
    return [
        lab
        for loc, lab in zip(axis.get_majorticklocs(), axis.get_majorticklabels())
        if lo - tol <= loc <= hi + tol and lab.get_visible() and lab.get_text().strip()
    ]


def _rgb(c) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    return tuple(round(v, 3) for v in to_rgb(c))


def _legend_keys(leg) -> tuple[list[tuple[str, tuple]], list[tuple[str, tuple]]]:
    """(series, guides) of a legend as (label, key): a series (bar, marker, line with markers) is keyed
    by its colour, a guide (a plain line: capacity, ideal, ±25%) by colour and line style."""
    from matplotlib.collections import Collection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    series, guides = [], []
    for h, t in zip(leg.legend_handles, leg.get_texts()):
        label = t.get_text()
        if isinstance(h, Patch):
            series.append((label, _rgb(h.get_facecolor())))
        elif isinstance(h, Line2D):
            if h.get_marker() not in (None, "", "None", " "):
                face = h.get_markerfacecolor()
                series.append((label, _rgb(face if face not in ("none", None) else h.get_color())))
            else:
                guides.append((label, (_rgb(h.get_color()), str(h.get_linestyle()))))
        elif isinstance(h, Collection):
            fc = h.get_facecolor()
            series.append((label, _rgb(fc[0] if len(fc) else h.get_edgecolor()[0])))
    return series, guides


def _data_points(ax):
    """Display coordinates of the data an axes plots: scatter offsets, marker lines' vertices,
    bar corners."""
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer

    pts = []
    for c in ax.collections:
        if isinstance(c, PathCollection) and len(c.get_offsets()):
            pts.append(ax.transData.transform(np.asarray(c.get_offsets(), dtype=float)))
    for line in ax.lines:
        if line.get_marker() not in (None, "", "None", " ") and len(line.get_xdata()):
            pts.append(ax.transData.transform(np.column_stack([line.get_xdata(), line.get_ydata()]).astype(float)))
    for cont in ax.containers:
        if isinstance(cont, BarContainer):
            for r in cont.patches:
                if r.get_width() and r.get_height():
                    x, y, w, h = r.get_x(), r.get_y(), r.get_width(), r.get_height()
                    pts.append(ax.transData.transform(np.array([[x, y], [x + w, y + h]], dtype=float)))
    return np.concatenate(pts) if pts else np.zeros((0, 2))


def layout_problems(fig, categorical=frozenset(), min_span: float = 0.2, draw: bool = True) -> list[str]:  # noqa: C901
    """What would stop a person reading ``fig`` (a matplotlib Figure) at a glance. With ``draw``
    False the figure is read as its last draw left it — as ``savefig`` wrote it: constrained layout
    moves things a little on each draw, so a fresh draw can differ from the PNG.
    - a text (title, axis label, tick label, legend entry, annotation) reaching outside the canvas;
    - data squashed into a corner: on every numeric axis the data must reach at least ``min_span``
      of the axis from its low end (bars: the tallest bar's top, in the axis's own scale), and lie
      inside it;
    - fewer than three labelled ticks on a numeric axis, counting those of axes sharing it (panels
      with one time axis label it once); ``categorical``: (axes index, 'x' or 'y') pairs whose
      ticks name categories, which need their ticks on integer positions instead;
    - a legend whose series repeat a colour (or whose guides repeat colour and style), or that
      covers plotted data.
    """
    if draw:
        fig.canvas.draw()
    r = fig.canvas.get_renderer()
    box = fig.bbox
    out: list[str] = []
    tick_texts = set()
    axes = [ax for ax in fig.axes if ax.get_visible()]
    for ax in axes:
        for axis in (ax.xaxis, ax.yaxis):
            for t in axis.get_major_ticks() + axis.get_minor_ticks():
                tick_texts.update({id(t.label1), id(t.label2)})

    def outside(t, what: str) -> None:
        e = t.get_window_extent(r)
        if e.x0 < box.x0 - 1 or e.y0 < box.y0 - 1 or e.x1 > box.x1 + 1 or e.y1 > box.y1 + 1:
            out.append(f"{what} {t.get_text()!r} reaches outside the canvas ({e.bounds} vs {box.bounds})")

    from matplotlib.text import Text

    for t in fig.findobj(Text):
        if id(t) in tick_texts or not t.get_visible() or not t.get_text().strip():
            continue
        if t.axes is not None and not t.axes.axison and t in (t.axes.xaxis.label, t.axes.yaxis.label):
            continue
        outside(t, "text")
    for i, ax in enumerate(axes):
        if not ax.axison:
            continue
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            labels = _drawn_tick_labels(axis)
            for lab in labels:
                outside(lab, f"axes {i} {name} tick label")
            if (i, name) in categorical:
                locs = [loc for loc, lab in zip(axis.get_majorticklocs(), axis.get_majorticklabels()) if lab in labels]
                if not labels or any(abs(loc - round(loc)) > 1e-9 for loc in locs):
                    out.append(f"axes {i} {name}: categorical ticks must sit on the categories, got {locs}")
            elif (
                max(
                    len(_drawn_tick_labels(getattr(sib, f"{name}axis")))
                    for sib in getattr(ax, f"get_shared_{name}_axes")().get_siblings(ax)
                )
                < 3
            ):
                out.append(
                    f"axes {i} {name} ({ax.get_xlabel() if name == 'x' else ax.get_ylabel()!r}): "
                    f"{len(labels)} labelled ticks {[lab.get_text() for lab in labels]}, need 3"
                )
        pts = _data_points(ax)
        if len(pts):
            a = ax.transAxes.inverted().transform(pts)
            for k, name in ((0, "x"), (1, "y")):
                if (i, name) in categorical:
                    continue
                if a[:, k].max() < min_span:
                    out.append(f"axes {i}: data reach only {a[:, k].max():.1%} of the {name} axis")
                if a[:, k].min() < -0.01 or a[:, k].max() > 1.01:
                    out.append(f"axes {i}: data outside the {name} axis ({a[:, k].min():.2f}..{a[:, k].max():.2f})")
    legends = [ax.get_legend() for ax in axes if ax.get_legend() is not None] + list(fig.legends)
    for leg in legends:
        series, guides = _legend_keys(leg)
        for kind, items in (("series", series), ("guides", guides)):
            keys = [k for _, k in items]
            if len(set(keys)) != len(keys):
                out.append(f"legend {kind} share a colour: {items}")
        cols = [np.array(k) for _, k in series]
        for a_i in range(len(cols)):
            for b_i in range(a_i + 1, len(cols)):
                if np.linalg.norm(cols[a_i] - cols[b_i]) < 0.1:
                    out.append(f"legend series {series[a_i][0]!r} and {series[b_i][0]!r} have nearly the same colour")
        e = leg.get_window_extent(r)
        if e.x0 < box.x0 - 1 or e.y0 < box.y0 - 1 or e.x1 > box.x1 + 1 or e.y1 > box.y1 + 1:
            out.append(
                f"legend {[t.get_text() for t in leg.get_texts()][:3]}... reaches outside the canvas "
                f"({e.bounds} vs {box.bounds})"
            )
        for ax in axes:
            pts = _data_points(ax) if ax.axison else np.zeros((0, 2))
            inside = (pts[:, 0] > e.x0) & (pts[:, 0] < e.x1) & (pts[:, 1] > e.y0) & (pts[:, 1] < e.y1)
            if inside.any():
                out.append(
                    f"legend {[t.get_text() for t in leg.get_texts()][:3]}... covers {int(inside.sum())} data points"
                )
    return out
