"""Memory verdicts on the published runs that trained, with each memory mechanism of 2026-12-05 undone in turn.

    python benchmarks/memory_mechanisms.py

Runs prediction_error.py's memory half (no step-time refits: seconds) four times: the model and plans as before the
changes (Megatron-Core's SwiGLU counted eager, 4f a token; the Megatron-Bridge FP8 rows planned without the
fp8_param_gather their recipes set; llm-foundry's MPT rows with torch's upcast loss), then with each change added.
Each line: the error on the measured peaks (which none of these changes touches), the band's leave-one-source-out
coverage, and the verdicts on the runs that trained, with the "does not fit" ones named. The published table's
``overlap`` and ``cross_entropy`` are what the rows ran; this script undoes them in memory only.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import prediction_error as pe  # noqa: E402

from exatrain.accounting import engines  # noqa: E402

STEPS = (
    ("before (eager SwiGLU count, no FP8 gather, MPT loss upcast)", "eager", False, "upcast"),
    ("+ Megatron-Core's fused SwiGLU keeps 3f", "fused", False, "upcast"),
    ("+ the Megatron-Bridge FP8 rows' fp8_param_gather", "fused", True, "upcast"),
    ("+ MPT's flash-attn fused loss (as shipped)", "fused", True, "fused"),
)


def verdicts(glu: str, gather: bool, mpt_loss: str) -> dict:
    """prediction_error's memory summary with Megatron-Core's SwiGLU counted ``glu``, the Megatron-Bridge FP8 rows'
    FP8 gather ``gather``, and the llm-foundry rows' loss ``mpt_loss``."""
    saved = engines.ENGINES["megatron-core"]
    engines.ENGINES["megatron-core"] = dataclasses.replace(
        saved, activations=dataclasses.replace(saved.activations, glu=glu)
    )
    try:
        rows = pe.load_rows()
        for r in rows:
            if r.plan is None:
                continue
            if not gather and "Megatron-Bridge" in r.name and r.plan.fp8:
                r.plan = r.plan.replace(fp8_param_gather=False)
            if r.engine == "llm-foundry":
                r.plan = r.plan.replace(cross_entropy=mpt_loss)
        pe.price(rows)
        pe.loso_memory_bands(rows)
        return pe.memory_summary(rows)
    finally:
        engines.ENGINES["megatron-core"] = saved


def main() -> int:
    for label, glu, gather, loss in STEPS:
        m = verdicts(glu, gather, loss)
        e, b, v = m["error"], m["band"], m["verdicts"]
        dnf = [x["index"] for x in m["misses"] if x["verdict"] == "does not fit"]
        print(
            f"{label}: measured peaks n={e['n']} median {e['median']:.1%} max {e['max']:.1%}, in band "
            f"{b['coverage']:.0%}; runs that trained {m['trained']}: does not fit {v['does not fit']}, tight "
            f"{v['tight']}, fits {v['fits']}; does not fit: rows {dnf}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
