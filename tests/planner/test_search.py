"""Search: the space and its rejections, batch evaluation against estimate_plan, ranking."""

from __future__ import annotations

import json

import numpy as np
import pytest

from exatrain.catalog import get_cluster, get_model
from exatrain.cli import main
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.estimate import estimate_plan
from exatrain.planner.search import batch
from exatrain.planner.search.search import plan_at, search
from exatrain.planner.search.space import SpaceOptions, enumerate_space


def test_space_rejections_by_hand() -> None:
    """gpt-tiny (4 layers, 4 heads) on 8 CPUs of local-cpu, global batch 8, a pinned small grid."""
    m, c = get_model("gpt-tiny"), get_cluster("local-cpu")
    opts = SpaceOptions(tp=(1, 2, 3), pp=(1, 2, 8), micro_batch=(1, 3), zero_stage=(0,), recompute=("none",),
                        sequence_parallel=(False,), schedules=(("1f1b", 1),))
    s = enumerate_space(m, c, 8, 8, opts)
    assert s.examined == 3 * 3 * 2
    # tp=3 divides neither the heads nor 8 GPUs: 6 candidates, counted once, under the first reason.
    assert s.rejected["tp does not divide heads / kv heads / ffn / vocab"] == 6
    # Reasons are checked in order and each candidate is counted once, under the first it fails:
    assert s.rejected["gpus not divisible by tp*pp"] == 2  # tp 2 x pp 8 = 16 > 8, both micro-batches
    assert s.rejected["global batch not divisible by micro-batch*dp"] == 5  # mb 3 with the 5 other (tp, pp)
    assert s.rejected["more pipeline stages than layers"] == 1  # tp 1, pp 8 > 4 layers, mb 1
    legal = {(int(a), int(b), int(d), int(e)) for a, b, d, e in zip(s.tp, s.pp, s.dp, s.micro_batch)}
    assert legal == {(1, 1, 8, 1), (1, 2, 4, 1), (2, 1, 4, 1), (2, 2, 2, 1)}
    assert sorted(s.num_microbatches.tolist()) == [1, 2, 2, 4]  # 8 / (mb * dp)


@pytest.mark.parametrize("model, cluster, gpus, gb", [
    ("gpt-22b", "dgx-a100", 64, 256),
    ("llama3-70b", "dgx-h100", 128, 512),
    ("gpt-1t", "frontier", 3072, 1536),
])
def test_batch_memory_and_time_equal_estimate(model, cluster, gpus, gb) -> None:
    m, c = get_model(model), get_cluster(cluster)
    space = enumerate_space(m, c, gpus, gb)
    res = batch.evaluate(space, m, c, gb, default_params(c.device.name))
    rng = np.random.default_rng(0)
    for i in rng.choice(len(space), size=60, replace=False):
        plan = plan_at(space, int(i), m, gb, c, "bfloat16", True).validate(c)
        est = estimate_plan(plan, c)
        assert res.memory_total[i] == pytest.approx(est.memory_bytes.total, rel=1e-9)
        assert bool(res.fits[i]) == est.fits
        # One step-time definition: the batch path is the estimate's (a plan is a batch of one).
        assert res.time["step"][i] == pytest.approx(est.time_s.step, rel=1e-9)


def test_batch_trainer_memory_equals_estimate() -> None:
    """--runtime exatrain judges candidates by the trainer's memory model, batch and exact alike."""
    m, c = get_model("llama3-8b"), get_cluster("dgx-h100")
    space = enumerate_space(m, c, 64, 256, runtime="exatrain")  # no cp: the trainer's memory model has none
    res = batch.evaluate(space, m, c, 256, default_params(c.device.name), runtime="exatrain")
    for i in np.random.default_rng(1).choice(len(space), size=40, replace=False):
        plan = plan_at(space, int(i), m, 256, c, "bfloat16", True).validate(c)
        est = estimate_plan(plan, c)
        assert res.memory_total[i] == pytest.approx(est.trainer_memory_bytes.total, rel=1e-9)
    result = search(m, c, 64, 256, top=3, runtime="exatrain")
    assert all(p.estimate.trainer_fits for p in result.ranked)


