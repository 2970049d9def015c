"""Parity: every parallel layout trains exactly like one process, parameter by parameter.

float32, CPU, gloo, seed 0, the same byte-level data, LAYOUT_STEPS (5) steps. Each case is compared with
the single-process run of its model for as many steps (which test_reference.py checks against Hugging Face
transformers; the 10-step references the other trainer tests share are the same runs, longer):

* the per-step losses and global gradient norms, within RTOL;
* every parameter's gradient of step 1, gathered whole from the ranks under its single-device name
  (trainer/debug.py), within GRAD_RTOL of that parameter's largest entry (trainer_runs.grad_error):
  a gradient scaled by a constant, or one shard's wrong, fails here even when clipping and AdamW's
  scale invariance hide it from the losses;
* the weights after the last step: the whole update within UPDATE_RTOL (relative L2), every single
  weight within WEIGHT_ATOL (trainer_runs.weight_errors);
* the dtypes the first attention projection saw in the first forward (float32 here).

Measured on this machine (torch 2.13 CPU, ``pytest tests/trainer/test_parity.py``), worst case of
each over the LAYOUT_STEPS-step runs: losses and norms 1.3e-7, gradients 3.8e-7, update 7.0e-6, single
weights 5.1e-6; the bounds are at least 14x above (over 10 steps the update was 5.2e-6, single
weights 5.8e-6).

The cases cover tp2 with and without sequence parallelism, pp2 with each schedule and an uneven split,
dp2 as DDP, ZeRO-1 and FSDP2 (ZeRO-2/3), their 2-D and 3-D combinations, activation recomputation, the
llama architecture, a tied embedding split over the pipeline (gpt-tiny's), and dropout 0.1 (masks
keyed by sample, model.py: the same on every layout) under FSDP with full recomputation, llama's
tp2 + SP with selective recomputation, and tp2 + SP x pp2 interleaved. The cases of each world size run
in one set of spawned ranks, shared with the other trainer tests (conftest.py), with a stall limit, so a
hang fails instead of blocking the suite; the per-parameter
dumps ride on those runs, and recomputation is covered inside combined cases (dp x full under ZeRO-1,
FSDP and dropout; selective under pp x dp and under tp2 + SP), which keeps the suite's time near what
loss-only parity took.

bf16 (autocast; weights, gradients and AdamW states float32): the bf16 reference's step-1 gradients
are 2.1e-2 (grad_error) from the float32 reference's. dp2 with DDP runs the reference's own
micro-batches and averages in float32, so it gets the float32 bounds (measured: gradients and weights
equal bit for bit, losses within 8.7e-8), which a float32 run misses by far. FSDP's mixed precision is another recipe
(bf16 weights gathered, norms and embeddings included; micro-batch gradients accumulated in bf16): its losses are 4.1e-4
from the bf16 reference, farther than float32's 4.9e-5, so no loss bound tells it from float32; it must
show bf16 weights and bf16 outputs in its forward and gradients at least FP32_FLOOR from float32's.

A plan with pp 1 and an interleaved schedule is executed as the plain one-stage plan; that is checked
on the plan (test_a_plan_without_pipeline_runs_the_whole_model), not by a run that would compare the
reference with itself.

Mutations tried: each bug below was put into the source by hand, the named tests run and seen to
fail (the checks named are those that failed), and the edit reverted.

1. ``grads.average_over_dp`` without its division by dp (pp x dp under ZeRO-0/1):
   test_four_ranks[pp2-dp2] and [llama-pp2-dp2-zero_bubble], on the gradient norms and the step-1
   gradients; losses and weights still agreed (every step is clipped, and AdamW ignores the scale).
2. bf16 FSDP secretly in float32 (autocast and FSDP's bf16 gather off for FSDP runs only):
   test_two_ranks[dp2-fsdp-zero3-bf16], on its dtypes and its gradients (1.2e-7 from float32's); its
   losses stayed within BF16_RTOL, the only bound it had before.
3. FSDP's bf16 gather dropped (``MixedPrecisionPolicy()`` always, autocast still on):
   test_two_ranks[dp2-fsdp-zero3-bf16], on its dtypes (weight float32).
4. bf16 off everywhere (autocast and FSDP): test_bf16_is_outside_the_float32_tolerance_and_inside_its_own,
   test_two_ranks[dp2-ddp-bf16] and [dp2-fsdp-zero3-bf16] (dtypes).
5. A checkpoint read ignoring the offset inside a stored chunk (``storage._read_slice`` slicing from 0):
   tests/checkpoint/test_reshard.py, test_the_load_reads_every_parameter_exactly and
   test_training_continues_as_the_straight_run for tp2-from-pp2, fsdp-from-tp2, tp2-pp2-from-pp2 and
   tp2-dp2-fsdp-from-pp2 (pp2-from-tp2 reads whole chunks only, and passed).
6. pp 1 with an interleaved schedule run as named (``execution_plan`` returning the plan):
   test_a_plan_without_pipeline_runs_the_whole_model.
7. Dropout from the global generator (the trainer passing no keys): test_two_ranks[dropout-dp2-fsdp-zero3-
   recompute-full] and [llama-dropout-tp2-sp-recompute-selective], test_four_ranks[dropout-tp2-sp-pp2-
   interleaved], on every check.
8. Attention dropout masks without the rank's head offset: test_two_ranks[llama-dropout-tp2-sp-recompute-
   selective]; test_dropout.py::test_a_rank_of_heads_gets_those_heads_masks.
9. Residual dropout masks without the rank's sequence offset: test_dropout.py::
   test_a_sequence_slice_of_a_residual_mask_is_the_slice_of_the_whole; test_reshard.py::
   test_the_straight_runs_drop_the_same_entries.
10. Dropout keyed by the run's own step count instead of the global sample (a resume restarts the masks):
    test_reshard.py::test_training_continues_as_the_straight_run, all six resumed cases (the same
    layout no longer bit-identical).
11. Weight decay on norms and biases too: test_reference.py, all four models (no test here can see it:
    every layout shares it).
"""

