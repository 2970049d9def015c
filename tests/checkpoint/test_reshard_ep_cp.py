"""Resuming across expert- and context-parallel layouts, parameter by parameter.

Two runs train 4 steps and save after step 2:

* ``ep2``: moe-tiny on dp2 x ep2, each rank holding half of every MoE layer's routed experts (the
  experts stored as two chunks, one per ep rank);
* ``cp2``: gpt-tiny with dropout 0.1 on cp2, every sequence split over two ranks (the weights
  replicated over cp: stored once).

From each step-2 checkpoint other layouts resume: the experts on ep1 with dp2 (every rank reads both
stored chunks) and on one rank (dp1), the cp2 run on one rank (cp1). Each resumed run's weights right
after the load equal the checkpoint's tensors read whole in one process (``storage.read_full``), bit
for bit; it then trains steps 3-4, reading the samples the straight run read, with losses, gradient
norms and final weights within the parity bounds (tests/trainer/test_parity.py) of the straight run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.helpers.ckpt_runs import Run, max_rel_diff, run_cases, samples_by_step
from tests.helpers.trainer_runs import RTOL, UPDATE_RTOL, WEIGHT_ATOL, weight_errors  # the parity tests' bounds

from exatrain.trainer.checkpoint.storage import read_full

pytestmark = pytest.mark.slow
STEPS, SAVE = 4, 2
SAVED = {"ep2": dict(model="moe-tiny", dp=2, ep=2), "cp2": dict(cp=2, dropout=0.1)}
RESUMED_ON_TWO = {"ep1-dp2-from-ep2": (dict(model="moe-tiny", dp=2), "ep2")}
RESUMED_ON_ONE = {"ep1-dp1-from-ep2": (dict(model="moe-tiny"), "ep2"), "cp1-from-cp2": (dict(dropout=0.1), "cp2")}
CASES = {**RESUMED_ON_TWO, **RESUMED_ON_ONE}


def checkpoint(out: Path, saved: str) -> Path:
    return out / f"ckpt-{saved}" / f"step-{SAVE:08d}"


def cases_on_two(out: Path) -> dict[str, dict]:
    """The ep2 and cp2 saves, then the two-rank resume: in the checkpoint tests' shared two-rank
    launch (conftest.py), saves before the resume that reads them."""
    cases = {
        name: dict(kw, steps=STEPS, checkpoint_dir=str(out / f"ckpt-{name}"), save_every=SAVE)
        for name, kw in SAVED.items()
    }
    cases.update(
        {
            name: dict(kw, steps=STEPS, resume_from=str(checkpoint(out, saved)))
            for name, (kw, saved) in RESUMED_ON_TWO.items()
        }
    )
    return cases


@pytest.fixture(scope="module")
def runs(ckpt_out: Path, launch_two: dict) -> tuple[Path, dict[str, Run]]:
    out = ckpt_out / "reshard_ep_cp"
    found = dict(launch_two["reshard_ep_cp"])
    found.update(
        run_cases(
            ckpt_out / "one-ep-cp",
            {
                name: dict(kw, steps=STEPS, resume_from=str(checkpoint(out, saved)))
                for name, (kw, saved) in RESUMED_ON_ONE.items()
            },
            timeout_s=600,
        )
    )
    return out, found


@pytest.mark.parametrize("case", list(CASES))
def test_the_load_reads_every_parameter_exactly(case: str, runs: tuple[Path, dict[str, Run]]) -> None:
    out, found = runs
    saved = read_full(checkpoint(out, CASES[case][1]), prefix="model.")
    loaded = found[case].weights(SAVE)
    assert set(loaded) == set(saved)
    wrong = [name for name, t in saved.items() if not torch.equal(loaded[name], t)]
    assert not wrong, wrong


@pytest.mark.parametrize("case", list(CASES))
def test_training_continues_as_the_straight_run(case: str, runs: tuple[Path, dict[str, Run]]) -> None:
    out, found = runs
    resumed, straight = found[case], found[CASES[case][1]]
    assert [s["step"] for s in resumed.steps] == list(range(SAVE + 1, STEPS + 1))
    assert samples_by_step(resumed) == samples_by_step(straight)[SAVE:]
    assert max_rel_diff(resumed.losses, straight.losses[SAVE:]) <= RTOL, (resumed.losses, straight.losses[SAVE:])
    assert max_rel_diff(resumed.grad_norms, straight.grad_norms[SAVE:]) <= RTOL
    u_err, w_err, at = weight_errors(
        resumed.weights(), straight.weights(), read_full(checkpoint(out, CASES[case][1]), prefix="model.")
    )
    assert u_err <= UPDATE_RTOL and w_err <= WEIGHT_ATOL, (u_err, w_err, at)


def test_the_saved_layouts_are_in_their_checkpoints(runs: tuple[Path, dict[str, Run]]) -> None:
    """trainer.json names cp (a resume onto cp2 restores per-rank RNG states, onto cp1 reseeds)."""
    import json

    out = runs[0]
    layouts = {name: json.loads((checkpoint(out, name) / "trainer.json").read_text())["layout"] for name in SAVED}
    assert layouts == {"ep2": {"tp": 1, "pp": 1, "dp": 2}, "cp2": {"tp": 1, "pp": 1, "dp": 1, "cp": 2}}
