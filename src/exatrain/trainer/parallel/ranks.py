"""A global rank's place in a plan's mesh, and back: arithmetic only, no torch, so that a launcher can
name a failed rank's tp/pp/dp place (failures.py) without importing torch. The order is mesh.py's:
(pp, dp, cp, tp), tp fastest."""

from __future__ import annotations

from exatrain.plan import Plan


def coordinates(rank: int, plan: Plan) -> tuple[int, int, int]:
    """(pp_rank, dp_rank, tp_rank) of a global rank (its cp rank: ``cp_coordinate``)."""
    tp, cp, dp = plan.tp, plan.cp, plan.dp
    return rank // (tp * cp * dp), (rank // (tp * cp)) % dp, rank % tp


def cp_coordinate(rank: int, plan: Plan) -> int:
    """The context-parallel rank of a global rank."""
    return (rank // plan.tp) % plan.cp


def global_rank(plan: Plan, pp_rank: int, dp_rank: int, tp_rank: int, cp_rank: int = 0) -> int:
    return ((pp_rank * plan.dp + dp_rank) * plan.cp + cp_rank) * plan.tp + tp_rank


__all__ = ["coordinates", "cp_coordinate", "global_rank"]
