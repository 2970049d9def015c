"""How the loss runs over the logits (``Plan.cross_entropy``, plan.CROSS_ENTROPY): "upcast" (torch's
cross_entropy over an fp32 copy) peaks at three fp32 logits tensors in its backward, "inplace" (Megatron's
vocab-parallel loss) at the 16-bit logits and one fp32 copy, "fused" (torchtitan's compiled loss) at the 16-bit
logits and their 16-bit gradient. What it changes (the last stage's logits bytes, the loss's time), each
runtime's own, the refusals, the plan file, the search, the torchtitan export and the published rows that set it.

Broken on purpose and seen to fail here: the fused loss held at the upcast's bytes (``logits_bytes_per_element``
ignoring "fused": the memory test), the upcast's backward peak left at its forward's e + 8 bytes (the memory
test), torchtitan's own ignoring its compiled blocks (``EngineProfile.cross_entropy`` returning its default:
the defaults test), the export's compile components left at ["model", "loss"] whatever the plan (the export
test), the vocabulary-parallel loss held at the plain loss's 12 bytes (``logits_bytes_per_element`` ignoring
tp: the traced test), torchtitan's head input counted as a sequence shard under SP
(``sp_gathered_head_input`` ignored in ``rank_memory``: the head-input test)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from exatrain.accounting.engines import get_engine
from exatrain.accounting.memory import logits_bytes_per_element, stage_memory
from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster, get_model
from exatrain.cli import main
from exatrain.engine_configs import export
from exatrain.errors import PlanError
from exatrain.plan import Plan
from exatrain.settings import CROSS_ENTROPY
from exatrain.planner.estimate import estimate_plan
from exatrain.planner.search.search import search
from exatrain.planner.search.space import SpaceOptions
from tests.helpers import benchmarks
from tests.helpers.plan_fields import check_round_trip, trainer_refuses

H200 = get_cluster("dgx-h200")
LLAMA = get_model("llama3-8b").replace(seq_len=4096)


def _plan(runtime="torchtitan", **kw):
    kw = {"zero": 3, "recompute": "selective", **kw}
    return make_plan(LLAMA, H200, gpus=8, micro_batch=2, global_batch=16, runtime=runtime, **kw)


def test_one_list_and_the_plan_file_round_trip(tmp_path) -> None:
    assert CROSS_ENTROPY == ("upcast", "inplace", "fused")
    path = check_round_trip(tmp_path, H200, "cross_entropy", "upcast")
    fused = _plan(cross_entropy="fused")
    fused.save(path)
    assert Plan.load(path).cross_entropy == "fused" and Plan.load(path).to_dict() == fused.to_dict()
    assert ", cross-entropy fused" in _plan(cross_entropy="fused").settings_label
    assert "cross_entropy" not in _plan().to_dict()  # older readers see nothing new


def test_the_fused_loss_holds_two_16_bit_logits_where_upcast_holds_three_fp32() -> None:
    """Last (only) stage: the activations differ by exactly tokens x vocab x (3 x 4 - 2e) bytes and the
    allocator allowance on them; weights, gradients and optimizer do not move; the fused loss is faster.
    Megatron's in-place loss holds e + 4 bytes a logit (4 in fp32, where the copy is the logits)."""
    up, fu = (estimate_plan(_plan(cross_entropy=c, elementwise="fused"), H200) for c in ("upcast", "fused"))
    logits = 2 * LLAMA.seq_len * LLAMA.vocab  # micro-batch 2, tp 1
    assert up.memory_bytes.activations - fu.memory_bytes.activations == pytest.approx(logits * (12 - 4), rel=1e-12)
    allowance = get_engine("torchtitan").allocator_allowance
    assert up.memory_bytes.total - fu.memory_bytes.total == pytest.approx(logits * 8 * (1 + allowance), rel=1e-9)
    assert [logits_bytes_per_element(c, "bfloat16") for c in CROSS_ENTROPY] == [12.0, 6.0, 4.0]
    assert [logits_bytes_per_element(c, "float32") for c in CROSS_ENTROPY] == [12.0, 4.0, 8.0]
    mc = _plan("megatron-core", zero=1)
    meg = get_engine("megatron-core")
    own, upcast = (stage_memory(p, 0, meg).activations for p in (mc, mc.replace(cross_entropy="upcast")))
    assert upcast - own == pytest.approx(logits * (12 - 6), rel=1e-12)
    notes = estimate_plan(mc, H200).notes
    assert any(n.startswith("cross-entropy: inplace, the logits held at 6 bytes") for n in notes)
    for f in ("weights", "gradients", "optimizer"):
        assert getattr(up.memory_bytes, f) == getattr(fu.memory_bytes, f)
    assert fu.time_s.compute < up.time_s.compute and fu.time_s.step < up.time_s.step
    assert any(n.startswith("cross-entropy: fused, the logits held at 4 bytes") for n in fu.notes)


