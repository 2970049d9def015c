"""The whole run at a token budget (planner/time_to_train.py): steps, days, GPU-hours, energy and cost from a known
estimate, the token-count parser, the JSON of estimate / search / scaling, `search --rank-by` and the text tables.

Broken on purpose and seen to fail (each then restored):
- steps = ceil(tokens / global_batch), the seq_len factor dropped: test_figures_by_hand and the 175B CLI test fail;
- GPU-hours without the GPU count: test_figures_by_hand fails;
- the band's low and high taken as the value (step_s for step_range_s[0]): test_figures_by_hand fails;
- power_overhead left out of the energy: test_figures_by_hand fails;
- `rank` sorting by throughput whatever --rank-by says: test_rank_by_gpu_hours_differs_from_throughput fails;
- "T" read as 10**9: test_token_counts fails.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

import exatrain
from exatrain.catalog import get_cluster
from exatrain.catalog.hardware import _device_from
from exatrain.errors import UserError
from exatrain.plan import Plan
from exatrain.planner.time_to_train import parse_tokens, rank, run_options, time_to_train, with_time_to_train

from tests.helpers.cli import refused, run
from tests.helpers.step_plans import GPT_175B, step_plan


def test_figures_by_hand() -> None:
    """1e12 tokens at 1024 x 2048 = 2,097,152 tokens a step: 476,837.158... -> 476,838 steps; at 10 s a step
    (band 6-15 s) on 64 GPUs of 700 W with a 1.5 overhead and a 2.5 GPU-hour price."""
    plan = step_plan(10.0, (6.0, 15.0))
    device = dataclasses.replace(get_cluster("dgx-h100").device, tdp_watts=700.0)
    t = time_to_train(plan, device, 10**12, gpu_hour_price=2.5, power_overhead=1.5)
    assert t is not None
    assert (t["tokens"], t["tokens_per_step"], t["steps"], t["gpus"]) == (10**12, 2_097_152, 476_838, 64)
    assert t["tokens_trained"] == 476_838 * 2_097_152 >= 10**12
    wall = {"value": 4_768_380.0, "low": 476_838 * 6.0, "high": 476_838 * 15.0}  # seconds
    for end, s in wall.items():
        assert t["days"][end] == pytest.approx(s / 86_400, rel=1e-12)
        assert t["gpu_hours"][end] == pytest.approx(64 * s / 3_600, rel=1e-12)
        assert t["energy_mwh"][end] == pytest.approx(64 * 700 * 1.5 * s / 3.6e9, rel=1e-12)
        assert t["cost"][end] == pytest.approx(2.5 * 64 * s / 3_600, rel=1e-12)
    assert t["days"]["value"] == pytest.approx(55.189583, rel=1e-6)  # 4,768,380 s
    assert t["energy_mwh"]["value"] == pytest.approx(89.00976, rel=1e-6)  # 64 x 700 W x 1.5 x 4,768,380 s
    assert "TDP" in t["power"] and "1.5" in t["power"]


def test_no_power_no_band_no_price() -> None:
    """A device without tdp_watts has no energy, a price not given no cost, an estimate without a band no low/high;
    the GPUs-alone basis is said."""
    plan = step_plan(2.0, None)
    device = dataclasses.replace(get_cluster("dgx-h100").device, tdp_watts=None)
    t = time_to_train(plan, device, 2_097_152 * 3)
    assert t is not None and t["steps"] == 3 and t["energy_mwh"] is None and t["cost"] is None
    assert t["days"] == {"value": 6.0 / 86_400, "low": None, "high": None}
    plain = time_to_train(plan, get_cluster("dgx-h100").device, 1)
    assert plain is not None and plain["steps"] == 1 and "the GPUs alone" in plain["power"]
    assert with_time_to_train(plan, get_cluster("dgx-h100"), None) is plan


@pytest.mark.parametrize(
    "text, tokens",
    [
        ("15T", 15 * 10**12),
        ("300e9", 300 * 10**9),
        ("1.5e12", 1_500_000_000_000),
        ("300B", 300 * 10**9),
        ("300000000000", 300 * 10**9),
        ("2.5M", 2_500_000),
        ("15t", 15 * 10**12),
        (" 7 ", 7),
        (300e9, 300 * 10**9),
        (10**13, 10**13),
        ("1_000", 1000),
        ("1e18", 10**18),
    ],
)
def test_token_counts(text, tokens) -> None:
    assert parse_tokens(text) == tokens


@pytest.mark.parametrize(
    "text",
    [
        "abc",
        "",
        "0",
        "-5",
        "1.5",
        "0.5",
        "nan",
        "inf",
        "-inf",
        "1e19",
        "1e999999999",
        "1e-999999999",
        "15X",
        "T",
        "3.0000000000000000000000000000001",
        True,
        2.5,
        1e300,
    ],
)
def test_nonsense_token_counts(text) -> None:
    with pytest.raises(UserError, match="--tokens"):
        parse_tokens(text)


def test_run_options_refusals() -> None:
    assert run_options(None) is None and run_options("1T")[:3] == (10**12, None, 1.0)
    for kw, message in (
        ({"tokens": None, "gpu_hour_price": 2}, "--gpu-hour-price needs --tokens"),
        ({"tokens": None, "power_overhead": 1.2}, "--power-overhead needs --tokens"),
        ({"tokens": None, "rank_by": "days"}, "--rank-by days needs --tokens"),
        ({"tokens": "1T", "rank_by": "cost"}, "--rank-by cost needs --gpu-hour-price"),
        ({"tokens": "1T", "rank_by": "speed"}, "--rank-by must be one of"),
        ({"tokens": "1T", "gpu_hour_price": -1}, "--gpu-hour-price must be"),
        ({"tokens": "1T", "gpu_hour_price": "nan"}, "--gpu-hour-price must be"),
        ({"tokens": "1T", "power_overhead": 0.9}, "--power-overhead must be"),
    ):
        with pytest.raises(UserError, match=message):
            run_options(**kw)


def test_bad_flags_are_one_line_exit_2(capsys, tmp_path) -> None:
    """Through the shell's code path: one line, exit 2, and no --out file half-written."""
    out = tmp_path / "p.json"
    for command, extra, text in (
        ("estimate", ["--tokens", "lots"], "--tokens must be"),
        ("estimate", ["--tokens", "2.5"], "whole number"),
        ("scaling", ["--tokens", "0"], "--tokens must be"),
        ("search", ["--tokens", "15Q"], "--tokens must be"),
        ("estimate", ["--gpu-hour-price", "3"], "needs --tokens"),
        ("estimate", ["--tokens", "1T", "--power-overhead", "x"], "--power-overhead"),
        ("search", ["--rank-by", "days"], "needs --tokens"),
        ("search", ["--rank-by", "fastest", "--tokens", "1T"], "invalid choice"),
    ):
        args = GPT_175B if command != "scaling" else ["--model", "gpt-175b", "--gpus", "128", "--global-batch", "640"]
        line = refused(capsys, command, *args, *extra, *(["--out", str(out)] if command == "estimate" else []))
        assert text in line, (command, extra, line)
    assert not out.exists()


