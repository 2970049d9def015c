"""Weak and strong scaling: predicted throughput and efficiency over GPU counts, the ideal line, and
the Frontier study's measured efficiency where the model and cluster are the study's.

Efficiency as ``exatrain scaling`` computes it: tokens/s relative to the first point scaled by the
GPU count (weak: per-GPU throughput at a per-GPU batch held constant; strong: at a fixed global
batch) — both equal tokens/s ÷ (first tokens/s × n / first n), which is what the ideal line draws.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from exatrain.catalog.studies import study_scaling
from exatrain.report.inputs import ScalingInput
from exatrain.report.style import OKABE_ITO, Figure, log_or_linear, new_figure, save


def study_point(model: str, cluster: str, mode: str) -> dict[str, Any] | None:
    """The study's measured (GPUs, efficiency) for this model, cluster and mode, if it has one
    (the catalog's data/studies.toml, which cites its source)."""
    hit = next(iter(study_scaling(model, cluster, mode)), None)
    if hit is None:
        return None
    return {"gpus": hit.gpus, "efficiency": hit.efficiency, "source": hit.source}


def _throughput_panel(ax, numbers: dict[str, Any], series: str) -> None:
    """Predicted tokens/s against GPUs, with the ideal line from the first point."""
    gpus, tokens, ideal = numbers["gpus"], numbers["tokens_per_s"], numbers["ideal_tokens_per_s"]
    ax.plot(gpus, tokens, "o-", color=series, label="predicted")
    ax.plot(gpus, ideal, "--", color="gray", label="ideal (linear from the first point)")
    ax.set_xscale("log", base=2)
    lo, hi = min(tokens + ideal), max(tokens + ideal)
    log_or_linear(ax, "y", lo / 1.15, hi * 1.15)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("tokens/s")
    ax.set_title(
        f"{numbers['mode']} scaling of {numbers['model']} on {numbers['cluster'] or 'the cluster'}: throughput",
        fontsize=9,
    )
    ax.legend(fontsize=8, loc="upper left")


def _efficiency_points(bx, numbers: dict[str, Any], series: str) -> tuple[np.ndarray, list[int]]:
    """Predicted efficiency against GPUs (each point's layout written under it), 100% and the study's measured
    point; (efficiency in %, the GPU counts drawn)."""
    gpus, study, mode = numbers["gpus"], numbers["study"], numbers["mode"]
    eff = 100 * np.asarray(numbers["efficiency"])
    bx.plot(gpus, eff, "o-", color=series, label="predicted")
    bx.axhline(100, linestyle="--", color="gray", label="ideal 100%")
    for n, e, lay in zip(gpus, eff, numbers["layouts"]):
        bx.annotate(lay, (n, e), textcoords="offset points", xytext=(0, -12), ha="center", fontsize=7)
    xs = list(gpus)
    if study:
        bx.plot(
            [study["gpus"]],
            [100 * study["efficiency"]],
            "D",
            color=OKABE_ITO["vermillion"],
            markersize=8,
            label=f"measured: {study['source']}",
        )
        bx.annotate(
            f"{study['efficiency']:.0%} {mode} at {study['gpus']:,} GCDs",
            (study["gpus"], 100 * study["efficiency"]),
            textcoords="offset points",
            xytext=(-8, 8),
            ha="right",
            fontsize=7,
            color=OKABE_ITO["vermillion"],
        )
        xs.append(study["gpus"])
    return eff, xs


def _caption(numbers: dict[str, Any]) -> str:
    """What the panels predict, and the study the red diamond stands for."""
    mode, model, gpus, study = numbers["mode"], numbers["model"], numbers["gpus"], numbers["study"]
    caption = (
        f"Predicted {mode} scaling (`exatrain scaling`, best or pinned layout per count): "
        f"{numbers['efficiency'][-1]:.1%} efficiency at {gpus[-1]:,} GPUs relative to {gpus[0]:,}."
    )
    if study:
        caption += (
            f" The red diamond is what the Frontier study ({study['source']}) measured for {model}: "
            f"{study['efficiency']:.0%} {mode} scaling"
            + (
                f" to {study['gpus']:,} GCDs."
                if mode == "weak"
                else f" (range not stated in our sources; drawn at {study['gpus']:,} GCDs)."
            )
        )
    return caption


def scaling_curves(scaling: ScalingInput, path: Path) -> Figure:
    """Two panels: tokens/s vs GPUs with the ideal line, and efficiency vs GPUs with 100% and the
    study's point; return the numbers drawn."""
    pts = scaling.points
    first = pts[0]
    model, cluster = first.plan.model.name, first.plan.cluster
    gpus = [p.gpus for p in pts]
    tokens = [float(p.plan.estimate.tokens_per_s) for p in pts]
    ideal = [tokens[0] * n / gpus[0] for n in gpus]
    study = study_point(model, cluster, scaling.mode)
    numbers = {
        "mode": scaling.mode,
        "model": model,
        "cluster": cluster,
        "gpus": gpus,
        "global_batch": [p.global_batch for p in pts],
        "tokens_per_s": tokens,
        "ideal_tokens_per_s": ideal,
        "efficiency": [p.efficiency for p in pts],
        "layouts": [p.plan.label for p in pts],
        "study": study,
    }

    fig, (ax, bx) = new_figure(11.0, 4.4, ncols=2)
    series = OKABE_ITO["blue"]
    _throughput_panel(ax, numbers, series)
    eff, xs = _efficiency_points(bx, numbers, series)
    bx.set_xscale("log", base=2)
    for a, counts in ((ax, gpus), (bx, xs)):
        _gpu_axis(a, counts)
    low = min([float(eff.min()), 100 * study["efficiency"] if study else 100.0])
    bx.set_ylim(min(80.0, low - 5), 105)
    bx.set_xlabel("GPUs")
    bx.set_ylabel("scaling efficiency, %")
    bx.set_title("efficiency relative to the first point", fontsize=9)
    bx.legend(fontsize=7, loc="lower left")
    save(fig, path)

    caption = _caption(numbers)
    key = tuple((f"{n:,} GPUs", f"{t:,.0f} tokens/s, {e:.1%}") for n, t, e in zip(gpus, tokens, numbers["efficiency"]))
    return Figure(
        file=path.name, title=f"{scaling.mode.capitalize()} scaling", caption=caption, numbers=numbers, key_numbers=key
    )


def _gpu_axis(ax: Any, counts: list[int]) -> None:
    """A log2 GPU axis labelled at the GPU counts themselves (as numbers, not powers of two); with
    fewer than three distinct counts it widens by factors of two and labels those counts too, so
    the axis keeps three ticks to read the spacing by."""
    ticks = sorted(set(counts))
    while len(ticks) < 3:
        ticks = sorted({*ticks, ticks[0] // 2 if ticks[0] > 1 else ticks[-1] * 2})
    ax.set_xlim(ticks[0] / 1.3, ticks[-1] * 1.3)
    ax.set_xticks(ticks, [f"{n:,}" for n in ticks], fontsize=8)
    ax.minorticks_off()
