"""The slowest GPU's lag (``planner/cost/variability.py``): a synchronous step over N GPUs waits for the slowest, so
its pipeline and optimizer time stretch by ``CostParams.speed_spread`` x E[max of N standard normals]; one GPU and a
host's processes get none. What it is for: published runs of one model at the same per-GPU batch lose per-GPU
throughput as the GPU count grows (torchtitan's Llama 3.1 8B, FSDP over 8 then 128 H100s: 5,762 then 5,605
tokens/s/GPU), which the cost model without the lag predicted rising.

Broken on purpose and seen to fail here: ``straggler_s`` returning zeros (the lag and weak-scaling tests);
``slowest_of`` with N in place of N - 1 in the integrand's power (the closed-forms test); the host check dropped
(the lag and no-lag tests); the optimizer's time left out of the lag (``straggler_s(pipe, ...)`` in
cost/step.py step_times): test_the_lag_of_an_estimate_is_its_own_formula_over_the_pipeline_and_the_optimizer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster
from exatrain.planner.cost.coefficients import DEFAULTS, default_params
from exatrain.planner.cost.variability import SPEED_SPREAD, slowest_of, straggler_s
from exatrain.planner.estimate import estimate_plan

H100 = get_cluster("grand-teton-h100")


def test_expected_maximum_of_normals_matches_its_closed_forms() -> None:
    """E[max] of 2 and 3 standard normals is 1/sqrt(pi) and 3/(2 sqrt(pi)); of 1, 0; it grows with N, slowly."""
    z = slowest_of(np.array([1, 2, 3, 8, 128, 2048]))
    assert z[0] == 0.0
    assert z[1] == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    assert z[2] == pytest.approx(3 / (2 * math.sqrt(math.pi)), rel=1e-6)
    assert z[3] == pytest.approx(1.4236, abs=1e-4)  # tables of normal order statistics
    assert np.all(np.diff(z) > 0) and z[-1] < 3.5


def test_the_lag_is_the_spread_times_the_expected_maximum_of_the_busy_time() -> None:
    busy = np.array([2.0, 2.0, 2.0])
    gpus = np.array([1, 8, 128])
    assert straggler_s(busy, gpus, 0.015) == pytest.approx(0.015 * slowest_of(gpus) * busy)
    assert not np.any(straggler_s(busy, gpus, 0.015, on_host=True))
    assert not np.any(straggler_s(busy, gpus, 0.0))
    assert SPEED_SPREAD == pytest.approx(0.08 / 5.4)
    assert DEFAULTS["cpu"].speed_spread == 0.0 and default_params("h100-sxm").speed_spread == SPEED_SPREAD


def _fsdp_8b(gpus: int):
    return make_plan("llama3-8b", H100, gpus=gpus, micro_batch=2, global_batch=2 * gpus, zero=3, runtime="torchtitan")


def test_weak_scaling_loses_per_gpu_throughput_as_published_runs_do() -> None:
    """The same per-GPU batch on 8 and on 128 GPUs: the larger run's lag is larger, its breakdown still adds up to its
    step, and its tokens/s/GPU is lower (without the lag the sharded optimizer made it higher)."""
    est = {n: estimate_plan(_fsdp_8b(n), H100, default_params("h100-sxm-500w")) for n in (8, 128)}
    for n, e in est.items():
        t = e.time_s
        parts = sum(v for k, v in t.to_dict().items() if k != "step")
        assert parts == pytest.approx(t.step, rel=1e-9)
        assert t.straggler > 0 and "straggler" in t.to_dict()
        assert any(x.startswith(f"straggler: the step waits for the slowest of {n} GPUs") for x in e.notes)
    assert est[128].time_s.straggler > est[8].time_s.straggler
    per_gpu = {n: e.tokens_per_s / n for n, e in est.items()}
    assert per_gpu[128] < per_gpu[8]
    flat = {
        n: estimate_plan(_fsdp_8b(n), H100, default_params("h100-sxm-500w").replace(speed_spread=0.0)) for n in (8, 128)
    }
    assert flat[128].tokens_per_s / 128 > flat[8].tokens_per_s / 8  # what the model said before


def test_one_gpu_and_a_host_have_no_lag() -> None:
    one = estimate_plan(
        make_plan("llama3-8b", H100, gpus=1, micro_batch=1, global_batch=1), H100, default_params("h100-sxm-500w")
    )
    assert one.time_s.straggler == 0.0 and "straggler" not in one.time_s.to_dict()
    assert not any(x.startswith("straggler") for x in one.notes)
    cpu = get_cluster("local-cpu")
    plan = make_plan("gpt-tiny", cpu, gpus=2, micro_batch=1, global_batch=2)
    est = estimate_plan(plan, cpu, default_params("cpu").replace(speed_spread=0.05))
    assert est.time_s.straggler == 0.0


@pytest.mark.parametrize(
    "model, cluster, kw",
    [
        (
            "llama3-8b",
            "grand-teton-h100",
            dict(gpus=128, micro_batch=2, global_batch=256, zero=3, runtime="torchtitan"),
        ),
        (
            "gpt-175b",
            "frontier",
            dict(
                gpus=128,
                tp=4,
                pp=16,
                micro_batch=1,
                global_batch=640,
                zero=1,
                recompute="full",
                runtime="megatron-deepspeed",
            ),
        ),
        (
            "llama3-70b",
            "dgx-h100",
            dict(
                gpus=64,
                tp=4,
                pp=4,
                micro_batch=1,
                global_batch=256,
                zero=1,
                sequence_parallel=True,
                runtime="megatron-core",
            ),
        ),
    ],
)
def test_the_lag_of_an_estimate_is_its_own_formula_over_the_pipeline_and_the_optimizer(model, cluster, kw) -> None:
    """The breakdown's straggler is speed_spread x E[max of the GPUs' normals] x (the pipeline's time + the
    optimizer's): the step less the exposed DP communication, the fixed overhead and the lag itself."""
    c = get_cluster(cluster)
    params = default_params(c.device.name)
    plan = make_plan(model, c, **kw)
    t = estimate_plan(plan, c, params).time_s
    pipeline = t.step - t.dp_comm - t.other - t.straggler
    assert t.optimizer > 1e-4 * pipeline  # large enough that leaving it out shows
    assert t.straggler == pytest.approx(params.speed_spread * float(slowest_of(plan.gpus)) * pipeline, rel=1e-9)
    # the pipeline's time is its parts: compute, bubble, exposed TP, PP, EP and CP communication, and the optimizer
    assert pipeline == pytest.approx(
        t.compute + t.bubble + t.tp_comm + t.pp_comm + t.ep_comm + t.cp_comm + t.optimizer, rel=1e-9
    )
