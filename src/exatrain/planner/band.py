"""The uncertainty band of a step-time estimate: how far published runs landed from the prediction.

``benchmarks/prediction_error.py --write-bands`` predicts every published run it can price
out of sample (leave one source out) and stores, per (engine, hardware family), the 10th and 90th
percentiles of measured / predicted step time in ``catalog/data/error_bands.json``. An estimate
then carries ``step_range_s = step_s * [p10, p90]`` with the cell it came from and its n.

Which cell answers (``band_for``): the plan's runtime on its device's family when that cell holds
at least ``MIN_RUNS`` runs; else every engine on that family; else, for a family with some runs but
too few, every run of every family ("all/all") widened to cover that family's own p10-p90; a family
with no published run at all gets ``WIDE_DEFAULT`` and says so. The default is a stated convention, not a measurement: a
factor of three either way, wider than every measured cell (the MI250X runs reach ×2.25; the band test checks it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from exatrain.catalog.hardware import ClusterSpec
from exatrain.plan import Plan, StepEstimate

BANDS_PATH = Path(__file__).resolve().parents[1] / "catalog" / "data" / "error_bands.json"
MIN_RUNS = 5  # fewer runs than this in a cell: its p10/p90 say little, fall back to a wider cell
WIDE_DEFAULT = (0.33, 3.0)  # measured / predicted where nothing is known (convention, see above)

# Hardware family of each catalog device (catalog/data/hardware.toml): devices whose kernels and
# software stacks behave alike share one family's published runs.
FAMILIES = {"a100-80gb": "A100", "h100-sxm": "H100/H200", "h200-sxm": "H100/H200", "h100-sxm-500w": "H100 500W",
            "b200": "B200",
            "mi250x-gcd": "MI250X", "mi300x": "MI300X", "mi355x": "MI355X", "cpu": "CPU"}


def hardware_family(device_name: str) -> str:
    """The family a device's band is looked up under (its own name when the table has none)."""
    return FAMILIES.get(device_name, device_name)


@dataclass(frozen=True)
class Band:
    """A range of measured / predicted step time and where it came from."""

    low: float  # measured / predicted, 10th percentile
    high: float  # 90th percentile
    n: int  # runs behind it (0 for the default)
    engine: str  # the cell's engine ("all" when every engine's runs)
    family: str  # the cell's hardware family ("all" when every family's)
    basis: str  # "out of sample" | "default"
    statistic: str = "p10-p90 of measured/predicted step time"
    widened_by: tuple[int, str] | None = None  # (n, family): that family's own runs widened the band

    @property
    def cell(self) -> str:
        return "default" if self.basis == "default" else f"{self.engine}/{self.family}"

    def describe(self) -> str:
        """One phrase for the estimate's step line."""
        if self.basis == "default":
            return (f"×{self.low:g}–×{self.high:g}: no published runs on {self.family} hardware, "
                    "wide default")
        who = "runs" if self.engine == "all" else f"{self.engine} runs"
        where = "all hardware" if self.family == "all" else self.family
        extra = f", widened to the n={self.widened_by[0]} {self.widened_by[1]} runs" if self.widened_by else ""
        return f"p10–p90 of n={self.n} {who} on {where}{extra}, out of sample"

    def to_dict(self) -> dict[str, Any]:
        return {"cell": self.cell, "engine": self.engine, "family": self.family, "n": self.n,
                "ratio_low": self.low, "ratio_high": self.high, "basis": self.basis,
                "statistic": self.statistic, "text": self.describe(),
                **({"widened_by": {"n": self.widened_by[0], "family": self.widened_by[1]}} if self.widened_by else {})}


@lru_cache(maxsize=4)
def load_bands(path: Path = BANDS_PATH) -> Mapping[str, Any]:
    """The stored table ({} when the file is absent: every estimate then gets the default)."""
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def band_for(runtime: str, device_name: str, table: Mapping[str, Any] | None = None) -> Band:
    """The band an estimate for ``runtime`` on ``device_name`` carries (fallback order above)."""
    table = load_bands() if table is None else table
    cells = table.get("cells", {})
    family = hardware_family(device_name)
    for engine, fam in ((runtime, family), ("all", family)):
        c = cells.get(f"{engine}/{fam}")
        if c and c["n"] >= MIN_RUNS:
            return Band(c["ratio_low"], c["ratio_high"], c["n"], engine, fam, "out of sample")
    own, c = cells.get(f"all/{family}"), cells.get("all/all")
    if own and own["n"] and c and c["n"] >= MIN_RUNS:
        # Too few runs on this family for its own quantiles, but never narrower than what they showed.
        return Band(min(c["ratio_low"], own["ratio_low"]), max(c["ratio_high"], own["ratio_high"]), c["n"],
                    "all", "all", "out of sample", widened_by=(own["n"], family))
    return Band(*WIDE_DEFAULT, 0, runtime, family, "default")


def step_range(step_s: float, tokens_per_step: int, band: Band) -> tuple[tuple[float, float], tuple[float, float]]:
    """([low, high] seconds, [low, high] tokens/s) of a step predicted at ``step_s``."""
    lo, hi = step_s * band.low, step_s * band.high
    return (lo, hi), (tokens_per_step / hi, tokens_per_step / lo)


def with_band(estimate: StepEstimate, plan: Plan, cluster: ClusterSpec) -> StepEstimate:
    """``estimate`` carrying the band of ``plan.runtime`` on ``cluster``'s device (unchanged without a time).
    The table measures the shipped priors; an estimate made with a calibration file gets the same band."""
    if estimate.time_s is None:
        return estimate
    b = band_for(plan.runtime, cluster.device.name)
    steps, tokens = step_range(estimate.time_s.step, plan.tokens_per_step, b)
    return estimate.replace(step_range_s=steps, tokens_per_s_range=tokens, band=b.to_dict())