from __future__ import annotations

import pytest
import torch
from tests.helpers.trainer_runs import (
    RTOL,
    STEPS,
    Run,
    assert_checks,
    grad_error,
    max_rel_diff,
    parity_checks,
)

from exatrain.catalog import get_model
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.trainer.model import Transformer
from exatrain.trainer.parallel.build import execution_plan
from exatrain.trainer.parallel.pipeline import split_stages

pytestmark = pytest.mark.slow
# The float32 bounds (losses and gradient norms per step, step-1 gradients, update, single weights) are
# trainer_runs.RTOL, GRAD_RTOL, UPDATE_RTOL and WEIGHT_ATOL, shared with the other parity tests.
# bf16 autocast on the same recipe (DDP: each rank runs the reference's micro-batches, averaging in
# float32): as tight as float32 parity, while float32 against bf16 is far outside.
# bf16 FSDP gathers bf16 weights (its norms and embeddings too) and accumulates micro-batch gradients
# in bf16: another recipe, whose distance to the bf16 reference is that of float32 to it. It gets the
# loose bound and must show its dtypes and be far from the float32 reference.
BF16_RTOL = 5e-3
FP32_FLOOR = 1e-3  # grad_error of a bf16 run against the float32 reference is at least this

REFERENCE = {  # STEPS (10) steps: test_reference_learns, and the compile and FP8 tests' references
    "gpt": dict(),
    "llama": dict(model="llama-tiny"),
    "gpt-bf16": dict(dtype="bfloat16"),
    "gpt-dropout": dict(dropout=0.1),
    "llama-dropout": dict(model="llama-tiny", dropout=0.1),
}
# The layouts' length: each multi-rank step costs far more than a single-process one (tensor parallelism
# on CPU most), so the layouts run half the references' steps, against references of that length.
LAYOUT_STEPS = 5
SHORT = f"-{LAYOUT_STEPS}steps"  # the suffix of those references' names
TWO_RANKS = {
    "tp2": dict(tp=2),
    "tp2-sp": dict(tp=2, sequence_parallel=True),
    "pp2-gpipe": dict(pp=2, schedule="gpipe"),
    "pp2-1f1b": dict(pp=2, schedule="1f1b"),
    "pp2-interleaved": dict(pp=2, schedule="interleaved", interleave=2),
    "pp2-zero_bubble": dict(pp=2, schedule="zero_bubble", interleave=2),
    "pp2-uneven-1-3": dict(pp=2, stage_layers=(1, 3)),
    "dp2-ddp": dict(dp=2, zero_stage=0),
    "dp2-zero1": dict(dp=2, zero_stage=1),
    "dp2-fsdp-zero2": dict(dp=2, zero_stage=2),
    "dp2-fsdp-zero3": dict(dp=2, zero_stage=3),
    "llama-tp2-sp": dict(model="llama-tiny", tp=2, sequence_parallel=True),
    "llama-pp2-interleaved": dict(model="llama-tiny", pp=2, schedule="interleaved", interleave=2),
    "dp2-ddp-bf16": dict(dp=2, zero_stage=0, dtype="bfloat16"),
    "dp2-fsdp-zero3-bf16": dict(dp=2, zero_stage=3, dtype="bfloat16"),
    "dropout-dp2-fsdp-zero3-recompute-full": dict(dp=2, zero_stage=3, recompute="full", dropout=0.1),
    "llama-dropout-tp2-sp-recompute-selective": dict(
        model="llama-tiny", tp=2, sequence_parallel=True, recompute="selective", dropout=0.1
    ),
}
FOUR_RANKS = {
    "tp2-pp2": dict(tp=2, pp=2),
    "pp2-dp2": dict(pp=2, dp=2),
    "tp2-dp2-ddp": dict(tp=2, dp=2),  # DDP over the local shards of DTensor parameters
    "tp2-dp2-zero1-recompute-full": dict(tp=2, dp=2, zero_stage=1, recompute="full"),
    "tp2-sp-dp2-fsdp-zero3": dict(tp=2, dp=2, zero_stage=3, sequence_parallel=True),
    "pp2-dp2-zero2-interleaved-selective": dict(
        pp=2, dp=2, zero_stage=2, schedule="interleaved", interleave=2, recompute="selective"
    ),
    "llama-pp2-dp2-zero_bubble": dict(model="llama-tiny", pp=2, dp=2, schedule="zero_bubble", interleave=2),
    "dropout-tp2-sp-pp2-interleaved": dict(
        tp=2, pp=2, sequence_parallel=True, schedule="interleaved", interleave=2, dropout=0.1
    ),
}
EIGHT_RANKS = {
    "tp2-pp2-dp2-zero1": dict(tp=2, pp=2, dp=2, zero_stage=1),
    "tp2-sp-pp2-dp2-fsdp-zero3-interleaved-full": dict(
        tp=2, pp=2, dp=2, zero_stage=3, sequence_parallel=True, schedule="interleaved", interleave=2, recompute="full"
    ),
}


