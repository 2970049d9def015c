"""How far the cost model's closed-form pipeline term is from the op-by-op schedule simulation.

Draws random legal layouts from several search spaces (GPT and Llama/GQA models on frontier,
dgx-h100 and local-cpu; every schedule, ZeRO stage, recompute mode, sequence parallelism), gives a
share of them a random custom layer split (``stage_layers``), and compares, per layout, the pipeline
makespan ``planner.evaluate`` uses with ``cost.schedule.simulate`` run on the very same per-stage
seconds (``planner.plan_cost.simulate_plan``). Prints, per schedule and kind of split: how many layouts, the
largest shortfall (the closed form is a lower bound: it is never above), the mean |error| and the
share that is exact (within 1e-9).

    python benchmarks/pipeline_error.py [--plans 4000] [--seed 0] [--max-ops 400000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from exatrain.accounting.engines import plan_run
from exatrain.catalog import get_cluster, get_model
from exatrain.settings import SCHEDULES
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.plan_cost import simulate_plan
from exatrain.planner.evaluate import evaluate
from exatrain.planner.layouts import Layouts
from exatrain.planner.search.search import plan_at
from exatrain.planner.search.space import enumerate_space

SPACES = [  # model, cluster, gpus, global batch, dtype
    ("gpt-1t", "frontier", 3072, 1536, "bfloat16"),
    ("gpt-175b", "frontier", 1024, 1536, "bfloat16"),
    ("gpt-175b", "frontier", 128, 640, "bfloat16"),
    ("gpt-22b", "frontier", 64, 256, "bfloat16"),
    ("llama3-70b", "dgx-h100", 128, 512, "bfloat16"),
    ("llama3-8b", "dgx-h100", 64, 256, "bfloat16"),
    ("gpt-small", "local-cpu", 16, 64, "float32"),
    ("llama-tiny", "local-cpu", 8, 32, "float32"),
]


def random_split(rng: np.random.Generator, layers: int, stages: int) -> tuple[int, ...]:
    """A random split of ``layers`` into ``stages`` positive parts (uniform over cut points)."""
    cuts = np.sort(rng.choice(np.arange(1, layers), stages - 1, replace=False))
    return tuple(int(x) for x in np.diff(np.concatenate([[0], cuts, [layers]])))


def draw(rng: np.random.Generator, n: int, custom_share: float, max_ops: int):
    """(plan, cluster) pairs: random pipelined layouts of the spaces above, a share re-split at random."""
    spaces = {}
    out = []
    while len(out) < n:
        name, cl, gpus, gb, dtype = SPACES[rng.integers(len(SPACES))]
        key = (name, cl, gpus, gb)
        if key not in spaces:
            spaces[key] = enumerate_space(get_model(name), get_cluster(cl), gpus, gb)
        space, cluster, model = spaces[key], get_cluster(cl), get_model(name)
        plan = plan_at(space, int(rng.integers(len(space))), model, gb, cluster, dtype, True)
        if plan.pp == 1 or plan.num_microbatches * plan.virtual_stages * plan.pp > max_ops:
            continue
        if rng.random() < custom_share and model.layers > plan.virtual_stages:
            plan = plan.replace(stage_layers=random_split(rng, model.layers, plan.virtual_stages))
        out.append((plan.validate(cluster), cluster))
    return out


def gaps(pairs) -> list[tuple[str, bool, float]]:
    """(schedule, custom split?, closed form / simulation - 1) per layout."""
    out = []
    for plan, cluster in pairs:
        coeffs = default_params(cluster.device.name)
        ev = evaluate(
            Layouts.from_plan(plan),
            plan.model,
            cluster,
            coeffs,
            global_batch=plan.global_batch,
            run=plan_run(plan),
            memory=(),
        )
        sim = simulate_plan(plan, cluster, coeffs).step_s
        out.append((plan.schedule, bool(plan.stage_layers), float(ev.pipeline_s[0]) / sim - 1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--custom-share", type=float, default=0.3)
    ap.add_argument("--max-ops", type=int, default=400_000, help="skip layouts with more ops (slow to simulate)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = gaps(draw(np.random.default_rng(args.seed), args.plans, args.custom_share, args.max_ops))
    print(f"{len(rows):,} layouts in {time.perf_counter() - t0:.0f} s")
    print(f"{'schedule':12} {'split':9} {'n':>6} {'worst':>9} {'above':>9} {'mean|e|':>9} {'exact':>7}")
    for schedule in SCHEDULES:
        for custom in (False, True):
            e = np.array([g for s, c, g in rows if s == schedule and c == custom])
            if e.size:
                print(
                    f"{schedule:12} {'custom' if custom else 'balanced':9} {e.size:>6} {e.min():>+9.3%} "
                    f"{e.max():>+9.1e} {np.abs(e).mean():>9.3%} {np.mean(np.abs(e) < 1e-9):>7.1%}"
                )


if __name__ == "__main__":
    main()
