"""The run with failures (planner/goodput.py): the checkpoint per engine, its save and load at the file system's
rates, Daly's interval, the interruptions from a node MTBF, the wall-clock figures with them, the JSON's `goodput`,
the flags and their refusals, and `--rank-by days` ordering by the figure with failures.

Broken on purpose and seen to fail here (each then restored):
- Daly's interval without its higher-order terms (Young's sqrt(2δM) - δ): test_daly_interval_by_hand fails;
- interruptions counted over the failure-free time instead of the wall-clock time: test_schedule_by_hand fails;
- the lost work per interruption without the load: test_schedule_by_hand fails;
- megatron-deepspeed's checkpoint without the bf16 module weights (12 bytes/param): test_checkpoint_bytes_per_engine
  fails;
- the nodes' network cap dropped: test_rates_and_file_systems fails;
- `rank_key` ordering by the failure-free days: test_rank_by_days_uses_goodput fails;
- --node-mtbf-hours 0 accepted: test_bad_flags_one_line_exit_2 fails.
"""

from __future__ import annotations

import json
import math

import pytest

import exatrain
from exatrain.accounting.params import total_params
from exatrain.catalog import get_cluster, load_cluster_file
from exatrain.errors import UserError
from exatrain.planner.goodput import (
    DEFAULT_NODE_MTBF_HOURS,
    DEFAULT_RESTART_S,
    GoodputOptions,
    checkpoint_bytes,
    daly_interval,
    goodput_options,
    rates,
    schedule,
)
from exatrain.planner.time_to_train import rank, rank_key, with_time_to_train

from tests.helpers.cli import refused, run
from tests.helpers.step_plans import GPT_175B, step_plan


def test_default_node_mtbf_is_llama3s() -> None:
    """2,048 nodes x 54 days x 24 h / 419 unexpected interruptions."""
    assert DEFAULT_NODE_MTBF_HOURS == pytest.approx(2048 * 54 * 24 / 419) == pytest.approx(6334.6253, rel=1e-7)
    assert DEFAULT_RESTART_S == 660.0


def test_daly_interval_by_hand() -> None:
    """δ = 10 s, M = 10,000 s: sqrt(2·10·10,000) = 447.2136, x = δ/2M = 0.0005, ×(1 + sqrt(x)/3 + x/9) =
    ×1.0075091, less δ: 440.5717 s; Young's sqrt(2δM) is its first order; δ ≥ 2M: M."""
    assert daly_interval(10.0, 10_000.0) == pytest.approx(440.5717, rel=1e-6)
    assert daly_interval(10.0, 10_000.0) == pytest.approx(math.sqrt(2 * 10 * 10_000), rel=0.02)
    assert daly_interval(1e-3, 1e6) == pytest.approx(math.sqrt(2 * 1e-3 * 1e6), rel=1e-3)
    assert daly_interval(500.0, 200.0) == 200.0 and daly_interval(400.0, 200.0) == 200.0


def test_schedule_by_hand() -> None:
    """1 TB written at 100 GB/s (10 s), read at 200 GB/s (5 s) by 10 nodes of a 1,000 h MTBF (M = 360,000 s),
    restart 600 s: lost per interruption 600 + 5 + (τ + 10)/2, wall = T(1 + 10/τ)/(1 − lost/M)."""
    s = schedule(10**12, 100e9, 200e9, 10, GoodputOptions(node_mtbf_hours=1000.0, restart_s=600.0))
    tau = daly_interval(10.0, 360_000.0)
    assert (s.save_s, s.load_s, s.mtbf_s, s.interval_s) == (10.0, 5.0, 360_000.0, tau)
    assert s.lost_each_s == pytest.approx(605 + (tau + 10) / 2, rel=1e-12)
    assert s.stretch == pytest.approx((1 + 10 / tau) / (1 - s.lost_each_s / 360_000), rel=1e-12)
    wall = 1e6 * s.stretch  # a million failure-free seconds: saves plus interruptions x lost each, self-consistently
    assert wall == pytest.approx(1e6 + 1e6 * 10 / tau + (wall / 360_000) * s.lost_each_s, rel=1e-12)
    assert s.fraction == pytest.approx(1 / s.stretch)
    never = schedule(10**12, 100e9, 200e9, 10, GoodputOptions(node_mtbf_hours=0.1, restart_s=600.0))
    assert never.stretch is None and never.fraction == 0.0  # 36 s between interruptions, 600 s lost at each