def _steps(cases: dict[str, dict], suffix: str = "") -> dict[str, dict]:
    return {name + suffix: dict(kw, steps=LAYOUT_STEPS) for name, kw in cases.items()}


def launch_cases(out) -> dict[int, dict[str, dict]]:
    """This module's cases by world size, for the shared launches (tests/trainer/conftest.py)."""
    return {
        1: {**REFERENCE, **_steps(REFERENCE, SHORT)},
        2: _steps(TWO_RANKS),
        4: _steps(FOUR_RANKS),
        8: _steps(EIGHT_RANKS),
    }


@pytest.fixture(scope="module")
def reference(world1: dict) -> dict[str, Run]:
    return world1["parity"]


@pytest.fixture(scope="module")
def two(world2: dict) -> dict[str, Run]:
    return world2["parity"]


@pytest.fixture(scope="module")
def four(world4: dict) -> dict[str, Run]:
    return world4["parity"]


@pytest.fixture(scope="module")
def eight(world8: dict) -> dict[str, Run]:
    return world8["parity"]


def reference_name(case: str) -> str:
    """The LAYOUT_STEPS-step reference of a layout case."""
    name = "llama" if case.startswith("llama") else "gpt"
    if "dropout" in case:
        return name + "-dropout" + SHORT
    return name + ("-bf16" if case.endswith("bf16") else "") + SHORT


def assert_parity(case: str, run: Run, reference: dict[str, Run]) -> None:
    """Every check of the module docstring; a failure names each one that failed."""
    ref = reference[reference_name(case)]
    assert len(run.losses) == len(ref.losses) == LAYOUT_STEPS
    if case == "dp2-fsdp-zero3-bf16":
        assert_bf16_fsdp(run, ref, reference["gpt" + SHORT])
        return
    dtype = "bfloat16" if case.endswith("bf16") else "float32"
    checks = parity_checks(run, ref)
    # autocast computes in bf16 from float32 weights
    checks[f"dtypes {run.dtypes()}"] = run.dtypes() == dict(input=dtype, weight="float32", output=dtype)
    assert_checks(checks)


def assert_bf16_fsdp(run: Run, ref: Run, fp32: Run) -> None:
    """FSDP's mixed precision: bf16 weights in the forward, bf16 compute; within the bf16 bound of
    the bf16 reference and far from the float32 one."""
    g_err, _ = grad_error(run.grads(), fp32.grads())
    checks = {
        f"dtypes {run.dtypes()}": run.dtypes() == dict(input="bfloat16", weight="bfloat16", output="bfloat16"),
        "losses": max_rel_diff(run.losses, ref.losses) <= BF16_RTOL,
        f"step-1 gradients from float32's ({g_err:.2e})": g_err >= FP32_FLOOR,
    }
    assert_checks(checks)


def test_reference_learns(reference: dict[str, Run]) -> None:
    for name in ("gpt", "llama", "gpt-dropout", "llama-dropout"):
        losses = reference[name].losses
        assert len(losses) == STEPS and losses[-1] < losses[0] - 0.5, losses


