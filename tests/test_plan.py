"""Plan: validation messages, derived sizes, and the exact-key JSON round trip."""

from __future__ import annotations

import json

import pytest

from exatrain.catalog import get_cluster, get_model
from exatrain.errors import PlanError, UserError
from exatrain.plan import MemoryBreakdown, ParallelDims, Plan, StepEstimate, TrainShape, balanced_split


def _plan(**kw) -> Plan:
    base = dict(
        model=get_model("gpt-175b"),
        dims=ParallelDims(tp=4, pp=16, dp=2),
        shape=TrainShape(micro_batch=1, global_batch=640),
        zero_stage=1,
        recompute="full",
    )
    base.update(kw)
    return Plan(**base)


def test_derived_sizes() -> None:
    p = _plan().validate(get_cluster("frontier"))
    assert p.gpus == 128
    assert p.num_microbatches == 320
    assert p.layers_per_stage() == (6,) * 16
    assert p.tokens_per_step == 640 * 2048


def test_balanced_split_puts_leftovers_in_the_middle() -> None:
    assert balanced_split(10, 4) == (2, 3, 3, 2)
    assert balanced_split(7, 3) == (2, 3, 2)
    assert balanced_split(4, 4) == (1, 1, 1, 1)
    with pytest.raises(PlanError, match="at least one layer"):
        balanced_split(3, 4)


def test_interleaved_placement() -> None:
    p = _plan(
        dims=ParallelDims(tp=8, pp=8, dp=1),
        shape=TrainShape(1, 64),
        schedule="interleaved",
        interleave=3,
        recompute="selective",
        sequence_parallel=True,
    ).validate()
    assert p.virtual_stages == 24
    assert p.stages_of_rank(0) == (0, 8, 16)
    assert p.stages_of_rank(7) == (7, 15, 23)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(dims=ParallelDims(tp=5, pp=1, dp=1)), "heads 96 .* not divisible by tp 5"),
        (dict(shape=TrainShape(micro_batch=3, global_batch=640)), "not divisible by micro-batch x dp"),
        (dict(dims=ParallelDims(tp=1, pp=128, dp=1), shape=TrainShape(1, 128)), "every stage needs at least one layer"),
        (dict(sequence_parallel=True, dims=ParallelDims(tp=1, pp=16, dp=2)), "needs tp > 1"),
        (dict(schedule="interleaved"), "needs --interleave >= 2"),
        (dict(interleave=2), "needs schedule interleaved"),
        (dict(shape=TrainShape(1, 2)), "fewer than pp"),
        (dict(stage_layers=(6,) * 15), "has 15 entries"),
        (dict(stage_layers=(7,) + (6,) * 15), "sums to 97"),
        (dict(zero_stage=4), "--zero must be"),
        (dict(recompute="some"), "--recompute must be"),
    ],
)
def test_validation_names_the_problem(kw, message) -> None:
    with pytest.raises(PlanError, match=message):
        _plan(**kw).validate()


def test_tp_across_nodes_is_a_legal_plan() -> None:
    """tp wider than a node is priced on the network, not refused (the search leaves it out unless pinned)."""
    p = _plan(dims=ParallelDims(tp=16, pp=8, dp=1), shape=TrainShape(1, 64))
    assert p.validate(get_cluster("frontier")) is p


def test_json_round_trip_with_estimate(tmp_path) -> None:
    mem = MemoryBreakdown(weights=1.0, gradients=2.0, optimizer=3.0, activations=4.0, other=5.0)
    est = StepEstimate(
        params=10, params_by_stage=(5, 5), memory_bytes=mem, memory_by_stage=(mem, mem), capacity_bytes=100, fits=True
    )
    p = _plan(dims=ParallelDims(tp=4, pp=2, dp=2), shape=TrainShape(1, 8), cluster="frontier", estimate=est)
    path = tmp_path / "plan.json"
    p.save(path)
    q = Plan.load(path)
    assert q == p
    assert json.loads(path.read_text())["estimate"]["memory_bytes"]["total"] == 15.0


def test_json_rejects_unknown_and_inconsistent_keys(tmp_path) -> None:
    d = _plan().to_dict()
    d["colour"] = "red"
    with pytest.raises(UserError, match="unknown plan key"):
        Plan.from_dict(d)
    d = _plan().to_dict()
    d["gpus"] = 7
    with pytest.raises(UserError, match="gpus 7"):
        Plan.from_dict(d)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        Plan.load(bad)
