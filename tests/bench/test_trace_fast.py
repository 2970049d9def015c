"""The fast trace (``bench.trace.fast_trace``: one rank per distinct stage shape, over a short op order,
every stage's peak replayed over its own order) against the full trace (one rank of every stage over
every micro-batch of the step), to the byte, on pipelines whose stages share shapes but not orders
(tests/helpers/trace_matrix.py ``REPLAY``: 4 and 8 stages, every schedule, uneven stage layers, ZeRO-1
and FSDP under a pipeline, MoE, cp, steps of many micro-batches). test_trace.py and
test_trace_moe_cp.py hold the same check for every layout of their matrices.

The cases are traced in the trace tests' shared subprocess (the trace keeps a fake process group for its
process), started with the session on the idle core (tests/helpers/trace_jobs.py, tests/helpers/background.py).

Broken on purpose and seen to fail here (each in ``bench/trace.py``; run on the cases named):
* ``op_types`` without the chunk's previous kind: pp4-zero2-dp2 and pp4-1f1b, stages 1-3 differ (a
  chunk's first forward, which makes autocast's 16-bit weight copies, becomes one type with the rest);
* ``op_types`` without "has gradients": pp4-1f1b and pp4-zero-bubble fall back to the full trace on
  every stage (the first backward allocates the gradients; the traced ops of one type disagree);
* ``stage_shape`` without the head: pp4-1f1b's last stage is replayed from a middle one and differs;
* ``_replay`` taking each op's state after it instead of its own peak: pp4-1f1b and pp1-m8 fall back
  (the replay misses the traced order's own peak);
* ``_replay`` taking the traced order's post phase as it is: moe-ep2-m4-optimizer-peak and the last
  stage of moe-ep2-pp4-optimizer-peak differ (by the MoE layers' records of the micro-batches beyond
  the traced ones, kept to the step's end, under a peak in the optimizer step).
A fall-back fails ``test_fast_trace_equals_full_trace`` on ``fast_in_full``, a wrong peak on its bytes.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers import background, trace_jobs, trace_matrix
from tests.helpers.trace_matrix import REPLAY

_TINY_PP4 = [
    sys.executable,
    "-m",
    "exatrain",
    "estimate",
    "--model",
    "gpt-tiny",
    "--layers",
    "8",
    "--cluster",
    "local-cpu",
    "--gpus",
    "4",
    "--pp",
    "4",
    "--global-batch",
    "16",
    "--json",
]
BACKGROUND_JOBS = {
    **trace_jobs.JOBS,
    "trace_fast.estimate-fast": background.Job([*_TINY_PP4, "--trace", "--progress"]),
    "trace_fast.estimate-full": background.Job([*_TINY_PP4, "--trace", "full", "--progress"]),
}


@pytest.fixture(scope="module")
def matrix() -> dict:
    return trace_jobs.matrix()


@pytest.mark.parametrize("case", list(REPLAY))
def test_fast_trace_equals_full_trace(matrix, case) -> None:
    """Every stage's replayed peak is the full trace's, in every category, to the byte, and was
    replayed (not traced in full after a failed replay)."""
    _, layout, _, _ = REPLAY[case]
    rows = matrix[case]
    assert [r["rank"] for r in rows] == list(range(layout.get("pp", 1)))
    for row in rows:
        assert not row["fast_in_full"], f"{case} rank {row['rank']} fell back to the full trace"
        assert row["fast"] == row["full"], f"{case} rank {row['rank']}: fast {row['fast']} vs full {row['full']}"


@pytest.mark.usefixtures("orders_world")
@pytest.mark.parametrize("case", list(REPLAY))
def test_fast_trace_traces_fewer_ranks_and_ops(matrix, case) -> None:
    """The fast trace runs fewer ops than the full one: one rank per stage shape (fewer ranks than
    stages wherever middle stages share a shape), and per rank a short order."""
    from exatrain.bench.trace import schedule_orders
    from exatrain.trainer.parallel.build import execution_plan

    fields, layout, _, _ = REPLAY[case]
    plan = execution_plan(trace_matrix.plan_for(fields, layout))
    full_ops = sum(len(o) for o in schedule_orders(plan, plan.num_microbatches))
    row = matrix[case][0]
    assert row["fast_ops"] < full_ops
    if plan.pp >= 4 and not plan.stage_layers:
        assert row["shapes"] == 3  # first, middle, last


@pytest.fixture
def orders_world():
    """``schedule_orders`` asks torch for the interleaved orders over the trace's fake process group;
    it is torn down after the test (nothing is traced in this process)."""
    import torch.distributed as dist

    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.usefixtures("orders_world")
@pytest.mark.parametrize(
    "schedule, v, pp, m",
    [
        ("1f1b", 1, 4, 8),
        ("1f1b", 1, 8, 16),
        ("gpipe", 1, 4, 8),
        ("interleaved", 2, 4, 8),
        ("interleaved", 2, 4, 12),
        ("interleaved", 2, 3, 6),
        ("interleaved", 4, 4, 16),
        ("zero_bubble", 2, 2, 4),
        ("zero_bubble", 2, 4, 16),
    ],
)
def test_replayed_orders_hold_the_accounting_in_flight_counts(schedule, v, pp, m) -> None:
    """The op orders each stage's peak is replayed over (torch's, for the interleaved schedules) hold,
    at their fullest, the activation sets ``accounting.inflight`` counts for that rank (a forward's set
    is released by its backward, or under zero bubble by its weight pass)."""
    from exatrain.accounting.inflight import peak_in_flight_fast
    from exatrain.bench.trace import schedule_orders
    from tests.helpers.trace_matrix import SMALL

    plan = trace_matrix.plan_for(dict(SMALL, layers=2 * pp * v), dict(pp=pp, schedule=schedule, interleave=v, m=m))
    for r, order in enumerate(schedule_orders(plan, m)):
        held = peak = 0
        for kind, _, _ in order:
            held += (kind == "F") - (kind in ("B", "W"))
            peak = max(peak, held)
        assert held == 0
        assert peak == int(peak_in_flight_fast(pp=pp, num_microbatches=m, schedule=schedule, interleave=v, rank=r))


def test_covering_order_runs_every_needed_type_and_drains() -> None:
    """The short order traced for a 1F1B stage runs the six op types any 1F1B stage's order has,
    each once, and ends with every forward's backward run; a set of types no drained walk can run
    (forwards without a backward) gets None, and the shape is traced over a schedule's order."""
    from exatrain.bench.trace import covering_order, op_types, schedule_orders

    plan = trace_matrix.plan_for(dict(trace_matrix.SMALL, layers=8), dict(pp=4))
    need = set().union(*(op_types(o) for o in schedule_orders(plan, plan.num_microbatches)[1:3]))
    order = covering_order(need)
    assert order is not None and sorted(op_types(order), key=str) == sorted(need, key=str)
    assert sorted((mb, kind) for kind, _, mb in order) == [(mb, kind) for mb in range(3) for kind in "BF"]
    assert covering_order({("F", 0, None, False), ("F", 0, "F", False)}) is None