def test_the_short_references_are_the_first_steps_of_the_references(reference: dict[str, Run]) -> None:
    """Inside the 10 warm-up steps the learning rate does not depend on the run's length: each
    LAYOUT_STEPS-step reference is its 10-step reference's first steps, bit for bit."""
    for name in REFERENCE:
        short, whole = reference[name + SHORT], reference[name]
        assert short.losses == whole.losses[:LAYOUT_STEPS] and short.grad_norms == whole.grad_norms[:LAYOUT_STEPS]
        assert all(torch.equal(g, whole.grads()[n]) for n, g in short.grads().items()), name


def test_bf16_is_outside_the_float32_tolerance_and_inside_its_own(reference: dict[str, Run]) -> None:
    """The bf16 reference tracks float32 within BF16_RTOL, but its gradients differ from float32's
    by far more than GRAD_RTOL: a run secretly in float32 fails the bf16 cases' tight bounds."""
    bf16, fp32 = reference["gpt-bf16"], reference["gpt"]
    assert max_rel_diff(bf16.losses, fp32.losses) <= BF16_RTOL
    assert max_rel_diff(bf16.losses, fp32.losses) > RTOL
    assert grad_error(fp32.grads(), bf16.grads())[0] >= FP32_FLOOR
    assert bf16.dtypes() == dict(input="bfloat16", weight="float32", output="bfloat16")
    assert fp32.dtypes() == dict(input="float32", weight="float32", output="float32")


def test_dropout_changes_what_is_trained(reference: dict[str, Run]) -> None:
    """With dropout the first step's gradients are another model's: the dropout cases test masks."""
    for name in ("gpt", "llama"):
        assert grad_error(reference[f"{name}-dropout"].grads(), reference[name].grads())[0] > 1e-2


def test_a_plan_without_pipeline_runs_the_whole_model() -> None:
    """pp 1 with an interleaved schedule (or a stage split) has no virtual stages to interleave: it is
    executed as the plain one-stage plan, the whole model on each rank (no run needed to see that;
    the one-stage plan is the reference every case above is compared with)."""
    spec = get_model("gpt-tiny")
    named = Plan(
        model=spec, dims=ParallelDims(), shape=TrainShape(2, 8), schedule="interleaved", interleave=2, dtype="float32"
    ).validate()
    plain = named.replace(schedule="1f1b", interleave=1)
    assert execution_plan(named) == plain and execution_plan(plain) is plain
    assert execution_plan(named.replace(schedule="1f1b", interleave=1, stage_layers=(4,)).validate()) == plain
    with torch.device("meta"):
        whole = Transformer(spec)
    ((index, stage),) = split_stages(whole, execution_plan(named), 0)
    assert index == 0 and stage is whole and list(stage.layers) == ["0", "1", "2", "3"]


@pytest.mark.parametrize("case", list(TWO_RANKS))
def test_two_ranks(case: str, two: dict[str, Run], reference: dict[str, Run]) -> None:
    assert_parity(case, two[case], reference)


@pytest.mark.parametrize("case", list(FOUR_RANKS))
def test_four_ranks(case: str, four: dict[str, Run], reference: dict[str, Run]) -> None:
    assert_parity(case, four[case], reference)


@pytest.mark.parametrize("case", list(EIGHT_RANKS))
def test_eight_ranks(case: str, eight: dict[str, Run], reference: dict[str, Run]) -> None:
    assert_parity(case, eight[case], reference)


def test_run_record_closes_each_metrics_file(two: dict[str, Run]) -> None:
    run = two["pp2-1f1b"]
    rec = run.record
    assert rec is not None and rec["kind"] == "run_record" and rec["status"] == "ok"
    assert rec["plan"]["pp"] == 2 and rec["device"] == "cpu" and rec["env"]["world_size"] == 2
    m = rec["measured"]
    assert m["steps"] == LAYOUT_STEPS and m["first_loss"] == run.losses[0] and m["last_loss"] == run.losses[-1]
    assert len(m["peak_memory_by_stage"]) == 2 and m["peak_memory_bytes"] == max(m["peak_memory_by_stage"])
    for s in run.steps:
        assert s["mfu"] is None  # no catalog peak for a CPU
        assert s["model_tflops_per_gpu"] > 0 and s["tokens_per_s"] > 0 and s["step_time_s"] > 0
        assert len(s["peak_memory_bytes"]) == 2 and min(s["peak_memory_bytes"]) > 0
    assert [s["step"] for s in run.steps] == list(range(1, LAYOUT_STEPS + 1))
