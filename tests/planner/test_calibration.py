"""`exatrain bench / calibrate / validate`, the train summary hook, and their bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from exatrain.catalog import get_cluster, get_model
from exatrain.plan import Measured, ParallelDims, Plan, RunRecord, TrainShape
from exatrain.records import append_run_record, read_run_records
from exatrain.planner.cost.calibrate import RUN_FACTORS, error_stats, fit_gemm, fit_link, nelder_mead
from exatrain.planner.cost.coefficients import default_params, load_calibration
from exatrain.planner.plan_cost import step_time
from exatrain.planner.estimate import estimate_plan

from tests.helpers.cli import run

CPU = get_cluster("local-cpu")
# What the synthetic machine "really" is: every factor moved away from the cpu prior.
TRUE = default_params("cpu").replace(
    gemm_eff=0.45, step_overhead_s=0.02, mem_eff=0.35, attn_eff=0.15, link_eff=0.5, op_overhead_s=3e-5
)


def _plans() -> list[Plan]:
    """Runs that exercise different parts of the model: GEMM-heavy, element-wise-heavy, attention,
    tensor-parallel communication, pipelines, many small steps."""
    specs = [
        ("gpt-tiny", 1, 1, 1, 1, 1),
        ("gpt-tiny", 2, 1, 1, 8, 8),
        ("gpt-small", 1, 1, 1, 4, 4),
        ("gpt-small", 2, 1, 1, 2, 4),
        ("gpt-small", 1, 2, 1, 1, 8),
        ("llama-tiny", 1, 1, 2, 4, 8),
        ("gpt-tiny", 4, 1, 1, 8, 8),
        ("llama-tiny", 2, 2, 1, 2, 8),
        ("gpt-tiny", 1, 1, 4, 1, 4),
        ("gpt-small", 2, 2, 1, 1, 8),
        ("llama-tiny", 1, 1, 1, 16, 16),
        ("gpt-small", 1, 1, 2, 8, 16),
        ("llama-tiny", 2, 1, 2, 2, 8),
    ]
    return [
        Plan(
            model=get_model(m),
            dims=ParallelDims(tp, pp, dp),
            shape=TrainShape(mb, gb),
            dtype="float32",
            cluster="local-cpu",
        ).validate()
        for m, tp, pp, dp, mb, gb in specs
    ]


@pytest.fixture(scope="module")
def runs_file(tmp_path_factory) -> Path:
    """RunRecords 'measured' on the synthetic machine, carrying the cpu prior's predictions."""
    path = tmp_path_factory.mktemp("runs") / "runs.jsonl"
    path.write_text('{"kind": "step", "step": 1}\n')  # per-step lines are skipped
    for plan in _plans():
        t = step_time(plan, CPU, TRUE)[0].step
        est = estimate_plan(plan, CPU)
        append_run_record(
            path,
            RunRecord(
                plan=plan.with_estimate(est),
                device="cpu",
                measured=Measured(steps=5, step_time_s=t, tokens_per_s=plan.tokens_per_step / t, peak_memory_bytes=3e8),
            ),
        )
    return path


@pytest.fixture(scope="module")
def calibrated(runs_file) -> tuple[Path, str]:
    """`exatrain calibrate runs.jsonl --json` once for the module (13 fits of the runs held out one by one)."""
    import contextlib
    import io

    from exatrain.cli import main

    out = runs_file.parent / "cal.json"
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        code = main(["calibrate", str(runs_file), "--out", str(out), "--json"])
    assert code == 0, err.getvalue()
    return out, buf.getvalue()


def test_calibrate_recovers_the_machine(calibrated) -> None:
    out, text = calibrated
    rep = json.loads(text)["fits"]["local-cpu/exatrain"]
    assert rep["runs"] == 13 and rep["before"]["median"] > 0.2
    assert rep["after"]["median"] < 0.005 and rep["after"]["max"] < 0.01
    assert rep["after"]["rms_log"] < rep["before"]["rms_log"]
    # 13 runs fit every physical factor (calibrate.run_factors); the machine's cpu entry is not a fit of its runs
    assert set(rep["factors"]) == set(RUN_FACTORS)
    cal = load_calibration(out)
    assert cal.params_for("cpu") is None
    fitted = cal.params_for("cpu", "local-cpu", "exatrain")
    for factor in ("gemm_eff", "step_overhead_s", "mem_eff", "attn_eff", "link_eff", "op_overhead_s"):
        assert getattr(fitted, factor) == pytest.approx(getattr(TRUE, factor), rel=0.05), factor
    assert fitted.step_scale == 1.0  # not fitted beside them
    # each run predicted from the other 12: the band the calibrated estimates carry, measured, tight on this
    # machine that the cost model describes exactly
    assert fitted.band_runs == 13 and 0.97 < fitted.band_low <= fitted.band_high < 1.03
    assert fitted.peak_flops == TRUE.peak_flops  # not a free factor: shared with gemm_eff
    assert fitted.source.startswith("exatrain calibrate")