def test_estimate_175b_json_end_to_end(capsys, tmp_path) -> None:
    """The 175B Frontier layout: 300e9 tokens / (640 x 2048 = 1,310,720 a step) = 228,881.8 -> 228,882 steps; days,
    GPU-hours and energy (128 GCDs x 280 W) at the predicted step time and at each end of its band."""
    saved_to = str(tmp_path / "p.json")
    code, out, err = run(capsys, "estimate", *GPT_175B, "--tokens", "300e9", "--json", "--out", saved_to)
    assert code == 0, err
    d = json.loads(out)
    t = d["time_to_train"]
    assert {"days", "gpu_hours", "energy_mwh", "cost", "tokens", "steps"} <= set(t)
    assert (t["tokens"], t["tokens_per_step"], t["steps"], t["gpus"], t["cost"]) == (
        300 * 10**9,
        1_310_720,
        228_882,
        128,
        None,
    )
    step, (lo, hi) = d["time_s"]["step"], d["step_range_s"]
    for key, per_second in (("days", 1 / 86_400), ("gpu_hours", 128 / 3_600), ("energy_mwh", 128 * 280 / 3.6e9)):
        assert set(t[key]) == {"value", "low", "high"}
        for end, s in (("value", step), ("low", lo), ("high", hi)):
            assert t[key][end] == pytest.approx(228_882 * s * per_second, rel=1e-12), (key, end)
        assert t[key]["low"] < t[key]["value"] < t[key]["high"]
    assert t["tdp_watts"] == 280.0 and t["power_overhead"] == 1.0
    saved = Plan.load(tmp_path / "p.json")  # the plan written carries it, and reads back
    assert saved.estimate is not None and saved.estimate.time_to_train == t
    code, out, _ = run(capsys, "estimate", *GPT_175B, "--tokens", "300B", "--gpu-hour-price", "2", "--json")
    cost = json.loads(out)["time_to_train"]["cost"]
    assert code == 0 and cost["value"] == pytest.approx(2 * t["gpu_hours"]["value"], rel=1e-12)
    code, out, _ = run(capsys, "estimate", *GPT_175B, "--json")
    assert code == 0 and "time_to_train" not in json.loads(out)  # no budget, no figures


def test_estimate_text(capsys) -> None:
    code, out, _ = run(capsys, "estimate", *GPT_175B, "--tokens", "300B", "--gpu-hour-price", "2")
    text = " ".join(out.split())
    assert code == 0
    assert "300B tokens: 228,882 steps of 1,310,720 tokens" in text
    assert "time to train: days" in text and "GPU-hours" in text and "MWh" in text and "a GPU-hour" in text
    assert "at its TDP, 280 W" in text and "hosts, network and cooling excluded" in text


