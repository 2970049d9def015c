"""FSDP sends its parameter gathers and gradient reduce-scatters one wrapped unit at a time (every transformer block
and the root unit: ``EngineProfile.collectives_per_unit``, llm-foundry's FSDP1 and torchtitan's FSDP2), so each of
those calls pays the collective library's fixed latency and its ring's (n - 1) latency steps; the bytes a step
moves are unchanged. On a group across nodes that latency grows with the GPU count, which one call a step hid.

Broken on purpose and seen to fail here: ``per_unit`` dividing the count instead of multiplying it (the count and
the seconds tests); the per-unit split applied before the FP8-gathered bytes are taken off (the FP8 bytes test);
``wrapped_units`` without the root unit (the count test)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from exatrain.accounting.engines import Resolved, get_engine
from exatrain.catalog import get_cluster, get_model
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.cost.dp import dp_collective_times, engine_dp_collectives, wrapped_units
from exatrain.planner.cost.network import node_bus_bandwidth

H100 = get_cluster("dgx-h100")
MPT = get_model("llama3-8b").replace(seq_len=2048)
P = 1.0e9  # parameters on the rank


def _collectives(engine, zero: int, dp: int = 128, pp: int = 1, fp8=None):
    return engine_dp_collectives(
        MPT,
        tp=1,
        pp=pp,
        dp=dp,
        zero_stage=zero,
        params_here=P,
        num_microbatches=1,
        dtype="bfloat16",
        pipeline_end=True,
        engine=engine,
        fp8_gathered=fp8,
    )


def test_the_fsdp_engines_send_per_unit() -> None:
    for name in ("llm-foundry", "torchtitan"):
        assert get_engine(name).collectives_per_unit and get_engine(name).collectives_per_unit_source
    for name in ("megatron-core", "megatron-deepspeed", "exatrain"):
        assert not get_engine(name).collectives_per_unit


@pytest.mark.parametrize("zero", [2, 3])
def test_one_call_a_unit_same_bytes(zero: int) -> None:
    """L blocks + the root: L + 1 calls of each data-parallel collective, 1/(L + 1) of the bytes each."""
    fsdp = get_engine("llm-foundry")
    once = replace(fsdp, collectives_per_unit=False)
    units = MPT.layers + 1
    assert float(wrapped_units(MPT, 1)) == units and float(wrapped_units(MPT, 4)) == np.ceil(MPT.layers / 4) + 1
    per, one = _collectives(fsdp, zero), _collectives(once, zero)
    assert len(per) == len(one)
    for a, b in zip(per, one):
        assert a.kind == b.kind
        assert float(np.asarray(a.count)) == pytest.approx(units * float(np.asarray(b.count)))
        assert float(np.asarray(a.bytes_per_rank)) == pytest.approx(float(np.asarray(b.bytes_per_rank)), rel=1e-12)


def test_zero_1_and_other_engines_unchanged() -> None:
    fsdp = get_engine("llm-foundry")
    assert _collectives(fsdp, 1) == _collectives(replace(fsdp, collectives_per_unit=False), 1)
    mc = get_engine("megatron-core")
    assert all(float(np.asarray(c.count)) == 1.0 for c in _collectives(mc, 3) if c.kind == "reduce_scatter")


def test_fp8_gathered_bytes_taken_off_before_the_split() -> None:
    """The FP8-gathered weights' saving is a rank's whole; split per unit after it, the step's bytes match."""
    fsdp = get_engine("llm-foundry")
    fp8 = (np.array([[0.6 * P]]), np.array([[0.0]]))
    per = _collectives(fsdp, 3, fp8=fp8)
    one = _collectives(replace(fsdp, collectives_per_unit=False), 3, fp8=fp8)
    assert len(per) == len(one) and any(c.kind == "all_gather" for c in per)
    for a, b in zip(per, one):
        np.testing.assert_allclose(a.bytes_per_rank, b.bytes_per_rank, rtol=1e-12)


def test_the_latency_paid_per_unit_grows_with_the_gpus() -> None:
    """ZeRO-2 over dp ranks on 8-GPU nodes: each gather and reduce-scatter pays, L more times than one call a step,
    NCCL's base latency plus its ring's (nodes - 1) network hops and (n - nodes) in-node hops."""
    params = default_params("h100-sxm")
    fsdp = get_engine("llm-foundry")
    extra = {}
    for dp in (128, 512):
        kw = dict(tp=1, pp=1, dp=dp, zero_stage=2, params_here=P, num_microbatches=1, pipeline_end=True)
        per = dp_collective_times(H100, params, MPT, run=Resolved(engine=fsdp), **kw)
        one = dp_collective_times(
            H100, params, MPT, run=Resolved(engine=replace(fsdp, collectives_per_unit=False)), **kw
        )
        _, lat_net, lat_in, nodes, _ = node_bus_bandwidth(H100, dp, dp, params)
        call = params.collective_overhead_s + (float(nodes) - 1) * float(lat_net) + (dp - float(nodes)) * float(lat_in)
        # one reduce-scatter and one all-gather, each L more calls
        assert float(np.sum(per)) - float(np.sum(one)) == pytest.approx(2 * MPT.layers * call, rel=1e-9)
        extra[dp] = float(np.sum(per)) - float(np.sum(one))
    assert extra[512] > 3.5 * extra[128]