def test_calibrate_prints_before_and_after(runs_file, tmp_path, capsys) -> None:
    few = tmp_path / "few.jsonl"  # three runs: gemm_eff alone, no band of their own (fast)
    few.write_text("".join(runs_file.read_text().splitlines(keepends=True)[1:4]))
    code, text, _ = run(capsys, "calibrate", str(few), "--out", str(tmp_path / "c.json"))
    assert code == 0
    assert "error before: median" in text and "error after:  median" in text and "p90" in text
    assert "local-cpu / exatrain (cpu): 3 runs; fitted gemm_eff=" in text
    assert "band: the published-run band (fewer than 4 runs to measure one on)" in text


def test_validate_stored_and_recalibrated(runs_file, calibrated, capsys) -> None:
    code, text, _ = run(capsys, "validate", str(runs_file), "--json")
    assert code == 0
    d = json.loads(text)
    assert len(d["runs"]) == 13 and d["prediction"] == "stored in each record"
    first = d["runs"][0]
    assert first["step_error"] == pytest.approx(first["predicted_step_s"] / first["measured_step_s"] - 1)
    assert d["distribution"]["step_time"]["median"] > 0.2  # the prior is not this machine
    assert d["distribution"]["peak_memory"]["n"] == 0  # CPU RSS is shown, not scored
    # Re-predicted with the calibration that `calibrate` fitted: the errors collapse.
    cal, _ = calibrated
    code, text, _ = run(capsys, "validate", str(runs_file), "--calibration", str(cal), "--json")
    assert code == 0 and json.loads(text)["distribution"]["step_time"]["median"] < 0.01
    code, text, _ = run(capsys, "validate", str(runs_file))
    assert code == 0 and "predicted vs measured" in text and "step time |error| over 13 runs" in text


def test_train_summary_line_shows_a_prediction_only_when_calibrated_on_this_host(runs_file) -> None:
    """The end-of-run lines of `exatrain train`: the prior's prediction is not shown beside the
    measurement (the user is told to run `exatrain bench`); one made with a bench of this host is."""
    import dataclasses

    from exatrain.planner.compare import calibrated_on, compare, summary_lines

    rec = read_run_records(runs_file)[-1]
    assert not calibrated_on(rec.predicted, "host-a")  # the cpu prior
    lines = summary_lines(compare(rec), calibrated=False)
    assert "uncalibrated for this machine: run `exatrain bench`" in lines[0] and "predicted" not in lines[0]
    assert lines[1].startswith("peak memory: measured 286 MiB")  # 3e8 bytes: MiB under 1 GiB
    benched = estimate_plan(rec.plan.with_estimate(None), CPU, TRUE.replace(source="exatrain bench (host-a)"))
    assert calibrated_on(benched, "host-a") and not calibrated_on(benched, "host-b")
    c = compare(dataclasses.replace(rec, plan=rec.plan.with_estimate(benched)))
    lines = summary_lines(c, calibrated=True)
    assert lines[0].startswith(f"step time: predicted {benched.time_s.step:.3f} s (band ")
    # The band the estimate carries (planner/band.py), and which side of it the measurement fell.
    low, high = benched.step_range_s
    assert c.predicted_range_s == (low, high) and f", {benched.band['text']})" in lines[0]
    assert f"measured {c.measured_step_s:.3f} s (prediction {c.step_error:+.1%})" in lines[0]
    inside = low <= c.measured_step_s <= high
    assert lines[0].endswith(": inside the band" if inside else ("slower" if c.measured_step_s > high else "faster"))
    narrow = dataclasses.replace(c, predicted_range_s=(c.measured_step_s * 1.1, c.measured_step_s * 1.2))
    assert summary_lines(narrow, calibrated=True)[0].endswith(": outside the band, faster")
    assert dataclasses.replace(c, predicted_range_s=(0.5 * c.measured_step_s, 2 * c.measured_step_s)).in_band
    fitted = estimate_plan(rec.plan.with_estimate(None), CPU, TRUE.replace(source="exatrain calibrate (12 runs; a, b)"))
    assert calibrated_on(fitted, "b") and not calibrated_on(fitted, "c")
    anonymous = estimate_plan(rec.plan.with_estimate(None), CPU, TRUE.replace(source="exatrain calibrate (12 runs)"))
    assert not calibrated_on(anonymous, "a")


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["validate", "{tmp}/missing.jsonl"], "no such file"),
        (["calibrate", "{tmp}/bad.jsonl", "--out", "{tmp}/o.json"], "not a JSON line"),
        (["validate", "{tmp}/steps.jsonl"], "no RunRecords"),
        (["validate", "{runs}", "--calibration", "{tmp}/gpu_only.json"], "no parameters for device 'cpu'"),
        (["validate", "{runs}", "--calibration", "{tmp}/bad_param.json"], "unknown cost parameter"),
        (["calibrate", "{runs}", "--out", "{runs}/c.json"], "is a file, not a directory"),
        (["bench", "--out", "{runs}/c.json", "--quick"], "is a file, not a directory"),
        (["bench", "--out", "{tmp}", "--quick"], "is a directory"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, needle, runs_file, tmp_path, capsys) -> None:
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    (tmp_path / "steps.jsonl").write_text('{"kind": "step", "step": 1}\n')
    (tmp_path / "gpu_only.json").write_text(
        json.dumps({"kind": "exatrain-calibration", "devices": {"h200-sxm": {"gemm_eff": 0.7}}})
    )
    (tmp_path / "bad_param.json").write_text(
        json.dumps({"kind": "exatrain-calibration", "devices": {"cpu": {"warp_speed": 9}}})
    )
    args = [a.format(tmp=tmp_path, runs=runs_file) for a in argv]
    code, out, err = run(capsys, *args)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


