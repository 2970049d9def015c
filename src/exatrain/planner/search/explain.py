"""Why the winner of a search wins: the step-time terms that differ most from each runner-up."""

from __future__ import annotations

from typing import Sequence

from exatrain.plan import Plan

GiB = 1024**3
TERMS = ("compute", "bubble", "tp_comm", "pp_comm", "dp_comm", "optimizer")
# shown where a ranked layout has them: expert or context parallelism, a slowest GPU to wait for, host offload
EXTRA_TERMS = ("ep_comm", "cp_comm", "straggler", "offload")


def _terms(plans: Sequence[Plan]) -> tuple[str, ...]:
    extra = tuple(k for k in EXTRA_TERMS if any(getattr(p.estimate.time_s, k) for p in plans))  # type: ignore[union-attr]
    return TERMS + extra


def describe(p: Plan) -> str:
    """Every layout choice in one line: 'tp8·pp32·dp12 mb1 ZeRO-2 none SP zero_bubble×4'."""
    sched = "" if p.pp == 1 else f" {p.schedule_label}"
    sp = " SP" if p.sequence_parallel else ""
    return f"{p.label} mb{p.micro_batch} ZeRO-{p.zero_stage} {p.recompute_label}{sp}{sched}"


def explain(ranked: Sequence[Plan], runners_up: int = 3) -> list[str]:
    """One line for the winner (its step time and terms), then one per runner-up: how much slower,
    the two terms that differ most, and the memory it would need."""
    if not ranked:
        return []
    win = ranked[0]
    a = win.estimate.time_s  # type: ignore[union-attr]
    terms = _terms(ranked[: 1 + runners_up])
    lines = [f"winner {describe(win)}: {a.step:.3f} s/step, " + ", ".join(f"{k} {getattr(a, k):.3f}" for k in terms)]
    for i, other in enumerate(ranked[1 : 1 + runners_up], 2):
        b = other.estimate.time_s  # type: ignore[union-attr]
        diffs = sorted(((getattr(b, k) - getattr(a, k), k) for k in terms), key=lambda x: -abs(x[0]))
        parts = [f"{k} {'+' if d > 0 else '−'}{abs(d):.3f} s" for d, k in diffs[:2] if abs(d) > 1e-9]
        need = other.estimate.memory_bytes.total / GiB  # type: ignore[union-attr]
        lines.append(
            f"#{i} {describe(other)} is {b.step / a.step - 1:.1%} slower: "
            + (", ".join(parts) or "same terms")
            + f"; it would need {need:.1f} GiB"
        )
    return lines


__all__ = ["describe", "explain"]
