"""Planning with model states in host memory (``--offload``): what leaves the GPU (accounting.offload), the node's
host memory, the step's offload term (cost.offload), the refusals, the exports, and the search that offers it only
when nothing fits without it.

Broken on purpose and seen to fail here: the master weights left on the GPU under optimizer offload (``offloaded``
moving none of them: the memory test); the gradient copy counted as exposed rather than hidden behind the backward
(the step-term test); the host-memory check skipped in ``estimate_plan`` (the host test); the search's fallback run
even when a layout fits (the search test's second half)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster, get_model
from exatrain.engine_configs import export
from exatrain.errors import UserError
from exatrain.planner.cost.offload import CPU_ADAM_PARAMS_PER_S
from exatrain.planner.estimate import estimate_plan
from exatrain.planner.search.search import search
from exatrain.planner.search.space import SpaceOptions
from tests.helpers.upstream_names import DEEPSPEED_OFFLOAD_KEYS, MEGATRON_LM_OFFLOAD_OPTIONS, TORCHTITAN_03_OPTIONS

H100 = get_cluster("dgx-h100")
# llama3-70b on one DGX H100 node, tp 8, ZeRO-1, Megatron-DeepSpeed: 18 bytes a parameter does not fit 80 GB
DS = dict(gpus=8, tp=8, zero=1, recompute="full", micro_batch=1, global_batch=16, runtime="megatron-deepspeed")


def _est(model: str, cluster=H100, **kw):
    plan = make_plan(model, cluster, **kw)
    return plan, estimate_plan(plan, cluster)


def test_a_plan_that_does_not_fit_fits_with_the_optimizer_in_host_memory() -> None:
    plan, without = _est("llama3-70b", **DS)
    _, with_ = _est("llama3-70b", **DS, offload="optimizer")
    assert not without.fits and with_.fits and with_.verdict == "fits"
    n = without.params_by_stage[0]
    a, b = without.memory_bytes, with_.memory_bytes
    assert b.optimizer == 0.0 and a.optimizer == pytest.approx(8.0 * n)  # Adam's states, dp 1
    assert a.weights - b.weights == pytest.approx(4.0 * n)  # the fp32 master weights
    assert a.gradients == b.gradients  # ZeRO-1's 16-bit gradients stay whole on the GPU
    # the node's 8 ranks keep master weights, an fp32 gradient partition and Adam's states: 16 bytes a parameter
    assert with_.host_memory == {
        "bytes_per_node": pytest.approx(8 * 16.0 * n),
        "fits": True,
        "capacity_bytes": H100.host_memory_bytes,
    }


def test_the_step_prices_the_cpu_adam_and_the_exposed_copy() -> None:
    plan, est = _est("llama3-70b", **DS, offload="optimizer")
    n = est.params_by_stage[0]
    # the node's 8 partitions through DeepSpeed's CPU-Adam; the bf16 gradients go out behind the backward (hidden),
    # the updated bf16 weights come back before the next forward (exposed), over 64 GB/s of PCIe Gen5
    adam = 8 * n / CPU_ADAM_PARAMS_PER_S["cpu-adam"]
    assert est.time_s.offload == pytest.approx(adam + 2.0 * n / 64e9, rel=1e-9)
    _, plain = _est("llama3-70b", **DS)
    assert est.time_s.step > plain.time_s.step + adam * 0.99  # the CPU's Adam dominates what offload costs
    assert est.time_s.optimizer < plain.time_s.optimizer  # Adam no longer runs on the GPU
    note = next(x for x in est.notes if x.startswith("offload optimizer:"))
    assert "Ren et al. 2021 (ZeRO-Offload), Table 2" in note and "64 GB/s" in note
    assert f"{2.0 * n / 64e9:.3f} s of them not hidden behind compute; Adam on the CPU {adam:.3f} s" in note
    assert est.time_s.to_dict()["offload"] == est.time_s.offload
    assert "offload" not in plain.time_s.to_dict()  # plans without offload keep their JSON


def test_fsdp2_params_offload_frees_the_sharded_states() -> None:
    kw = dict(gpus=8, zero=3, micro_batch=1, global_batch=16, recompute="full", runtime="torchtitan")
    _, without = _est("llama3-70b", **kw)
    _, with_ = _est("llama3-70b", **kw, offload="params")
    n = without.params_by_stage[0]
    assert not without.fits and with_.fits
    # FSDP2 at ZeRO-3 shards all 16 bytes a parameter over dp 8; CPUOffloadPolicy keeps them all on the host
    assert without.memory_bytes.optimizer == pytest.approx(8.0 * n / 8) and with_.memory_bytes.optimizer == 0.0
    assert with_.host_memory["bytes_per_node"] == pytest.approx(8 * 16.0 * n / 8)
    assert with_.time_s.offload > 0


def test_host_memory_that_does_not_hold_the_states_does_not_fit() -> None:
    frontier = get_cluster("frontier")
    _, est = _est("megatron-39.1b", frontier, **DS, offload="optimizer")
    assert est.memory_bytes.total < frontier.device.hbm_bytes  # the GCDs hold what is left on them
    n = est.params_by_stage[0]  # a tp rank's (its replicated norms counted on each)
    assert est.host_memory["bytes_per_node"] == pytest.approx(8 * 16.0 * n)  # 16 B a parameter, 8 GCDs a node
    assert est.host_memory["bytes_per_node"] > 0.9 * frontier.host_memory_bytes
    assert not est.fits and est.verdict == "does not fit" and not est.host_memory["fits"]


@pytest.mark.parametrize(
    "runtime, zero, offload, line",
    [
        (
            "megatron-core",
            3,
            "params",
            "--offload params is not run by megatron-core; it is run by megatron-deepspeed, "
            "torchtitan or exatrain (megatron-core offloads --offload optimizer)",
        ),
        ("megatron-core", 2, "optimizer", "--offload optimizer under megatron-core needs --zero 1 (got 2)"),
        ("megatron-deepspeed", 1, "params", "--offload params under megatron-deepspeed needs --zero 3 (got 1)"),
        (
            "torchtitan",
            3,
            "optimizer",
            "--offload optimizer is not run by torchtitan; it is run by megatron-deepspeed or "
            "megatron-core (torchtitan offloads --offload params)",
        ),
        (
            "llm-foundry",
            3,
            "params",
            "--offload params is not run by llm-foundry; it is run by megatron-deepspeed, torchtitan or exatrain",
        ),
    ],
)
def test_a_runtime_without_the_offload_is_refused_in_one_line(runtime, zero, offload, line) -> None:
    with pytest.raises(UserError) as e:
        make_plan("llama3-8b", H100, gpus=8, zero=zero, runtime=runtime, offload=offload)
    assert str(e.value) == line


def test_a_cluster_without_host_memory_is_refused_at_the_command_line() -> None:
    cmd = [
        sys.executable,
        "-m",
        "exatrain",
        "estimate",
        "--model",
        "llama3-8b",
        "--cluster",
        "mi300x-platform",
        "--gpus",
        "8",
        "--zero",
        "1",
        "--runtime",
        "megatron-deepspeed",
        "--offload",
        "optimizer",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "exatrain estimate: error: --offload optimizer: cluster mi300x-platform states no host memory per node; "
        "describe it in a --cluster-file with host_memory_bytes and host_link_bytes_per_s"
    ]


def test_the_exports_offload_what_the_plan_priced() -> None:
    plan, _ = _est("llama3-70b", **DS, offload="optimizer")
    ds = export(plan, "deepspeed")
    cfg = json.loads(dict(ds.files)["ds_config.json"])
    assert cfg["zero_optimization"] == {"stage": 1, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    z3 = make_plan("llama3-70b", H100, **{**DS, "zero": 3}, offload="params")
    cfg3 = json.loads(dict(export(z3, "deepspeed").files)["ds_config.json"])
    assert cfg3["zero_optimization"] == {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
    }
    mc = make_plan("llama3-70b", H100, **{**DS, "runtime": "megatron-core"}, offload="optimizer")
    words = export(mc, "megatron").text.split()
    assert "--optimizer-cpu-offload" in words and "--use-distributed-optimizer" in words
    offload_flags = {w for w in words if w.startswith("--") and ("offload" in w or "precision-aware" in w)}
    assert offload_flags and offload_flags <= MEGATRON_LM_OFFLOAD_OPTIONS
    for block in ("offload_optimizer", "offload_param"):  # the fields DeepSpeed's offload config has
        assert set(cfg3["zero_optimization"][block]) <= DEEPSPEED_OFFLOAD_KEYS[block]
    titan = make_plan("llama3-70b", H100, gpus=8, zero=3, runtime="torchtitan", offload="params")
    assert "enable_cpu_offload = true" in export(titan, "torchtitan").text
    args = export(titan, "torchtitan-0.3").text.split()
    assert "--training.enable-cpu-offload" in args and "--training.enable-cpu-offload" in TORCHTITAN_03_OPTIONS
    assert "enable_cpu_offload = " not in export(plan, "torchtitan").text  # optimizer alone: noted, not written
    assert any("enable_cpu_offload" in n for n in export(plan, "torchtitan").notes)


def test_the_search_offers_offload_only_when_nothing_fits_without() -> None:
    res = search(get_model("llama3-70b"), H100, 8, 16, top=3, runtime="exatrain")
    assert res.ranked and all(p.offload == "params" and p.estimate.fits for p in res.ranked)
    assert any(n.startswith("no layout fits without offload") for n in res.notes)
    assert all(p.zero_stage in (2, 3) for p in res.ranked)
    # where a layout fits as it is, none is offloaded
    small = search(get_model("llama3-8b"), H100, 8, 16, top=3, runtime="exatrain")
    assert small.ranked and all(p.offload == "none" for p in small.ranked)
    assert not any("offload" in n for n in small.notes)
    # a search told to offload searches that, and only the stages it runs at
    told = search(
        get_model("llama3-8b"), H100, 8, 16, top=3, runtime="exatrain", options=SpaceOptions(offload="params")
    )
    assert told.ranked and all(p.offload == "params" and p.zero_stage >= 2 for p in told.ranked)