# ---- the fits themselves --------------------------------------------------------------------------
def test_nelder_mead_finds_a_known_minimum() -> None:
    x, fx = nelder_mead(lambda v: (v[0] - 3) ** 2 + 10 * (v[1] + 1) ** 2 + 2, [0.0, 0.0], step=1.0)
    assert x == pytest.approx([3, -1], abs=1e-3) and fx == pytest.approx(2, abs=1e-6)


def test_gemm_and_link_fits_recover_their_generating_parameters() -> None:
    P, half, over = 8e10, 24.0, 7e-6
    shapes = [(m, n, k) for m in (64, 256, 1024) for n in (32, 192, 768) for k in (64, 512)]
    pts = [
        {
            "m": m,
            "n": n,
            "k": k,
            "seconds": 2 * m * n * k / (P * (m / (m + half)) * (n / (n + half)) * (k / (k + half))) + over,
        }
        for m, n, k in shapes
    ]
    fit = fit_gemm(pts, catalog_peak=None)
    assert fit["gemm_eff"] * fit["_peak"] == pytest.approx(P, rel=0.02)
    assert fit["gemm_dim_half"] == pytest.approx(half, rel=0.1)
    assert fit["gemm_overhead_s"] == pytest.approx(over, rel=0.1)
    lat, bw = 40e-6, 3e9
    link = [
        {
            "kind": k,
            "ranks": 4,
            "bytes": b,
            "seconds": (lat + b / bw)
            if k == "send_recv"
            else {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}[k] * (3 * lat + 3 / 4 * b / bw),
        }
        for k in ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
        for b in (2**10, 2**16, 2**22)
    ]
    tier, curve = fit_link(link)
    assert tier.latency_s == pytest.approx(lat, rel=0.02) and tier.bytes_per_s == pytest.approx(bw, rel=0.02)
    assert tier.span == 0 and len(curve) == len(link)


def test_framework_fit_recovers_injected_overheads() -> None:
    """Points made by the cost model itself with known framework overheads (bench.framework's cases
    and depths): fit_framework, starting from the same parameters without them, gets them back."""
    from exatrain.bench.framework import CASES, DEPTHS, tiny_model
    from exatrain.planner.cost.calibrate import fit_framework

    base = default_params("cpu")
    truth = {
        "tp_layer_overhead_s": 3e-3,
        "fsdp_layer_overhead_s": 2e-3,
        "pp_microbatch_overhead_s": 4e-4,
        "dp_step_overhead_s": 1.5e-3,
    }
    actual = base.replace(**truth)
    points = []
    for case, tp, pp, dp, zero, mb, gb in CASES:
        for layers in DEPTHS:
            plan = Plan(
                model=tiny_model(layers),
                dims=ParallelDims(tp, pp, dp),
                shape=TrainShape(mb, gb),
                zero_stage=zero,
                dtype="float32",
                cluster="local-cpu",
            )
            points.append(
                {
                    "kind": "framework",
                    "case": case,
                    "plan": plan.to_dict(),
                    "seconds": step_time(plan, CPU, actual)[0].step,
                }
            )
    found, curve = fit_framework(points, base, CPU)
    assert set(found) == set(truth) and len(curve) == len(points)
    for key, value in truth.items():
        assert found[key] == pytest.approx(value, rel=0.05), key


