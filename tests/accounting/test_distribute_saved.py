"""Full recomputation's checkpoints split over the tensor-parallel ranks (Plan.distribute_saved_activations:
Megatron-Core --distribute-saved-activations, Megatron-DeepSpeed --partition-activations, metaseq
--distribute-checkpointed-activations): each rank keeps 1/tp of every layer's checkpointed input and nothing else
moves; the rule refuses it where no engine runs it; an exported config writes it and the reader reads it back; a
search with it tries only the layouts it applies to.

Broken on purpose and seen to fail here: ``_rules`` dividing every recomputation mode's layer bytes by tp, not only
full's (the working-set and selective asserts); ``stage_memory`` leaving the setting out of its Resolved (the
stage_memory assert); the split applied under sequence parallelism too (the sequence-parallel assert);
``distribute_saved_problem`` letting --tp 1 through (the rule assert); the reader not reading
--partition-activations (the round-trip assert); the search's grid keeping tp 1, or its sequence-parallel choice
kept open (the search assert).
"""

from __future__ import annotations

import pytest

from exatrain.accounting import memory
from exatrain.accounting.dtypes import COMPUTE_BYTES
from exatrain.accounting.engines import get_engine
from exatrain.catalog import get_cluster, get_model
from exatrain.errors import UserError
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.planner.memory_advice import worst_stage
from exatrain.settings import BY_NAME

from tests.helpers.memory import rank_memory

A100 = get_cluster("dgx-a100")


def _plan(**kw) -> Plan:
    base = dict(
        model=get_model("gpt3-1.3b"),
        dims=ParallelDims(tp=4, pp=2, dp=2),
        shape=TrainShape(micro_batch=2, global_batch=16),
        zero_stage=1,
        recompute="full",
        runtime="megatron-core",
        cluster=A100.name,
    )
    return Plan(**{**base, **kw})


def _rank(m, **kw):
    args = dict(
        dtype="bfloat16",
        flash=True,
        engine=get_engine("megatron-core"),
        zero_stage=1,
        tp=4,
        dp=2,
        micro_batch=2,
        pp=2,
        interleave=1,
        params_here=1e8,
        layers_here=12,
        inflight_mb=2,
        is_last=False,
        is_first=False,
    )
    return rank_memory(m, **{**args, **kw})


def test_each_rank_keeps_a_tp_share_of_every_checkpoint_and_nothing_else_moves() -> None:
    m = get_model("gpt3-1.3b")
    e, tokens, tp, layers, inflight = COMPUTE_BYTES["bfloat16"], 2 * m.seq_len, 4, 12, 2
    whole = _rank(m, recompute="full", sequence_parallel=False)
    split = _rank(m, recompute="full", sequence_parallel=False, distribute_saved_activations=True)
    assert split[:3] == whole[:3]  # model states
    # the kept inputs: e * tokens * hidden per layer and micro-batch, 1/tp of it kept
    assert whole[3] - split[3] == pytest.approx(e * tokens * m.hidden * (1 - 1 / tp) * layers * inflight)
    # under selective or no recomputation nothing is a checkpoint: the setting changes nothing
    for mode in ("selective", "none"):
        assert _rank(m, recompute=mode, sequence_parallel=False, distribute_saved_activations=True) == _rank(
            m, recompute=mode, sequence_parallel=False
        )
    # with sequence parallelism each rank holds 1/tp of the input already: no second split
    assert _rank(m, recompute="full", sequence_parallel=True, distribute_saved_activations=True) == _rank(
        m, recompute="full", sequence_parallel=True
    )


def test_a_plan_carries_it_to_its_stages_and_its_estimate() -> None:
    whole, split = _plan(), _plan(distribute_saved_activations=True).validate(A100)
    engine = get_engine("megatron-core")
    for rank in range(2):
        assert (
            memory.stage_memory(split, rank, engine).activations < memory.stage_memory(whole, rank, engine).activations
        )
    (_, a), (_, b) = worst_stage(whole, A100), worst_stage(split, A100)
    m = whole.model
    kept = COMPUTE_BYTES["bfloat16"] * 2 * m.seq_len * m.hidden * 12 * (1 - 1 / 4)
    assert a.activations - b.activations >= kept  # every layer of the worst stage, one micro-batch at least


@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(runtime="torchtitan"), "runtime torchtitan does not split its checkpoints"),
        (dict(recompute="selective"), "use --recompute full"),
        (dict(dims=ParallelDims(tp=1, pp=2, dp=2)), "with --tp 1 there is none to split over"),
        (dict(sequence_parallel=True), "split over the tp ranks already"),
    ],
)
def test_the_rule_refuses_it_where_no_engine_runs_it(kw, needle) -> None:
    plan = _plan(distribute_saved_activations=True, **kw)
    line = BY_NAME["distribute_saved_activations"].check(True, plan)
    assert line and needle in line
    with pytest.raises(UserError, match=needle):
        plan.validate(A100)


def test_exported_configs_write_it_and_read_it_back() -> None:
    from exatrain.engine_configs import export
    from exatrain.engine_configs.reading import read_launch

    for runtime, target, flag in (
        ("megatron-core", "megatron", "--distribute-saved-activations"),
        ("megatron-deepspeed", "deepspeed", "--partition-activations"),
    ):
        out = export(_plan(runtime=runtime, distribute_saved_activations=True).validate(A100), target)
        assert flag in out.text
        assert flag not in export(_plan(runtime=runtime).validate(A100), target).text
        back = read_launch(out.text, source="launch.sh", side_files=dict(out.files))
        assert back.settings.get("distribute_saved_activations") is True, runtime
        assert flag not in back.unknown


def test_a_search_with_it_tries_only_the_layouts_that_split_their_checkpoints() -> None:
    """Every candidate of a search given the setting recomputes fully, without sequence parallelism, at tp > 1; a
    pinned value that rules it out is refused in the rule's one line."""
    from exatrain import api

    res = api.search(
        "gpt3-1.3b", "dgx-a100", gpus=16, global_batch=64, runtime="megatron-core", distribute_saved_activations=True
    )
    plans = list(res.ranked)
    assert plans and all(p.distribute_saved_activations for p in plans)
    assert all(p.recompute == "full" and not p.sequence_parallel and p.tp > 1 for p in plans)
    for pin, needle in ((dict(tp=1), "with --tp 1"), (dict(recompute="none"), "use --recompute full")):
        with pytest.raises(UserError, match=needle):
            api.search(
                "gpt3-1.3b",
                "dgx-a100",
                gpus=16,
                global_batch=64,
                runtime="megatron-core",
                distribute_saved_activations=True,
                **pin,
            )
