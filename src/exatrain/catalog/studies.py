"""Published measurements that predictions are drawn beside: scaling efficiencies of studies, read by ``exatrain
scaling`` and the report, and the highest model-FLOPs utilization published per device class and precision, which an
estimate above it is flagged against (``data/studies.toml``, each entry with its source)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from exatrain.catalog.models import _load_table_file
from exatrain.errors import UserError

MODES = ("weak", "strong")


@dataclass(frozen=True)
class MeasuredScaling:
    """What a study measured: ``efficiency`` of ``mode`` scaling reached at ``gpus`` devices."""

    model: str  # catalog preset name
    cluster: str  # catalog cluster name
    mode: str  # weak | strong
    gpus: int
    efficiency: float  # 1.0 = ideal
    source: str
    range_stated: bool = True  # False: the study does not state the GPU range; ``gpus`` is our placement


_STUDIES: tuple[MeasuredScaling, ...] | None = None


def measured_scaling() -> tuple[MeasuredScaling, ...]:
    """Every scaling measurement in the catalog (read once from data/studies.toml)."""
    global _STUDIES
    if _STUDIES is None:
        path = Path(__file__).with_name("data") / "studies.toml"
        rows = []
        for i, row in enumerate(_load_table_file(path).get("scaling", [])):
            try:
                entry = MeasuredScaling(
                    model=str(row["model"]),
                    cluster=str(row["cluster"]),
                    mode=str(row["mode"]),
                    gpus=int(row["gpus"]),
                    efficiency=float(row["efficiency"]),
                    source=str(row["source"]),
                    range_stated=bool(row.get("range_stated", True)),
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise UserError(f"{path.name}: scaling[{i}] is malformed ({exc})") from None
            if entry.mode not in MODES:
                raise UserError(f"{path.name}: scaling[{i}]: mode must be weak or strong, got {entry.mode!r}")
            rows.append(entry)
        _STUDIES = tuple(rows)
    return _STUDIES


def study_scaling(model: str, cluster: str, mode: str | None = None) -> tuple[MeasuredScaling, ...]:
    """The measurements for exactly this model and cluster (a preset with overridden fields, e.g.
    'gpt-175b*', is not the study's model), optionally of one mode, weak first."""
    hits = [
        s for s in measured_scaling() if s.model == model and s.cluster == cluster and (mode is None or s.mode == mode)
    ]
    return tuple(sorted(hits, key=lambda s: MODES.index(s.mode)))


@dataclass(frozen=True)
class BestMfu:
    """The highest MFU (model FLOPs, ``accounting.flops.model_flops_per_step``, over the catalog's dense peak of the
    precision) measured on ``devices`` in ``precision`` ("16-bit": bf16 or fp16; "fp8": FP8 GEMMs, against the
    16-bit peak as exatrain states MFU), by the run ``run`` of ``source``."""

    devices: tuple[str, ...]  # catalog device names
    precision: str  # 16-bit | fp8
    mfu: float
    run: str
    source: str


PRECISIONS = ("16-bit", "fp8")
_BEST: tuple[BestMfu, ...] | None = None


def best_published_mfu() -> tuple[BestMfu, ...]:
    """Every best-published-MFU entry of the catalog (read once from data/studies.toml ``[[mfu]]``)."""
    global _BEST
    if _BEST is None:
        path = Path(__file__).with_name("data") / "studies.toml"
        rows = []
        for i, row in enumerate(_load_table_file(path).get("mfu", [])):
            try:
                entry = BestMfu(
                    devices=tuple(str(d) for d in row["devices"]),
                    precision=str(row["precision"]),
                    mfu=float(row["mfu"]),
                    run=str(row["run"]),
                    source=str(row["source"]),
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise UserError(f"{path.name}: mfu[{i}] is malformed ({exc})") from None
            if entry.precision not in PRECISIONS or not 0 < entry.mfu < 1:
                raise UserError(f"{path.name}: mfu[{i}]: precision must be 16-bit or fp8 and mfu in (0, 1)")
            rows.append(entry)
        _BEST = tuple(rows)
    return _BEST


def best_mfu_for(device: str, fp8: bool) -> BestMfu | None:
    """The best published MFU of ``device``'s class in 16-bit or FP8 training (None: none published)."""
    precision = "fp8" if fp8 else "16-bit"
    return next((b for b in best_published_mfu() if device in b.devices and b.precision == precision), None)


__all__ = ["BestMfu", "MeasuredScaling", "best_mfu_for", "best_published_mfu", "measured_scaling", "study_scaling"]