def test_checkpoint_bytes_per_engine() -> None:
    """What a resume loads: 14 bytes/param where the engine saves its bf16 module beside the fp32 main weights and
    the two moments (Megatron-Core, Megatron-DeepSpeed), 12 where it keeps fp32 parameters (torchtitan, exatrain);
    12 in float32 training everywhere. The Frontier study's 1T comes to over 14 TB, as the study counted."""
    n = total_params(exatrain.estimate(model="gpt-1.3b", cluster="dgx-h100", gpus=8).model)
    for runtime, per in (("megatron-deepspeed", 14), ("megatron-core", 14), ("torchtitan", 12), ("exatrain", 12)):
        plan = exatrain.estimate(
            model="gpt-1.3b", cluster="dgx-h100", gpus=8, runtime=runtime, zero=1 if runtime != "torchtitan" else 3
        )
        assert checkpoint_bytes(plan) == n * per, runtime
    from exatrain.api.training import checkpoint_bytes as trainer_checkpoint  # what `train` checks the disk for

    exa = exatrain.estimate(model="gpt-1.3b", cluster="dgx-h100", gpus=8)
    assert checkpoint_bytes(exa) == trainer_checkpoint(exa)
    fp32 = exatrain.estimate(model="gpt-1.3b", cluster="dgx-h100", gpus=8, runtime="megatron-core", dtype="float32")
    assert checkpoint_bytes(fp32) == n * 12
    big = exatrain.estimate(
        model="gpt-1t",
        cluster="frontier",
        gpus=3072,
        tp=8,
        pp=64,
        global_batch=1536,
        zero=1,
        recompute="full",
        runtime="megatron-deepspeed",
    )
    assert 14e12 < checkpoint_bytes(big) == total_params(big.model) * 14 < 14.2e12


def test_rates_and_file_systems(tmp_path) -> None:
    """Frontier writes to Orion (4.6 TB/s write, 5.5 read), a cluster naming none to the typical Lustre (240 GB/s),
    --checkpoint-bandwidth replaces both rates; the nodes' network caps them (1 DGX H100 node: 8 x 50 GB/s)."""
    frontier = exatrain.estimate(model="gpt-1.3b", cluster="frontier", gpus=3072, tp=8, pp=4, global_batch=1536)
    assert rates(frontier, get_cluster("frontier"), None)[:2] == (4.6e12, 5.5e12)
    one_node = step_plan(1.0, None, gpus=8)
    w, r, where = rates(one_node, get_cluster("dgx-h100"), None)
    assert (w, r) == (240e9, 240e9) and "dgx-h100 names none" in where
    w, r, where = rates(one_node, get_cluster("dgx-h100"), 1000e9)
    assert (w, r) == (400e9, 400e9) and "capped" in where
    assert rates(step_plan(1.0, None, gpus=64), get_cluster("dgx-h100"), 1000e9)[:2] == (1000e9, 1000e9)
    f = tmp_path / "c.toml"
    f.write_text(
        'name = "mine"\ndevice = "h100-sxm"\ngpus_per_node = 8\nfilesystem = {write_bytes_per_s = 5e10, '
        'read_bytes_per_s = 6e10}\n[[tier]]\nname = "net"\nspan = 0\nbytes_per_s = 5e10\nlatency_s = 1e-5\n'
    )
    assert load_cluster_file(f).filesystem.write_bytes_per_s == 5e10
    for bad, message in (
        ('"nowhere"', "unknown file system 'nowhere'"),
        ("{write_bytes_per_s = -1, read_bytes_per_s = 1}", "must be a positive number"),
    ):
        f.write_text(
            f'device = "h100-sxm"\ngpus_per_node = 8\nfilesystem = {bad}\n[[tier]]\nspan = 0\n'
            "bytes_per_s = 5e10\nlatency_s = 1e-5\n"
        )
        with pytest.raises(UserError, match=message):
            load_cluster_file(f)