def test_exatrain_runtime_rejects_what_the_trainer_refuses() -> None:
    """zero_bubble + ZeRO-2/3 + dp > 1 is legal for the reference runtime but refused by the trainer
    (TrainConfig.validate): --runtime exatrain counts it as a rejection instead of proposing it."""
    from exatrain.planner.search.space import TRAINER_REASON

    m, c = get_model("gpt-tiny"), get_cluster("local-cpu")
    opts = SpaceOptions(tp=(1,), pp=(2,), micro_batch=(1,), zero_stage=(0, 1, 2, 3), recompute=("none",),
                        sequence_parallel=(False,), schedules=(("1f1b", 1), ("zero_bubble", 2)))
    ref = enumerate_space(m, c, 4, 8, opts, runtime="megatron-deepspeed")  # dp 2, 4 micro-batches: all 8 legal
    own = enumerate_space(m, c, 4, 8, opts, runtime="exatrain")
    assert len(ref) == 8 and TRAINER_REASON not in ref.rejected
    assert own.rejected[TRAINER_REASON] == 2 and len(own) == 6
    names = [s for s, _ in opts.schedules]
    assert not any(names[v] == "zero_bubble" and z >= 2 for v, z in zip(own.variant, own.zero))


def test_search_finds_the_exact_best() -> None:
    """Brute force: estimate_plan on every legal candidate of a small space; search must return it."""
    m, c = get_model("gpt3-6.7b"), get_cluster("dgx-a100")
    opts = SpaceOptions(micro_batch=(1, 2, 4), recompute=("none", "full"), zero_stage=(0, 1, 3))
    space = enumerate_space(m, c, 32, 128, opts)
    best, best_tps = None, 0.0
    for i in range(len(space)):
        plan = plan_at(space, i, m, 128, c, "bfloat16", True).validate(c)
        est = estimate_plan(plan, c)
        if est.fits and est.tokens_per_s > best_tps:
            best, best_tps = plan, est.tokens_per_s
    result = search(m, c, 32, 128, top=3, options=opts)
    assert result.ranked[0].estimate.tokens_per_s == pytest.approx(best_tps, rel=1e-9)
    assert (result.ranked[0].dims, result.ranked[0].schedule) == (best.dims, best.schedule)
    tps = [p.estimate.tokens_per_s for p in result.ranked]
    assert tps == sorted(tps, reverse=True)


def test_search_cli_json_and_explain(capsys, tmp_path) -> None:
    code = main(["search", "--model", "gpt-22b", "--cluster", "dgx-a100", "--gpus", "64", "--global-batch",
                 "256", "--top", "3", "--json", "--explain", "--out", str(tmp_path / "best.json")])
    out = capsys.readouterr().out
    assert code == 0
    d = json.loads(out)
    assert len(d["ranked"]) == 3 and d["legal"] >= d["feasible"] > 0
    first = d["ranked"][0]
    for key in ("params", "memory_bytes", "memory_by_stage", "fits", "plan", "time_s", "tokens_per_s",
                "model_tflops_per_gpu", "mfu", "hardware_tflops_per_gpu", "hfu"):
        assert key in first
    assert set(first["time_s"]) >= {"step", "compute", "bubble", "tp_comm", "pp_comm", "dp_comm", "optimizer"}
    assert d["explain"][0].startswith("winner")
    assert json.loads((tmp_path / "best.json").read_text())["tp"] == first["plan"]["tp"]


def test_search_pins_dimensions(capsys) -> None:
    code = main(["search", "--model", "gpt-22b", "--cluster", "dgx-a100", "--gpus", "64", "--global-batch",
                 "256", "--tp", "4", "--zero", "1", "--recompute", "full", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0
    assert {(p["plan"]["tp"], p["plan"]["zero_stage"], p["plan"]["recompute"]) for p in d["ranked"]} == {(4, 1, "full")}


def test_no_feasible_layout_names_the_constraint(capsys) -> None:
    code = main(["search", "--model", "gpt-1t", "--cluster", "frontier", "--gpus", "8", "--global-batch", "8"])
    err = capsys.readouterr().err
    assert code == 2
    assert "no feasible layout on 8 devices" in err and "legal layouts run out of memory" in err
    assert "GiB per device" in err
    assert len(err.strip().splitlines()) == 1


def test_scaling_cli_weak_and_strong(capsys) -> None:
    code = main(["scaling", "--model", "gpt-175b", "--cluster", "frontier", "--gpus", "128,1024",
                 "--global-batch", "640", "--tp", "4", "--pp", "16", "--mode", "weak", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and [p["gpus"] for p in d["points"]] == [128, 1024]
    assert [p["global_batch"] for p in d["points"]] == [640, 5120]
    assert d["points"][0]["efficiency"] == pytest.approx(1.0)
    code = main(["scaling", "--model", "gpt-175b", "--cluster", "frontier", "--gpus", "256,128",
                 "--global-batch", "640"])
    assert code == 2 and "increasing" in capsys.readouterr().err
