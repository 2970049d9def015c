"""Resharding on resume, parameter by parameter, with dropout on.

Two runs of gpt-tiny with dropout 0.1 train 6 steps and save after step 3: pp2 (each stage writes its
parameters whole, one chunk per tensor) and tp2 with sequence parallelism (every sharded tensor in two
chunks: rows of the column-parallel and vocab-parallel matrices, columns of the row-parallel ones).
From each step-3 checkpoint other layouts resume, so that a rank reads parts of stored chunks, at an
offset inside them:

* tp2 (and tp2 x pp2) from pp2: each tensor-parallel rank reads its half of a whole stored tensor;
* FSDP (dp2, ZeRO-3) from tp2: each rank reads the first or second half of the rows of every chunk
  the row-parallel layers stored as column halves;
* tp2 x dp2 FSDP (2-D) from pp2: quarter pieces of whole stored tensors;
* pp2 from tp2: a stage assembles each of its tensors from two chunks.

Each resumed run's weights right after the load are compared with the checkpoint's tensors, read
whole in one process (``storage.read_full``): bit for bit. It then trains steps 4-6: the same layout
gives bit-identical losses and weights (the dropout masks are keyed by sample, model.py, and follow
the checkpoint's sample count); other layouts stay within the parity bounds (tests/trainer/
test_parity.py) of the straight run, per step and per parameter.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.helpers.ckpt_runs import Run, max_rel_diff, samples_by_step
from tests.helpers.trainer_runs import RTOL, UPDATE_RTOL, WEIGHT_ATOL, weight_errors  # the parity tests' bounds

from exatrain.trainer.checkpoint.storage import read_full

pytestmark = pytest.mark.slow
DROPOUT = 0.1
SAVED = {"pp2": dict(pp=2), "tp2": dict(tp=2, sequence_parallel=True)}
RESUMED_ON_TWO = {  # case: (layout, the run whose checkpoint it starts from)
    "pp2-from-pp2": (dict(pp=2), "pp2"),
    "tp2-from-pp2": (dict(tp=2, sequence_parallel=True), "pp2"),
    "fsdp-from-tp2": (dict(dp=2, zero_stage=3), "tp2"),
    "pp2-from-tp2": (dict(pp=2), "tp2"),
}
RESUMED_ON_FOUR = {
    "tp2-pp2-from-pp2": (dict(tp=2, pp=2), "pp2"),
    "tp2-dp2-fsdp-from-pp2": (dict(tp=2, dp=2, zero_stage=3), "pp2"),
}


def checkpoint(out: Path, saved: str) -> Path:
    return out / f"ckpt-{saved}" / "step-00000003"


def cases_on_two(out: Path) -> dict[str, dict]:
    """The saves, then their resumes on two ranks: one launch (conftest.py)."""
    cases = {
        name: dict(kw, dropout=DROPOUT, steps=6, checkpoint_dir=str(out / f"ckpt-{name}"), save_every=3)
        for name, kw in SAVED.items()
    }
    cases.update(
        {
            name: dict(kw, dropout=DROPOUT, steps=6, resume_from=str(checkpoint(out, saved)))
            for name, (kw, saved) in RESUMED_ON_TWO.items()
        }
    )
    return cases


def cases_on_four(out: Path) -> dict[str, dict]:
    """The resumes on four ranks, in the launch shared with the resume tests (conftest.py)."""
    return {
        name: dict(kw, dropout=DROPOUT, steps=6, resume_from=str(checkpoint(out, saved)))
        for name, (kw, saved) in RESUMED_ON_FOUR.items()
    }


@pytest.fixture(scope="module")
def runs(ckpt_out: Path, launch_two: dict, launch_four: dict) -> tuple[Path, dict[str, Run]]:
    return ckpt_out / "reshard", {**launch_two["reshard"], **launch_four["reshard"]}


CASES = {**RESUMED_ON_TWO, **RESUMED_ON_FOUR}


@pytest.mark.parametrize("case", list(CASES))
def test_the_load_reads_every_parameter_exactly(case: str, runs: tuple[Path, dict[str, Run]]) -> None:
    out, found = runs
    saved = read_full(checkpoint(out, CASES[case][1]), prefix="model.")
    loaded = found[case].weights(3)
    assert set(loaded) == set(saved)
    wrong = [name for name, t in saved.items() if not torch.equal(loaded[name], t)]
    assert not wrong, wrong


@pytest.mark.parametrize("case", list(CASES))
def test_training_continues_as_the_straight_run(case: str, runs: tuple[Path, dict[str, Run]]) -> None:
    out, found = runs
    resumed, straight = found[case], found[CASES[case][1]]
    assert [s["step"] for s in resumed.steps] == [4, 5, 6]
    assert samples_by_step(resumed) == samples_by_step(straight)[3:]
    if case == "pp2-from-pp2":  # same layout: the same computation, dropout masks included
        assert resumed.losses == straight.losses[3:] and resumed.grad_norms == straight.grad_norms[3:]
        final, ref = resumed.weights(), straight.weights()
        assert all(torch.equal(final[name], ref[name]) for name in ref)
        return
    assert max_rel_diff(resumed.losses, straight.losses[3:]) <= RTOL, (resumed.losses, straight.losses[3:])
    assert max_rel_diff(resumed.grad_norms, straight.grad_norms[3:]) <= RTOL
    u_err, w_err, at = weight_errors(
        resumed.weights(), straight.weights(), read_full(checkpoint(out, CASES[case][1]), prefix="model.")
    )
    assert u_err <= UPDATE_RTOL and w_err <= WEIGHT_ATOL, (u_err, w_err, at)


def test_the_straight_runs_drop_the_same_entries(runs: tuple[Path, dict[str, Run]]) -> None:
    """pp2 and tp2 with sequence parallelism train with dropout (the plan says so) and agree: their
    masks are keyed by sample, not drawn per rank (test_parity.py shows dropout changes the step)."""
    found = runs[1]
    for name in SAVED:
        record = found[name].record
        assert record is not None and record["plan"]["model"]["dropout"] == DROPOUT
    assert max_rel_diff(found["tp2"].losses, found["pp2"].losses) <= RTOL