def test_error_stats() -> None:
    s = error_stats([1.1, 0.8, 1.0, 2.0], [1.0, 1.0, 1.0, 1.0])
    assert s["n"] == 4 and s["median"] == pytest.approx(0.15) and s["max"] == pytest.approx(1.0)
    assert s["rms_log"] == pytest.approx(math.sqrt((math.log(1.1) ** 2 + math.log(0.8) ** 2 + math.log(2) ** 2) / 4))


# ---- the real bench, quick ------------------------------------------------------------------------
def test_bench_quick_writes_a_calibration_estimate_reads(tmp_path, capsys) -> None:
    out = tmp_path / "calib.json"
    code, text, err = run(capsys, "bench", "--out", str(out), "--quick", "--ranks", "2", "--json")
    assert code == 0, err
    cal = load_calibration(out)
    p = cal.params_for("cpu")
    assert p.peak_flops and p.peak_flops > 1e8 and 0 < p.gemm_eff <= 1.0
    assert p.mem_bytes_per_s and p.mem_bytes_per_s > 1e8 and p.attn_eff > 0 and p.source.startswith("exatrain bench")
    assert p.gemm_overhead_s > 0 and p.op_overhead_s > 0 and p.step_overhead_s != default_params("cpu").step_overhead_s
    (tier,) = cal.cluster_tiers["local-cpu"]
    assert tier.span == 0 and tier.bytes_per_s > 0 and tier.latency_s > 0
    curves = cal.extra["bench"]["curves"]
    assert curves["gemm"] and curves["memory"] and curves["collectives"]
    assert {c["case"] for c in curves["framework"]} == {"dp", "tp", "fsdp", "pp"}
    # the framework fit ran (its four cases' curve, above) and wrote non-negative overheads; whether DTensor's
    # host time comes out above zero here is a measurement the machine's load moves by as much (it once fitted
    # 0 under load), so what the fit recovers is checked exactly on injected overheads (the test above)
    assert min(p.tp_layer_overhead_s, p.fsdp_layer_overhead_s, p.pp_microbatch_overhead_s, p.dp_step_overhead_s) >= 0
    assert {"measured_tflops", "model_tflops"} <= set(curves["gemm"][0])
    # FP8 GEMMs run on the CPU (PyTorch's _scaled_mm kernels): their measured speed is the calibration's
    assert p.fp8_speedup is not None and p.fp8_speedup > 0
    code, text, err = run(
        capsys,
        "estimate",
        "--model",
        "gpt-tiny",
        "--cluster",
        "local-cpu",
        "--gpus",
        "2",
        "--tp",
        "2",
        "--dtype",
        "float32",
        "--calibration",
        str(out),
        "--json",
    )
    assert code == 0, err
    notes = json.loads(text)["notes"]
    assert any("exatrain bench" in n for n in notes)
    # a CPU plan with FP8 GEMMs is priced at the measured speed (the catalog has no FP8 peak for a CPU)
    code, text, err = run(
        capsys,
        "estimate",
        "--model",
        "gpt-tiny",
        "--cluster",
        "local-cpu",
        "--gpus",
        "1",
        "--dtype",
        "bfloat16",
        "--fp8",
        "current",
        "--calibration",
        str(out),
        "--json",
    )
    assert code == 0, err


def test_fp8_and_flash2_fits_are_their_ratios() -> None:
    """fp8_speedup: summed 16-bit over summed FP8 seconds; fa2_attn_ratio: default backend over FA2;
    a measured fp8_speedup replaces the catalog's peak ratio in the layer time."""
    from exatrain.catalog import get_cluster
    from exatrain.planner.cost import calibrate
    from exatrain.planner.cost import fp8 as cost_fp8

    pts = [
        {"m": 16, "n": 16, "k": 16, "seconds_16": 1.0, "seconds_fp8": 0.5},
        {"m": 32, "n": 32, "k": 32, "seconds_16": 3.0, "seconds_fp8": 1.5},
    ]
    assert calibrate.fit_fp8(pts) == {"fp8_speedup": pytest.approx(4.0 / 2.0)}
    assert calibrate.fit_flash2([{"seconds_default": 1.0, "seconds_fa2": 2.0}]) == {"fa2_attn_ratio": 0.5}
    assert calibrate.fit_fp8([]) == {} and calibrate.fit_flash2([]) == {}
    h100 = get_cluster("dgx-h100")
    prior = default_params("h100-sxm")
    assert cost_fp8.fp8_speedup(h100, "bfloat16", prior.replace(fp8_speedup=None)) == pytest.approx(1978.9 / 989.4)
    assert cost_fp8.fp8_speedup(h100, "bfloat16", prior) == prior.fp8_speedup is not None  # the fitted prior
    assert cost_fp8.fp8_speedup(h100, "bfloat16", prior.replace(fp8_speedup=1.6)) == 1.6