def _stderr_lines(name: str) -> tuple[dict, list[str]]:
    out = background.result(name, BACKGROUND_JOBS)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout), [ln for ln in out.stderr.splitlines() if ln.startswith("trace:")]


def test_estimate_trace_fast_and_full_agree_and_say_what_they_trace() -> None:
    """`estimate --trace` (fast) and `--trace full` give the same traced peak; `--progress` names each
    traced rank, its shape and the stages it stands for, and how many ops and micro-batches it runs."""
    fast, fast_said = _stderr_lines("trace_fast.estimate-fast")
    full, full_said = _stderr_lines("trace_fast.estimate-full")
    assert fast["traced_memory_bytes"] == full["traced_memory_bytes"]
    note = lambda est: next(n for n in est["notes"] if n.startswith("traced (the trainer's model per stage"))  # noqa: E731
    assert note(fast).split("): ", 1)[1] == note(full).split("): ", 1)[1]  # every stage's peak
    assert "3 stage shape(s)" in note(fast) and "every stage over the whole step" in note(full)
    assert fast_said == [
        "trace: tracing stage 1 of 4 (shape 1 of 3, for stage 1): 6 ops, 3 micro-batches (the step has 16)",
        "trace: tracing stage 2 of 4 (shape 2 of 3, for stages 2-3): 6 ops, 3 micro-batches (the step has 16)",
        "trace: tracing stage 4 of 4 (shape 3 of 3, for stage 4): 4 ops, 2 micro-batches (the step has 16)",
    ]
    assert full_said == [f"trace: tracing stage {r} of 4 (all 16 micro-batches)" for r in range(1, 5)]


def test_estimate_refuses_an_unknown_trace_mode() -> None:
    """The Python API's ``trace`` is True/False, "fast" or "full"; anything else is one clear error,
    raised before anything is planned or traced."""
    from exatrain import api
    from exatrain.errors import UserError

    with pytest.raises(UserError, match="trace must be one of fast, full"):
        api.estimate(model="gpt-tiny", cluster="local-cpu", gpus=1, trace="quick")
