"""Published measurements that predictions are drawn beside: scaling efficiencies of studies
(``data/studies.toml``, each entry with its source), read by ``exatrain scaling`` and the report."""

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
                entry = MeasuredScaling(model=str(row["model"]), cluster=str(row["cluster"]), mode=str(row["mode"]),
                                        gpus=int(row["gpus"]), efficiency=float(row["efficiency"]),
                                        source=str(row["source"]), range_stated=bool(row.get("range_stated", True)))
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
    hits = [s for s in measured_scaling() if s.model == model and s.cluster == cluster
            and (mode is None or s.mode == mode)]
    return tuple(sorted(hits, key=lambda s: MODES.index(s.mode)))


__all__ = ["MeasuredScaling", "measured_scaling", "study_scaling"]