def test_each_runtimes_own() -> None:
    """torchtitan compiles its loss with its model: fused when its element-wise ops are fused, upcast when eager;
    Megatron's engines run theirs in place, exatrain's trainer upcasts; a chosen value wins; the exatrain
    trainer's memory (a second model in torchtitan's estimate) keeps its own."""
    tt = get_engine("torchtitan")
    assert tt.cross_entropy() == "upcast" and tt.cross_entropy("", "fused") == "fused"
    assert tt.cross_entropy("upcast", "fused") == "upcast" and tt.cross_entropy("fused", "eager") == "fused"
    assert get_engine("exatrain").cross_entropy("", "fused") == "upcast"
    for name in ("megatron-core", "megatron-deepspeed"):
        assert get_engine(name).cross_entropy("", "fused") == get_engine(name).cross_entropy() == "inplace"
    own = estimate_plan(_plan(elementwise="fused"), H200)
    assert (
        own.memory_bytes.total
        == estimate_plan(_plan(elementwise="fused", cross_entropy="fused"), H200).memory_bytes.total
    )
    eager = estimate_plan(_plan(), H200)
    assert eager.memory_bytes.activations == estimate_plan(_plan(cross_entropy="upcast"), H200).memory_bytes.activations
    assert own.trainer_memory_bytes == eager.trainer_memory_bytes


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["--cross-entropy", "fused"],
            "which exatrain does not run: use --runtime torchtitan or llm-foundry, or drop it",
        ),
        (["--cross-entropy", "fused", "--runtime", "megatron-core"], "which megatron-core does not run"),
        (["--cross-entropy", "upcast", "--runtime", "megatron-deepspeed"], "torch's cross_entropy over an fp32 copy"),
        (
            ["--cross-entropy", "inplace", "--runtime", "torchtitan"],
            "--cross-entropy inplace is Megatron's vocab-parallel loss, which torchtitan does not run: use --runtime "
            "megatron-core or megatron-deepspeed",
        ),
        (["--cross-entropy", "chunked"], "invalid choice: 'chunked'"),
    ],
)
def test_bad_use_is_one_line_and_exit_2(argv, message, capsys) -> None:
    assert (
        main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h200", "--gpus", "8", "--global-batch", "8", *argv])
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_a_plan_file_with_a_bad_value_and_the_trainer_are_refused(tmp_path) -> None:
    with pytest.raises(PlanError, match=r"^--cross-entropy must be one of upcast, inplace, fused, got 'chunked'$"):
        _plan(cross_entropy="chunked")
    trainer_refuses(
        "the exatrain trainer runs its loss upcast to fp32", zero=3, runtime="torchtitan", cross_entropy="fused"
    )


def test_the_search_and_the_export_carry_it() -> None:
    res = search(
        LLAMA, H200, 8, 16, top=2, runtime="torchtitan", options=SpaceOptions(tp=(1,), pp=(1,), cross_entropy="fused")
    )
    assert res.ranked and all(p.cross_entropy == "fused" for p in res.ranked)
    for p in res.ranked:
        assert p.estimate.memory_bytes.total == pytest.approx(estimate_plan(p, H200).memory_bytes.total, rel=1e-12)

    # torchtitan's [compile] components: the model for compiled blocks, the loss for a fused loss
    def components(**kw):
        c = tomllib.loads(export(_plan(**kw), "torchtitan").text)["compile"]
        return c.get("components") if c["enable"] else None

    assert components(elementwise="fused") == ["model", "loss"]
    assert components(elementwise="fused", cross_entropy="upcast") == ["model"]
    assert components(cross_entropy="fused") == ["loss"]
    assert components() is None


def test_the_published_rows_before_torchtitan_compiled_its_loss_are_planned_upcast() -> None:
    pe = benchmarks.load("prediction_error")
    rows = pe.load_rows()
    dec = [r for r in rows if "llama3_h100_202412" in r.source]  # torchtitan's 2024-12 H100 table, in its order
    aug = [r for r in rows if "4d88a8a44/docs/performance.md" in r.source and "405B" in r.name]
    h200 = [r for r in rows if "h200_202506" in r.source]  # 2025-06, compiled: its own, the fused loss
    assert len(dec) >= 6 and aug and h200
    assert {r.cross_entropy for r in dec[1:3] + dec[4:6] + aug} == {"upcast"}
    assert dec[0].cross_entropy == dec[3].cross_entropy == ""  # eager: torchtitan's own is upcast already
    assert {r.cross_entropy for r in h200} == {""}
    assert all(r.plan.cross_entropy == r.cross_entropy for r in rows if r.plan is not None)
    assert pe._cross_entropy({"engine": "torchtitan", "compile": "y", "engine_version": "x (2025-03-31)"}) == "upcast"
    assert pe._cross_entropy({"engine": "torchtitan", "compile": "y", "engine_version": "x (2025-04)"}) == ""
    assert pe._cross_entropy({"engine": "megatron-core", "compile": "y", "engine_version": "(2024-01)"}) == ""


def test_the_vocabulary_parallel_loss_peaks_at_16_bytes_a_logit_as_torch_traces_it() -> None:
    """torch's cross-entropy over upcast logits, traced with MemTracker (tests/helpers/loss_peak_trace.py, in
    a process of its own: it starts a fake two-rank group): 12 bytes a logit on whole logits, 16 on a
    vocabulary shard under ``loss_parallel``, whose backward is eager ops (the saved log-softmax, zeros,
    their exponential and its sum), within the head's own few percent. The count follows tp, arrays too."""
    script = Path(__file__).resolve().parents[1] / "helpers" / "loss_peak_trace.py"
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    traced = json.loads(out.stdout.strip().splitlines()[-1])
    assert traced["plain"] == pytest.approx(logits_bytes_per_element("upcast", "bfloat16"), abs=0.5)
    assert traced["vocab_parallel"] == pytest.approx(logits_bytes_per_element("upcast", "bfloat16", 2), abs=0.5)
    assert logits_bytes_per_element("upcast", "float32", 8) == 16.0
    assert list(logits_bytes_per_element("upcast", "bfloat16", np.array([1, 2, 8]))) == [12.0, 16.0, 16.0]
    assert [logits_bytes_per_element(c, "bfloat16", 8) for c in ("inplace", "fused")] == [6.0, 4.0]


def test_torchtitan_keeps_the_heads_input_gathered_under_sequence_parallelism() -> None:
    """torchtitan's head (ColwiseParallel from the sequence-sharded stream) saves its all-gathered input:
    e x tokens x h x (1 - 1/tp) bytes more than a shard on the last stage; the Megatron engines keep the
    shard and gather again in backward; without SP nothing moves."""
    tt = get_engine("torchtitan")
    sharded = dataclasses.replace(tt, sp_gathered_head_input=False)
    assert not get_engine("megatron-core").sp_gathered_head_input and get_engine("exatrain").sp_gathered_head_input
    for sp, tp in ((True, 4), (False, 4), (True, 1)):
        plan = make_plan(
            LLAMA,
            H200,
            gpus=8,
            tp=tp,
            micro_batch=2,
            global_batch=16,
            runtime="torchtitan",
            zero=3,
            sequence_parallel=sp if tp > 1 else None,
        )
        gathered, shard = (stage_memory(plan, 0, eng).activations for eng in (tt, sharded))
        want = 2 * 2 * LLAMA.seq_len * LLAMA.hidden * (1 - 1 / tp) if sp and tp > 1 else 0.0
        assert gathered - shard == pytest.approx(want, rel=1e-12, abs=1e-6)
