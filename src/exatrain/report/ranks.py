"""The ranks of a run side by side: compute and wait seconds per step, and who was slow when.

Read from a metrics file's ``ranks`` lines, the straggler windows the trainer writes every
``--straggler-every`` steps (trainer/health.py says how compute and wait are measured on CPU and CUDA):
each line holds, per rank, the mean compute and wait seconds per step over its window, the ranks'
(tp, pp, dp) coordinates, the ranks slow in that window and the stragglers it names (slow two windows
running). The top panel stacks each rank's compute and wait per step over the whole run (stragglers
outlined in red); the bottom one follows each rank's compute over the windows, as lines for up to
16 ranks and as a rank x window picture of compute over the stage median beyond that. The windows
drawn are those of the file's last run that has any (runs end at their RunRecord); lines a resumed
run superseded are not read.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from exatrain.errors import UserError
from exatrain.report.style import Figure, new_figure, save

COMPUTE_COLOR = "#4C72B0"
WAIT_COLOR = "#BBBBBB"
STRAGGLER_COLOR = "#D62728"
MAX_LINES = 16  # ranks drawn as lines in the lower panel; more become a picture


def read_windows(path: str | Path) -> list[dict[str, Any]]:
    """The ``ranks`` lines of the file's last run that has any (UserError for an unreadable file)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read ({exc})") from None
    runs: list[list[dict]] = [[]]
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        if obj.get("kind") == "run_record":
            runs.append([])
        elif obj.get("kind") == "ranks" and _valid(obj):
            runs[-1].append(obj)
    return next((r for r in reversed(runs) if r), [])


def _valid(w: dict) -> bool:
    c, t, coords = w.get("compute_s"), w.get("wait_s"), w.get("coords")
    return (
        isinstance(c, list)
        and isinstance(t, list)
        and isinstance(coords, list)
        and len(c) == len(t) == len(coords)
        and len(c) > 0
        and all(isinstance(x, (int, float)) for x in c + t)
        and isinstance(w.get("first_step"), int)
        and isinstance(w.get("last_step"), int)
    )


def _mean_bars(top, compute: list[float], wait: list[float], stragglers: list[int], coords: list, span: str) -> None:
    """Each rank's mean compute and wait per step as stacked bars, stragglers outlined; ``span``: the steps and
    windows averaged over, for the title."""
    n = len(compute)
    x = list(range(n))
    top.bar(x, compute, color=COMPUTE_COLOR, label="compute")
    top.bar(x, wait, bottom=compute, color=WAIT_COLOR, label="wait (collectives, peers, the OS)")
    for r in stragglers:
        top.bar([r], [compute[r] + wait[r]], fill=False, edgecolor=STRAGGLER_COLOR, linewidth=2)
        top.annotate(
            "straggler",
            (r, compute[r] + wait[r]),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
            va="bottom",
            color=STRAGGLER_COLOR,
            fontsize=8,
        )
    top.set_ylim(0, max(c + w for c, w in zip(compute, wait)) * 1.15 or 1.0)
    top.set_ylabel("seconds per step (mean)")
    top.set_xlabel("rank" + (" (tp, pp, dp)" if n <= 16 else ""))
    every = max(1, n // 32)
    ticks = x[::every]
    top.set_xticks(ticks)
    top.set_xticklabels(
        [f"{r}\n{coords[r][0]},{coords[r][1]},{coords[r][2]}" if n <= 16 else str(r) for r in ticks], fontsize=8
    )
    top.set_title(f"compute and wait per rank over {span}")
    top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _window_panel(fig, low, windows: list[dict], coords: list, stragglers: list[int]) -> None:
    """Each rank's compute per window: a line per rank for a few ranks, else a heat map of compute against the
    median of its stage peers."""
    n = len(windows[0]["compute_s"])
    ends = [w["last_step"] for w in windows]
    stage = [c[1] for c in coords]
    if n <= MAX_LINES:
        for r in range(n):
            slow = r in stragglers
            low.plot(
                ends,
                [w["compute_s"][r] for w in windows],
                marker="o",
                markersize=3,
                color=STRAGGLER_COLOR if slow else None,
                linewidth=2.2 if slow else 1.0,
                label=f"rank {r}" + (" (straggler)" if slow else ""),
            )
        low.set_ylabel("compute, seconds per step")
        low.set_ylim(bottom=0)
        low.legend(fontsize=7, ncol=max(1, (n + 7) // 8), loc="upper left", bbox_to_anchor=(1.0, 1.0))
    else:
        ratio = [
            [w["compute_s"][r] / max(1e-12, _peer_median(w["compute_s"], stage, r)) for w in windows] for r in range(n)
        ]
        im = low.imshow(
            ratio,
            aspect="auto",
            cmap="viridis",
            interpolation="nearest",
            extent=(-0.5, len(windows) - 0.5, n - 0.5, -0.5),
        )
        low.set_xticks(range(len(windows)))
        low.set_xticklabels([str(e) for e in ends], fontsize=7)
        low.set_ylabel("rank")
        fig.colorbar(im, ax=low, label="compute / stage peers' median")


def rank_times(path: str | Path, out: Path) -> Figure | None:
    """Draw the per-rank picture of ``path`` into ``out``; None when the file has no straggler windows."""
    windows = read_windows(path)
    if not windows:
        return None
    n = len(windows[0]["compute_s"])
    windows = [w for w in windows if len(w["compute_s"]) == n]
    coords = [tuple(c) for c in windows[0]["coords"]]  # (tp, pp, dp)
    weights = [w["last_step"] - w["first_step"] + 1 for w in windows]
    steps = sum(weights)
    compute = [sum(w["compute_s"][r] * k for w, k in zip(windows, weights)) / steps for r in range(n)]
    wait = [sum(w["wait_s"][r] * k for w, k in zip(windows, weights)) / steps for r in range(n)]
    stragglers = sorted({r for w in windows for r in w.get("stragglers", []) if 0 <= r < n})

    fig, (top, low) = new_figure(max(7.0, min(16.0, 0.45 * n + 4)), 7.5, nrows=2)
    _mean_bars(top, compute, wait, stragglers, coords, f"{steps} steps ({len(windows)} windows)")
    _window_panel(fig, low, windows, coords, stragglers)
    low.set_xlabel("last step of the window")
    save(fig, out)
    caption = (
        f"Mean compute and wait seconds per step of each of {n} ranks over {steps} steps; "
        + (
            f"straggler{'s' if len(stragglers) > 1 else ''}: rank{'s' if len(stragglers) > 1 else ''} "
            f"{', '.join(map(str, stragglers))}"
            if stragglers
            else "no straggler"
        )
        + " (compute above 1.3 x its stage peers' median two windows running)."
    )
    return Figure(
        file=out.name,
        title="Ranks: compute and wait",
        caption=caption,
        numbers={
            "compute_s": compute,
            "wait_s": wait,
            "stragglers": stragglers,
            "steps": steps,
            "windows": len(windows),
            "coords": [list(c) for c in coords],
        },
    )


def _peer_median(values: list[float], stage: list[int], r: int) -> float:
    peers = [values[q] for q in range(len(values)) if q != r and stage[q] == stage[r]]
    return statistics.median(peers) if peers else values[r]


__all__ = ["rank_times", "read_windows"]