def test_python_api() -> None:
    plan = exatrain.estimate(
        model="gpt-175b",
        cluster="frontier",
        gpus=128,
        tp=4,
        pp=16,
        global_batch=640,
        zero=1,
        recompute="full",
        runtime="megatron-deepspeed",
        tokens=300e9,
        power_overhead=1.25,
    )
    t = plan.estimate.time_to_train
    assert t["steps"] == 228_882 and t["power_overhead"] == 1.25
    assert t["energy_mwh"]["value"] == pytest.approx(1.25 * 128 * 280 * t["days"]["value"] * 86_400 / 3.6e9)


def test_search_rank_by_days(capsys) -> None:
    """On one GPU count and batch, --rank-by days orders as throughput does, by days ascending, and says why."""
    args = (
        "search",
        "--model",
        "gpt-22b",
        "--cluster",
        "dgx-a100",
        "--gpus",
        "64",
        "--global-batch",
        "256",
        "--top",
        "8",
        "--json",
    )
    code, out, _ = run(capsys, *args, "--tokens", "1T", "--rank-by", "days")
    d = json.loads(out)
    days = [p["time_to_train"]["days"]["value"] for p in d["ranked"]]
    assert code == 0 and len(days) == 8 and days == sorted(days)
    assert any("ranked by days: every layout runs" in n and "the order is throughput's" in n for n in d["notes"])
    code, out, _ = run(capsys, *args)
    by_throughput = json.loads(out)["ranked"]
    assert [p["plan"] for p in d["ranked"]] == [p["plan"] for p in by_throughput]
    code, out, _ = run(capsys, *args[:-1], "--tokens", "1T", "--gpu-hour-price", "3", "--rank-by", "cost")
    assert code == 0 and "cost" in out and "ranked by cost" in " ".join(out.split())


def test_rank_by_gpu_hours_differs_from_throughput() -> None:
    """Where layouts run different GPU counts (as scaling's points do), the fastest is not the cheapest in
    GPU-hours: 64 GPUs at 10 s a step take 640 GPU-seconds a step, 128 GPUs at 6 s take 768."""
    cluster = get_cluster("dgx-h100")
    small = with_time_to_train(step_plan(10.0, None, gpus=64), cluster, (10**12, None, 1.0))
    big = with_time_to_train(step_plan(6.0, None, gpus=128), cluster, (10**12, None, 1.0))
    ranked, note = rank([big, small], "gpu_hours")
    assert ranked == [small, big] and "differs from throughput's" in note
    ranked, note = rank([small, big], "days")
    assert ranked == [big, small] and "yet the order is throughput's" in note
    assert rank([small, big], "throughput") == ([small, big], None)


def test_scaling_points_carry_it(capsys) -> None:
    """Weak scaling doubles the batch with the GPUs: half the steps (rounded up) at each doubling."""
    code, out, _ = run(
        capsys,
        "scaling",
        "--model",
        "gpt-175b",
        "--cluster",
        "frontier",
        "--gpus",
        "128,256",
        "--global-batch",
        "640",
        "--tp",
        "4",
        "--pp",
        "16",
        "--tokens",
        "300B",
        "--json",
    )
    points = json.loads(out)["points"]
    steps = [p["time_to_train"]["steps"] for p in points]
    assert code == 0 and steps == [math.ceil(300e9 / (640 * 2048)), math.ceil(300e9 / (1280 * 2048))]
    for p in points:
        t = p["time_to_train"]
        assert t["gpus"] == p["gpus"]
        assert t["gpu_hours"]["value"] == pytest.approx(p["gpus"] * t["days"]["value"] * 24, rel=1e-12)
    code, out, _ = run(
        capsys,
        "scaling",
        "--model",
        "gpt-175b",
        "--cluster",
        "frontier",
        "--gpus",
        "128,256",
        "--global-batch",
        "640",
        "--tp",
        "4",
        "--pp",
        "16",
        "--tokens",
        "300B",
    )
    assert code == 0 and "days" in out and "GPU-hours" in out and "time to train 300B tokens" in out


def test_catalog_power() -> None:
    """Every accelerator of the catalog has a power figure; a cluster file's must be a positive number."""
    from exatrain.catalog.hardware import device_catalog

    assert all(d.tdp_watts and d.tdp_watts > 0 for n, d in device_catalog().items() if n != "cpu")
    assert device_catalog()["mi250x-gcd"].tdp_watts == 280.0  # half an MI250X's 560 W
    with pytest.raises(UserError, match="tdp_watts must be a positive number"):
        _device_from("x", {"hbm_bytes": 1, "hbm_bytes_per_s": 1.0, "tdp_watts": -700}, "f.toml")
