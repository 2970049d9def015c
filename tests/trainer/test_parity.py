"""Loss parity: every parallel layout trains exactly like one process.

float32, CPU, gloo, seed 0, the same byte-level data: the per-step losses and global gradient
norms of 10 steps must equal the single-process run's within 1e-5 relative. The cases cover
tp2 with and without sequence parallelism, pp2 with each schedule and an uneven split, dp2 as DDP,
ZeRO-1 and FSDP2 (ZeRO-2/3), their 2-D and 3-D combinations, activation recomputation, the llama
architecture, and a tied embedding split over the pipeline (gpt-tiny's). Each group of cases runs in
one set of spawned ranks with a deadline, so a hang fails instead of blocking the suite.
"""

from __future__ import annotations

import pytest
from trainer_runs import STEPS, Run, max_rel_diff, run_batch

pytestmark = pytest.mark.slow
RTOL = 1e-5
# bf16 autocast against float32 on the same layout: per-step losses (measured here: <= 6e-4 over
# 10 steps of gpt-tiny, single process and FSDP). The bound is 5e-3, and a bf16 run must differ.
BF16_RTOL = 5e-3

REFERENCE = {
    "gpt": dict(),
    "llama": dict(model="llama-tiny"),
    "gpt-bf16": dict(dtype="bfloat16"),
    "pp1-interleave2": dict(schedule="interleaved", interleave=2),  # no pipeline: nothing to interleave
}
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
    "dp2-recompute-full": dict(dp=2, recompute="full"),
    "tp2-sp-recompute-selective": dict(tp=2, sequence_parallel=True, recompute="selective"),
    "llama-tp2-sp": dict(model="llama-tiny", tp=2, sequence_parallel=True),
    "llama-pp2-interleaved": dict(model="llama-tiny", pp=2, schedule="interleaved", interleave=2),
    "dp2-fsdp-zero3-bf16": dict(dp=2, zero_stage=3, dtype="bfloat16"),
}
FOUR_RANKS = {
    "tp2-pp2": dict(tp=2, pp=2),
    "pp2-dp2": dict(pp=2, dp=2),
    "tp2-dp2-ddp": dict(tp=2, dp=2),  # DDP over the local shards of DTensor parameters
    "tp2-dp2-zero1-recompute-full": dict(tp=2, dp=2, zero_stage=1, recompute="full"),
    "tp2-sp-dp2-fsdp-zero3": dict(tp=2, dp=2, zero_stage=3, sequence_parallel=True),
    "pp2-dp2-zero2-interleaved-selective": dict(pp=2, dp=2, zero_stage=2, schedule="interleaved",
                                                interleave=2, recompute="selective"),
    "llama-pp2-dp2-zero_bubble": dict(model="llama-tiny", pp=2, dp=2, schedule="zero_bubble", interleave=2),
}
EIGHT_RANKS = {
    "tp2-pp2-dp2-zero1": dict(tp=2, pp=2, dp=2, zero_stage=1),
    "tp2-sp-pp2-dp2-fsdp-zero3-interleaved-full": dict(tp=2, pp=2, dp=2, zero_stage=3, sequence_parallel=True,
                                                       schedule="interleaved", interleave=2, recompute="full"),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    return run_batch(tmp_path_factory.mktemp("ref"), REFERENCE, timeout_s=240)


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    return run_batch(tmp_path_factory.mktemp("two"), TWO_RANKS, timeout_s=420)


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    return run_batch(tmp_path_factory.mktemp("four"), FOUR_RANKS, timeout_s=420)


@pytest.fixture(scope="module")
def eight(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    return run_batch(tmp_path_factory.mktemp("eight"), EIGHT_RANKS, timeout_s=420)


def reference_for(case: str, reference: dict[str, Run]) -> Run:
    name = "llama" if case.startswith("llama") else "gpt"
    return reference[name + ("-bf16" if case.endswith("bf16") else "")]


def assert_parity(case: str, run: Run, reference: dict[str, Run]) -> None:
    ref = reference_for(case, reference)
    assert len(run.losses) == STEPS
    tol = BF16_RTOL if case.endswith("bf16") else RTOL
    assert max_rel_diff(run.losses, ref.losses) <= tol, (run.losses, ref.losses)
    assert max_rel_diff(run.grad_norms, ref.grad_norms) <= tol, (run.grad_norms, ref.grad_norms)


def test_reference_learns(reference: dict[str, Run]) -> None:
    for name in ("gpt", "llama"):
        losses = reference[name].losses
        assert len(losses) == STEPS and losses[-1] < losses[0] - 0.5, losses


def test_bf16_tracks_float32_within_the_stated_tolerance(reference: dict[str, Run]) -> None:
    bf16, fp32 = reference["gpt-bf16"], reference["gpt"]
    assert max_rel_diff(bf16.losses, fp32.losses) <= BF16_RTOL
    assert bf16.losses != fp32.losses  # it really ran in bfloat16


def test_a_plan_without_pipeline_runs_the_whole_model(reference: dict[str, Run]) -> None:
    assert_parity("pp1-interleave2", reference["pp1-interleave2"], reference)


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
    assert m["steps"] == STEPS and m["first_loss"] == run.losses[0] and m["last_loss"] == run.losses[-1]
    assert len(m["peak_memory_by_stage"]) == 2 and m["peak_memory_bytes"] == max(m["peak_memory_by_stage"])
    for s in run.steps:
        assert s["mfu"] is None  # no catalog peak for a CPU
        assert s["model_tflops_per_gpu"] > 0 and s["tokens_per_s"] > 0 and s["step_time_s"] > 0
        assert len(s["peak_memory_bytes"]) == 2 and min(s["peak_memory_bytes"]) > 0
    assert [s["step"] for s in run.steps] == list(range(1, STEPS + 1))