def test_goodput_figures_by_hand() -> None:
    """gpt-1.3b on 64 H100s (8 nodes), 10 s a step (band 6–15 s), 1T tokens: every figure from the schedule's own
    arithmetic, the band's ends the same formula at its step times, the fraction and interval without a band."""
    plan = with_time_to_train(step_plan(10.0, (6.0, 15.0)), get_cluster("dgx-h100"), (10**12, 2.5, 1.0))
    t = plan.estimate.time_to_train
    g = t["goodput"]
    assert {
        "checkpoint_bytes",
        "save_s",
        "load_s",
        "interval_s",
        "interruptions",
        "lost_hours",
        "days",
        "gpu_hours",
        "fraction",
    } <= set(g)
    s = schedule(checkpoint_bytes(plan), 240e9, 240e9, 8, GoodputOptions())
    assert (g["save_s"], g["load_s"], g["interval_s"], g["nodes"]) == (s.save_s, s.load_s, s.interval_s, 8)
    assert g["fraction"] == pytest.approx(1 / s.stretch) and 0.9 < g["fraction"] < 1
    for end in ("value", "low", "high"):
        wall_h = t["days"][end] * 24 * s.stretch
        assert g["days"][end] == pytest.approx(wall_h / 24, rel=1e-12)
        assert g["interruptions"][end] == pytest.approx(8 * wall_h / DEFAULT_NODE_MTBF_HOURS, rel=1e-12)
        assert g["lost_hours"][end] == pytest.approx(g["interruptions"][end] * s.lost_each_s / 3600, rel=1e-12)
        assert g["gpu_hours"][end] == pytest.approx(64 * wall_h, rel=1e-12)
        assert g["cost"][end] == pytest.approx(2.5 * 64 * wall_h, rel=1e-12)
        assert g["energy_mwh"][end] == pytest.approx(t["energy_mwh"][end] * s.stretch, rel=1e-12)
    assert g["days"]["low"] < g["days"]["value"] < g["days"]["high"]


def test_rank_by_days_uses_goodput() -> None:
    """At a 50 h node MTBF, 128 GPUs (16 nodes) at 6.0 s a step are faster without failures than 64 GPUs at 6.1 s,
    but lose more to interruptions (one every 3.1 h against 6.3 h): slower with them, so --rank-by days puts the
    64 first and says the order differs from throughput's."""
    cluster, run = get_cluster("dgx-h100"), (10**12, None, 1.0, GoodputOptions(node_mtbf_hours=50.0))
    many = with_time_to_train(step_plan(6.0, None, gpus=128), cluster, run)
    few = with_time_to_train(step_plan(6.1, None, gpus=64), cluster, run)
    t_many, t_few = many.estimate.time_to_train, few.estimate.time_to_train
    assert t_many["days"]["value"] < t_few["days"]["value"]
    assert t_many["goodput"]["days"]["value"] > t_few["goodput"]["days"]["value"]
    ranked, note = rank([many, few], "days")
    assert ranked == [few, many] and "differs from throughput's" in note
    assert rank_key(few, "days") == t_few["goodput"]["days"]["value"]
    never = with_time_to_train(
        step_plan(6.0, None, gpus=128), cluster, (10**12, None, 1.0, GoodputOptions(node_mtbf_hours=0.5))
    )
    assert never.estimate.time_to_train["goodput"]["days"] is None and rank_key(never, "days") == math.inf


