"""Context parallelism (parallel/context.py) trains exactly like one process, parameter by parameter.

float32, CPU, gloo, seed 0, STEPS steps, the checks of test_parity.py: per-step losses and gradient
norms within RTOL, every parameter's step-1 gradient gathered whole within GRAD_RTOL
(trainer_runs.grad_error), the weights after the last step within UPDATE_RTOL / WEIGHT_ATOL
(trainer_runs.weight_errors). The trainer tests' shared launch of each rank count (conftest.py): cp2 alone (gpt-tiny:
learned positions; and llama-tiny: rotary angles, grouped-query heads, dropout 0.1 keyed by sample, selective
recomputation), then four ranks: tp2 x cp2, llama's tp2 + sequence parallelism x cp2 with dropout, cp2 x pp2 (1f1b)
and cp2 x dp2 under FSDP (ZeRO-3), whose gradients are reduced and sharded over dp x cp.

Measured on this machine (torch 2.13 CPU, 2026-12-01, ``pytest -s -m slow tests/trainer/
test_context_parallel.py`` prints each case), worst case of each: losses and gradient norms 8.1e-8,
gradients 3.3e-7, update 4.7e-6, single weights 2.8e-6; the bounds are those of test_parity.py.

Mutations tried: each bug below was put into a copy of the source, this file's named tests run
against it and seen to fail (the checks named are those that failed), and the copy thrown away.

1. Wrong chunk order (rank r holding chunks r and r + cp instead of 2cp-1-r, ``chunk_positions``):
   test_the_chunks_of_a_rank (the runs were not tried with it: the mask and the positions follow the
   same function, so the load-balanced layout itself is what this unit test pins).
2. Causal mask by local index instead of global position (``ContextShard.causal_mask``):
   test_two_ranks, both cases, on losses, gradient norms, step-1 gradients, update and weights.
3. Positions not shifted to the rank's chunks (the learned table and the rotary angles read 0 ..
   s/cp-1): test_two_ranks[cp2] on every check; [llama-dropout-cp2-recompute-selective] on gradient
   norms, step-1 gradients, update and weights.
4. Gradients not reduced over cp (``Mesh.grad_mesh`` the dp mesh alone, the dp x cp count back to
   dp): test_two_ranks, both cases, on every check.
5. The K/V gather's backward without the sum over the cp ranks (each rank keeps its own slice of its
   own gradient): test_two_ranks, both cases, on every check.
6. Residual dropout masks at the rank's local rows instead of its global positions (``Block._drop``):
   test_two_ranks[llama-dropout-cp2-recompute-selective], on every check ([cp2] has no dropout).
7. The K/V gather through ``torch.distributed.nn.functional.all_gather`` instead of GatherSequence
   (its gloo backward sends non-contiguous gradient slices through all_to_all):
   test_two_ranks[llama-dropout-cp2-recompute-selective], on every check; [cp2] passed with it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.trainer_runs import Run, assert_checks, parity_checks

from exatrain.catalog import get_model
from exatrain.errors import PlanError
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.trainer.config import TrainConfig
from exatrain.trainer.parallel.context import chunk_positions
from exatrain.trainer.parallel.mesh import coordinates, cp_coordinate, global_rank

pytestmark = pytest.mark.slow
STEPS = 4

LLAMA_DROPOUT = dict(model="llama-tiny", dropout=0.1)
REFERENCE = {"gpt": dict(), "llama-dropout": LLAMA_DROPOUT}
TWO_RANKS = {
    "cp2": dict(cp=2),
    "llama-dropout-cp2-recompute-selective": dict(cp=2, recompute="selective", **LLAMA_DROPOUT),
}
FOUR_RANKS = {
    "tp2-cp2": dict(tp=2, cp=2),
    "llama-dropout-tp2-sp-cp2": dict(tp=2, cp=2, sequence_parallel=True, **LLAMA_DROPOUT),
    "cp2-pp2-1f1b": dict(cp=2, pp=2, schedule="1f1b"),
    "cp2-dp2-fsdp-zero3": dict(cp=2, dp=2, zero_stage=3),
}


def _steps(cases: dict[str, dict]) -> dict[str, dict]:
    return {name: dict(kw, steps=STEPS) for name, kw in cases.items()}


def launch_cases(out: Path) -> dict[int, dict[str, dict]]:
    """This module's cases by world size, for the trainer tests' shared launches (conftest.py)."""
    return {1: _steps(REFERENCE), 2: _steps(TWO_RANKS), 4: _steps(FOUR_RANKS)}


@pytest.fixture(scope="module")
def reference(world1: dict) -> dict[str, Run]:
    return world1["cp"]


@pytest.fixture(scope="module")
def two(world2: dict) -> dict[str, Run]:
    return world2["cp"]


@pytest.fixture(scope="module")
def four(world4: dict) -> dict[str, Run]:
    return world4["cp"]


def assert_parity(case: str, run: Run, reference: dict[str, Run]) -> None:
    ref = reference["llama-dropout" if case.startswith("llama-dropout") else "gpt"]
    assert len(run.losses) == STEPS
    checks = parity_checks(run, ref)
    print(f"{case}: {', '.join(checks)}")  # each check with its measured error, shown with pytest -s
    assert_checks(checks)


@pytest.mark.parametrize("case", list(TWO_RANKS))
def test_two_ranks(case: str, two: dict[str, Run], reference: dict[str, Run]) -> None:
    assert_parity(case, two[case], reference)


@pytest.mark.parametrize("case", list(FOUR_RANKS))
def test_four_ranks(case: str, four: dict[str, Run], reference: dict[str, Run]) -> None:
    assert_parity(case, four[case], reference)


def test_the_run_record_names_the_cp_plan(four: dict[str, Run]) -> None:
    rec = four["tp2-cp2"].record
    assert rec is not None and rec["status"] == "ok" and rec["plan"]["cp"] == 2
    assert rec["env"]["world_size"] == 4


def test_the_chunks_of_a_rank() -> None:
    """2*cp chunks; rank r holds chunks r and 2cp-1-r: together every position once."""
    assert chunk_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert chunk_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert chunk_positions(12, 3, 1).tolist() == [2, 3, 8, 9]
    every = torch.cat([chunk_positions(64, 4, r) for r in range(4)])
    assert sorted(every.tolist()) == list(range(64))


def test_the_rank_order_is_tp_cp_dp_pp() -> None:
    spec = get_model("gpt-tiny")
    plan = Plan(model=spec, dims=ParallelDims(tp=2, cp=2, dp=2, pp=2), shape=TrainShape(2, 8)).validate()
    seen = set()
    for rank in range(plan.gpus):
        pp, dp, tp = coordinates(rank, plan)
        cp = cp_coordinate(rank, plan)
        assert global_rank(plan, pp, dp, tp, cp) == rank
        seen.add((pp, dp, cp, tp))
    assert len(seen) == 16
    assert [cp_coordinate(r, plan) for r in range(4)] == [0, 0, 1, 1]  # tp fastest, then cp
    assert coordinates(4, plan) == (0, 1, 0) and coordinates(8, plan) == (1, 0, 0)


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(model="moe-tiny"), "mixture-of-experts"),
        (dict(compile=True), "--compile"),
        (dict(pp=2, schedule="zero_bubble", interleave=2), "zero_bubble"),
    ],
)
def test_what_cp_does_not_run_is_refused_in_one_line(kw: dict, words: str) -> None:
    kw = dict(kw)
    spec = get_model(kw.pop("model", "gpt-tiny"))
    compile = kw.pop("compile", False)
    plan = Plan(model=spec, dims=ParallelDims(cp=2, pp=kw.pop("pp", 1)), shape=TrainShape(2, 8), **kw).validate()
    with pytest.raises(PlanError, match=words) as err:
        TrainConfig(plan=plan, compile=compile).check()
    assert "\n" not in str(err.value)


def test_a_plain_cp_plan_is_accepted() -> None:
    spec = get_model("llama-tiny")
    plan = Plan(model=spec, dims=ParallelDims(cp=2, tp=2), shape=TrainShape(2, 8), dtype="float32").validate()
    assert TrainConfig(plan=plan).check().plan.cp == 2


def test_the_train_command_takes_cp_and_ep(no_launch: list[TrainConfig], tmp_path) -> None:
    from exatrain.cli import main

    assert main(["train", "--model", "llama-tiny", "--tp", "2", "--cp", "2", "--steps", "3", "--quiet"]) == 0
    assert main(["train", "--model", "gpt-tiny", "--gpus", "8", "--cp", "2", "--quiet"]) == 0
    assert main(["train", "--model", "moe-tiny", "--dp", "2", "--ep", "2", "--quiet"]) == 0
    a, b, c = (cfg.plan for cfg in no_launch)
    assert (a.tp, a.cp, a.dp, a.gpus) == (2, 2, 1, 4)
    assert (b.cp, b.dp, b.gpus) == (2, 4, 8)
    assert (c.ep, c.dp, c.cp, c.gpus) == (2, 2, 1, 2)
    path = tmp_path / "plan.json"
    a.save(path)
    no_launch.clear()
    assert main(["train", "--plan", str(path), "--quiet"]) == 0  # the plan's cp is kept
    assert main(["train", "--plan", str(path), "--cp", "1", "--quiet"]) == 0  # and a flag overrides it
    assert [cfg.plan.cp for cfg in no_launch] == [2, 1]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--model", "moe-tiny", "--cp", "2"], "mixture-of-experts"),
        (["--model", "gpt-tiny", "--cp", "3"], "divisible by 2*cp"),
        (["--model", "gpt-tiny", "--gpus", "3", "--cp", "2"], "is not divisible by tp*cp*pp"),
    ],
)
def test_the_train_command_refuses_a_bad_cp_in_one_line(
    argv: list[str], words: str, no_launch: list, capsys: pytest.CaptureFixture
) -> None:
    from exatrain.cli import main

    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err  # (a warning line may say the planner does not price cp yet)
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and words in errors[0] and "Traceback" not in err, err
    assert not no_launch
