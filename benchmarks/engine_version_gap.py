"""How far the Megatron-LM runs of 2021-22 (Narayanan et al. 2021, Korthikanti et al. 2022) land when planned as the
settings they ran (``prediction_error.py``'s planning: local or torch DDP overlap, gradient accumulation outside the
GEMMs before 2022-02, 16-bit gradients for fp16) and as today's megatron-core defaults (every overlap on, the
accumulation fused, fp32 main gradients): the gap a plan that leaves its engine version unstated can carry. The
shipped A100 prior was chosen on these rows, so both columns are in sample; the gap between them is the point.

    python benchmarks/engine_version_gap.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import prediction_error as pe  # noqa: E402

from exatrain.planner.cost.coefficients import default_params  # noqa: E402
from exatrain.planner.estimate import estimate_plan  # noqa: E402


def main() -> int:
    rows = [r for r in pe.load_rows() if r.source in (pe.NARAYANAN, pe.KORTHIKANTI) and r.plan is not None]
    as_ran, today = [], []
    for r in rows:
        p = default_params(r.cluster.device.name)
        a = estimate_plan(r.plan, r.cluster, p, overlap=r.overlap).time_s.step / r.measured_s - 1
        t = (
            estimate_plan(r.plan.replace(grad_accum="", grad_accum_fusion=""), r.cluster, p, overlap="all").time_s.step
            / r.measured_s
            - 1
        )
        as_ran.append(a)
        today.append(t)
        print(f"{r.index:3d} {r.name[:48]:48s} as ran {a:+6.1%}   megatron-core defaults {t:+6.1%}")
    a, t = np.asarray(as_ran), np.asarray(today)
    print(
        f"median |error|: as ran {np.median(np.abs(a)):.1%}, as today's defaults {np.median(np.abs(t)):.1%}; "
        f"most too fast: {a.min():+.1%} against {t.min():+.1%} ({len(rows)} runs)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
