"""A plan setting's round trip: not written when unset, written and read back when set, and kept from a
base plan (the --attention-kernel and --elementwise tests share it); and exatrain's trainer refusing a
setting only the planner prices (every planner-only switch's tests share that)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster
from exatrain.catalog.hardware import ClusterSpec
from exatrain.errors import UserError
from exatrain.plan import Plan


def check_round_trip(tmp_path: Path, cluster: ClusterSpec, field: str, value: str, runtime: str = "torchtitan") -> Path:
    """Assert the round trip of ``field`` set to ``value`` on a llama3-8b plan of ``runtime``; the file's path."""
    plan = make_plan("llama3-8b", cluster, gpus=8, global_batch=8, runtime=runtime)
    assert getattr(plan, field) == "" and field not in plan.to_dict()
    path = tmp_path / f"{field}.json"
    plan.replace(**{field: value}).save(path)
    assert json.loads(path.read_text())[field] == value
    assert getattr(Plan.load(path), field) == value
    # a base plan's setting is kept unless another is given
    assert getattr(make_plan("llama3-8b", cluster, gpus=8, base=Plan.load(path), runtime=runtime), field) == value
    return path


def trainer_refuses(match: str, model: str = "llama-tiny", **plan_kw) -> None:
    """Assert that exatrain's trainer refuses (a UserError matching ``match``) a plan of ``model`` on the
    local CPU cluster made with ``plan_kw`` (default two ranks, one sample a micro-batch, a batch of two)."""
    from exatrain.trainer.config import TrainConfig

    plan = make_plan(model, get_cluster("local-cpu"), **{"gpus": 2, "micro_batch": 1, "global_batch": 2, **plan_kw})
    with pytest.raises(UserError, match=match):
        TrainConfig(plan=plan).check()
