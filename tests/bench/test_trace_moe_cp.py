"""Traced vs analytical per-rank peak memory for mixture-of-experts (expert parallelism) and
context-parallel layouts: ``bench.trace`` runs the trainer's MoE layers (router, dropless dispatch,
all-to-all over the ep group, grouped GEMMs; routing at a balanced load) and its context shard
(s/cp tokens, K/V all-gathered over the cp group); ``accounting.trainer_memory`` counts the same.

The cases (tests/helpers/trace_matrix.py ``MOE_CP``) are traced in the trace tests' shared subprocess (the
trace keeps a fake process group for its process), started with the session on the idle core
(tests/helpers/trace_jobs.py, tests/helpers/background.py: this module's tests run last, by when it is
done). Analytical = the trainer memory model without its allocator allowance. Broken on purpose, each of
these fails (largest error over the cases' ranks, measured with ``python tests/helpers/trace_matrix.py
--table moe-ep2 moe-ep2-pp2 moe-pp2 moe-ep2-tp2 moe-zero3-dp2 cp2 cp2-tp2 cp4``; every case is within 1.8%
unbroken):
* the model counts the routed experts whole instead of N/ep per rank (``stage_params_split`` without
  ep in ``trainer_stage_memory``): moe-ep2-tp2 +29%, every MoE case beyond the bound;
* the trace leaves the experts unplaced (``_build`` without ``apply_expert_parallel``: every rank
  runs all N experts): moe-ep2 -19%, and ``test_traced_parameters_are_the_ep_shard`` fails;
* the model counts a MoE layer's routed token copies once per token instead of top_k times:
  moe-ep2-tp2 -8.5% (every MoE case beyond the bound);
* the model counts keys and values for the rank's own s/cp tokens instead of the gathered sequence:
  cp4 -9.5%, cp2-tp2 -6.0%, cp2 -5.6%;
* the model takes a rank's tokens as the whole sequence (no /cp): cp2 +64%; the trace does
  (``_StepRunner.tokens``): the trace fails (the context shard's positions do not broadcast).
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers import background, trace_jobs
from tests.helpers.trace_matrix import MOE_CP

TOLERANCE = 0.05
BACKGROUND_JOBS = {
    **trace_jobs.JOBS,
    "trace_moe_cp.estimate-moe-ep2-pp2": background.Job(
        [
            sys.executable,
            "-m",
            "exatrain",
            "estimate",
            "--model",
            "moe-tiny",
            "--cluster",
            "local-cpu",
            "--gpus",
            "4",
            "--dp",
            "2",
            "--ep",
            "2",
            "--pp",
            "2",
            "--trace",
            "--json",
        ]
    ),
}


@pytest.fixture(scope="module")
def matrix() -> dict:
    return trace_jobs.matrix()


@pytest.mark.parametrize("case", list(MOE_CP))
def test_moe_and_cp_traced_peak_matches_analytical(matrix, case) -> None:
    _, layout, _, _ = MOE_CP[case]
    rows = matrix[case]
    assert [r["rank"] for r in rows] == list(range(layout.get("pp", 1)))
    for row in rows:
        err = row["analytical"] / row["traced"] - 1
        assert abs(err) <= TOLERANCE, (
            f"{case} rank {row['rank']}: analytical {row['analytical'] / 2**20:.1f} MiB "
            f"vs traced {row['traced'] / 2**20:.1f} MiB ({err:+.1%})"
        )


@pytest.mark.parametrize("case", list(MOE_CP))
def test_fast_trace_equals_full_trace(matrix, case) -> None:
    """The fast trace (bench.trace.fast_trace) gives each MoE and cp stage the full trace's peak in
    every category, to the byte, without falling back to tracing it in full."""
    for row in matrix[case]:
        assert not row["fast_in_full"], f"{case} rank {row['rank']} fell back to the full trace"
        assert row["fast"] == row["full"], f"{case} rank {row['rank']}: fast {row['fast']} vs full {row['full']}"


@pytest.mark.parametrize("case", [c for c, (_, layout, _, _) in MOE_CP.items() if layout.get("zero_stage", 0) < 2])
def test_traced_parameters_are_the_ep_shard(matrix, case) -> None:
    """The trace holds the parameters the accounting gives a rank: the routed experts N/ep each
    (whole experts over the ep group, parallel/expert.py), the rest as in a dense model (replicated
    over cp), 4 bytes each in fp32. (Under FSDP the gathered bf16 parameters are parameters too at
    the peak: ZeRO-2/3 cases are compared by their totals only.)"""
    for row in matrix[case]:
        assert row["traced_weights"] == 4 * row["params_here"]


def test_estimate_trace_runs_for_a_moe_plan_with_expert_parallelism() -> None:
    """`estimate --trace` on the catalog's MoE preset with ep 2 x pp 2 traces every stage (one line of
    traced peaks beside the trainer memory model's, routing at a balanced load) and the runtime
    exatrain's memory is the trainer model's. Its own process: the trace keeps a fake process group."""
    out = background.result("trace_moe_cp.estimate-moe-ep2-pp2", BACKGROUND_JOBS)
    assert out.returncode == 0, out.stderr[-3000:]
    est = json.loads(out.stdout)
    note = [n for n in est["notes"] if n.startswith("traced (the trainer's model per stage")]
    assert len(note) == 1 and "MoE routing at a balanced load" in note[0]
    assert est["trainer_memory_by_stage"] == est["memory_by_stage"] and len(est["memory_by_stage"]) == 2
    assert est["traced_memory_bytes"]["total"] > 0


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--model", "moe-tiny", "--gpus", "2", "--dp", "2", "--ep", "2", "--zero", "1"], "--zero 0 only"),
        (["--model", "moe-tiny", "--gpus", "2", "--cp", "2"], "does not run mixture-of-experts models yet"),
    ],
)
def test_estimate_trace_refuses_a_layout_the_trainer_does_not_run(capsys, argv, words) -> None:
    """The trace runs the trainer's code, so a MoE or cp layout the trainer refuses is refused in the
    trainer's words (one line, exit status 2) before anything is traced, not traced as a layout no
    run has (ep with ZeRO-1 traced fine, with the trainer's states of a layout it never runs)."""
    from exatrain.cli import main

    code = main(["estimate", "--cluster", "local-cpu", *argv, "--trace"])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and words in err and "--trace traces what the trainer runs" in err, err
    assert "Traceback" not in err
