"""Synchronous kernel launches (``Plan.launch_blocking``: CUDA_LAUNCH_BLOCKING=1 in the job's environment, as
BLOOM-176B's training set it): the host's time per launch (``CostParams.blocking_launch_s``) joins every GEMM,
element-wise kernel and collective, nothing overlaps, and a plan without the switch is untouched; the published
runs that set it are predicted with the factor fitted to the other such source (tests/bench/
test_prediction_error.py).

Broken on purpose and seen to fail here: evaluate keeping the runtime's overlaps under the switch (the overlap
test); ``compute.with_launch_blocking`` left out of evaluate (the linearity and kernel-count tests); ``band.distance``
without its ``blocking`` term (the band test)."""

from __future__ import annotations

import pytest

from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster
from exatrain.cli import main
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.estimate import estimate_plan

A100 = get_cluster("dgx-a100")


def _plan(micro_batch: int = 1, **kw):
    return make_plan(
        "gpt-1.3b",
        A100,
        gpus=16,
        tp=2,
        pp=2,
        micro_batch=micro_batch,
        global_batch=64,
        zero=1,
        runtime="megatron-core",
        **kw,
    )


def _step(plan, x: float, overlap: str = "all") -> float:
    return estimate_plan(
        plan, A100, default_params("a100-80gb").replace(blocking_launch_s=x), overlap=overlap
    ).time_s.step


def test_without_host_time_the_switch_is_the_run_with_no_overlap() -> None:
    """At blocking_launch_s 0 a blocking run is the same run with every overlap off (each launch waits for its
    kernel, so no kernel runs beside another); the runtime's overlaps hide something here, so the two differ
    from the plain run."""
    plain, blocking = _plan(), _plan(launch_blocking=True)
    assert _step(blocking, 0.0) == pytest.approx(_step(plain, 0.0, overlap="none"), rel=1e-12)
    assert _step(plain, 0.0, overlap="none") > _step(plain, 0.0)


def test_the_host_time_adds_per_kernel_and_grows_with_the_kernels_a_step_launches() -> None:
    """The added time is linear in blocking_launch_s, and a step of 64 micro-batches of 1 sequence launches about
    four times the kernels of one of 16 micro-batches of 4: its added host time is more than three times larger."""
    x = 100e-6
    small, large = _plan(1, launch_blocking=True), _plan(4, launch_blocking=True)
    added = {mb: _step(p, x) - _step(p, 0.0) for mb, p in ((1, small), (4, large))}
    assert _step(small, 2 * x) - _step(small, 0.0) == pytest.approx(2 * added[1], rel=1e-9)
    assert added[1] > 3 * added[4] > 0
    # at least a kernel per layer and micro-batch: 12 layers a stage, 16 micro-batches of 1 on each of dp 4
    assert added[1] / x > 12 * 16


def test_a_plan_without_the_switch_ignores_the_host_time() -> None:
    plain = _plan()
    assert _step(plain, 1e-3) == _step(plain, 0.0)


def test_the_switch_through_the_plan_file_the_label_and_the_cli(tmp_path, capsys) -> None:
    from exatrain.plan import Plan

    plan = _plan(launch_blocking=True)
    assert Plan.from_dict(plan.to_dict()) == plan and plan.to_dict()["launch_blocking"] is True
    assert "synchronous launches" in plan.settings_label
    args = [
        "estimate",
        "--model",
        "gpt-1.3b",
        "--cluster",
        "dgx-a100",
        "--gpus",
        "16",
        "--tp",
        "2",
        "--pp",
        "2",
        "--global-batch",
        "64",
        "--zero",
        "1",
        "--runtime",
        "megatron-core",
    ]
    assert main(args + ["--json"]) == 0
    plain = capsys.readouterr().out
    assert main(args + ["--launch-blocking", "--json"]) == 0
    blocking = capsys.readouterr().out
    import json

    t0, t1 = (json.loads(o)["time_s"]["step"] for o in (plain, blocking))
    assert t1 > t0
    assert main(args + ["--launch-blocking"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "overlap none: no communication hidden (synchronous launches, --launch-blocking" in text


def test_the_band_widens_where_no_run_with_synchronous_launches_validated_the_family() -> None:
    """The published runs with synchronous launches are all on A100s: a blocking plan there gets the plain plan's
    band, one on H100s a wider band that says why (the feature no held-out fit could measure takes the widest
    scale the runs showed, planner/band.py)."""
    from exatrain.planner.band import band_for

    h100 = get_cluster("dgx-h100")
    bands = {}
    for name, cluster in (("a100", A100), ("h100", h100)):
        for blocking in (False, True):
            plan = make_plan(
                "gpt-1.3b",
                cluster,
                gpus=16,
                tp=2,
                pp=2,
                global_batch=64,
                zero=1,
                runtime="megatron-core",
                launch_blocking=blocking,
            )
            bands[name, blocking] = band_for(plan, cluster)
    assert (bands["a100", True].low, bands["a100", True].high) == (bands["a100", False].low, bands["a100", False].high)
    wide, plain = bands["h100", True], bands["h100", False]
    assert wide.low < plain.low and wide.high > plain.high
    assert "synchronous launches not validated on H100/H200" in wide.widened
    assert not any("synchronous" in w for w in plain.widened + bands["a100", True].widened)