def test_estimate_json_and_text(capsys) -> None:
    """The flags reach the JSON: 2 GB/s gives save = checkpoint / 2e9, 1,000 h the interruptions, 5 min the
    restart; the text prints the checkpoint, the interval, the interruptions and the days with failures."""
    extra = ["--tokens", "300B", "--checkpoint-bandwidth", "2", "--node-mtbf-hours", "1000", "--restart-minutes", "5"]
    code, out, err = run(capsys, "estimate", *GPT_175B, *extra, "--json")
    assert code == 0, err
    t = json.loads(out)["time_to_train"]
    g = t["goodput"]
    assert g["checkpoint_bytes"] == 174_620_000_000 * 14 or g["checkpoint_bytes_per_param"] == 14.0
    assert g["save_s"] == pytest.approx(g["checkpoint_bytes"] / 2e9) and g["restart_s"] == 300.0
    assert g["interruptions"]["value"] == pytest.approx(16 * g["days"]["value"] * 24 / 1000, rel=1e-12)
    assert set(g["days"]) == {"value", "low", "high"} and g["days"]["value"] > t["days"]["value"]
    code, out, _ = run(capsys, "estimate", *GPT_175B, *extra)
    text = " ".join(out.split())
    assert code == 0 and "checkpoint 2.44 TB" in text and f"save {g['save_s']:,.1f} s" in text
    assert "with failures: interruptions" in text and "goodput" in text
    assert "node MTBF 1,000.0 h (--node-mtbf-hours)" in text


def test_search_and_scaling_carry_it(capsys) -> None:
    """Every ranked layout carries goodput; --rank-by days orders by its days; the table has the column."""
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
        "5",
        "--tokens",
        "1T",
    )
    code, out, _ = run(capsys, *args, "--rank-by", "days", "--json")
    days = [p["time_to_train"]["goodput"]["days"]["value"] for p in json.loads(out)["ranked"]]
    assert code == 0 and len(days) == 5 and days == sorted(days)
    first = json.loads(out)["ranked"][0]["time_to_train"]["goodput"]
    code, out, _ = run(capsys, *args, "--rank-by", "days")
    assert code == 0 and f"{first['days']['value']:,.1f} │" in out
    assert "first row's with failures" in " ".join(out.split())
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
    nodes = [p["time_to_train"]["goodput"]["nodes"] for p in json.loads(out)["points"]]
    assert code == 0 and nodes == [16, 32]


def test_bad_flags_one_line_exit_2(capsys) -> None:
    for extra, text in (
        (["--node-mtbf-hours", "-5"], "--node-mtbf-hours must be a finite number above 0"),
        (["--node-mtbf-hours", "0"], "--node-mtbf-hours must be"),
        (["--node-mtbf-hours", "lots"], "--node-mtbf-hours must be"),
        (["--node-mtbf-hours", "inf"], "--node-mtbf-hours must be"),
        (["--checkpoint-bandwidth", "0"], "--checkpoint-bandwidth must be"),
        (["--checkpoint-bandwidth", "-2"], "--checkpoint-bandwidth must be"),
        (["--checkpoint-bandwidth", "nan"], "--checkpoint-bandwidth must be"),
        (["--restart-minutes", "x"], "--restart-minutes must be"),
    ):
        for command in ("estimate", "search"):
            line = refused(capsys, command, *GPT_175B, "--tokens", "1T", *extra)
            assert text in line, (command, extra, line)
    line = refused(
        capsys,
        "scaling",
        "--model",
        "gpt-175b",
        "--gpus",
        "128",
        "--global-batch",
        "640",
        "--tokens",
        "1T",
        "--checkpoint-bandwidth",
        "0",
    )
    assert "--checkpoint-bandwidth must be" in line
    for flag in ("--node-mtbf-hours", "--checkpoint-bandwidth", "--restart-minutes"):
        assert "needs --tokens" in refused(capsys, "estimate", *GPT_175B, flag, "10")
    with pytest.raises(UserError, match="--node-mtbf-hours"):
        goodput_options(node_mtbf_hours=True)
