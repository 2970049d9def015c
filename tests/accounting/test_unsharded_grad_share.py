"""How much of a pipeline stage's unsharded gradient a rank holds at once where the engine accumulates it
unsharded over the schedule and reduce-scatters each virtual stage's after that stage's last backward
(``EngineProfile.pp_unsharded_grad_bytes``: torchtitan's FSDP2 stages; ``accounting.memory.unsharded_grad_share``).

Broken on purpose and seen to fail here: the share left at 1 under the interleaved schedule (the published
405B interleaved row then reads +17.6%: the bytes test), the share taken as 1/v whatever the micro-batch
count (the schedule-order test)."""

from __future__ import annotations

import numpy as np
import pytest

from exatrain.accounting.engines import get_engine
from exatrain.accounting.inflight import group_size
from exatrain.accounting.memory import memory_by_stage, unsharded_grad_share
from exatrain.accounting.params import stage_params
from exatrain.catalog import get_model
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.settings import SCHEDULES
from exatrain.planner.cost.schedule import rank_order


@pytest.mark.parametrize("pp,v", [(2, 2), (4, 2), (4, 3), (8, 2)])
def test_one_virtual_stage_at_a_time_exactly_when_the_schedule_runs_one_round(pp, v) -> None:
    """From the schedule's own op order (``cost.schedule.rank_order``): where the micro-batches make one
    interleaving group (m <= pp, or m without a divisor from pp to m-1, e.g. 3 over pp 2) every rank runs all
    backwards of one virtual stage before the next's (each virtual stage's backwards one contiguous run), so
    one virtual stage's gradient is alive at a time: share 1/v. Otherwise some rank alternates between them and
    the share is 1. 1F1B and GPipe hold their one stage's: 1."""
    for m in range(pp, 3 * pp + 1):
        contiguous = True
        for rank in range(pp):
            kind, stage, _ = rank_order("interleaved", rank, pp, v, m)
            backward = stage[kind == 1]
            runs = 1 + int(np.count_nonzero(backward[1:] != backward[:-1]))
            contiguous &= runs == v
        share = float(unsharded_grad_share("interleaved", pp, m, v))
        assert share == (1.0 / v if contiguous else 1.0), (pp, v, m)
        assert contiguous == (group_size(pp, m) == m)
    for schedule in ("1f1b", "gpipe"):
        assert unsharded_grad_share(schedule, pp, pp, 1) == 1.0
    codes = np.array([SCHEDULES.index("interleaved"), SCHEDULES.index("1f1b")])
    assert list(unsharded_grad_share(codes, pp, np.array([pp, pp]), np.array([v, 1]))) == [1.0 / v, 1.0]


def test_torchtitans_interleaved_stage_holds_one_virtual_stages_unsharded_gradient() -> None:
    """torchtitan (FSDP2 under a pipeline: 4 bytes a parameter unsharded until a stage's last backward):
    one round (m = pp) holds half the rank's unsharded fp32 gradient under interleave 2, two rounds all of it;
    the engine that reduces as it goes (Megatron-Core) and 1F1B are unaffected."""
    m = get_model("llama3-8b")
    tt = get_engine("torchtitan")

    def plan(gb, schedule="interleaved", v=2):
        return Plan(
            model=m,
            dims=ParallelDims(2, 4, 2),
            shape=TrainShape(1, gb),
            zero_stage=2,
            recompute="full",
            schedule=schedule,
            interleave=v,
            runtime="torchtitan",
        ).validate()

    one, two = plan(8), plan(16)  # 4 and 8 micro-batches over pp 4
    assert (one.num_microbatches, two.num_microbatches) == (4, 8)
    for r in range(4):
        params = stage_params(one)[r]
        g1, g2 = (memory_by_stage(p, tt)[r].gradients for p in (one, two))
        assert g2 - g1 == pytest.approx(4.0 * params / 2, rel=1e-12)
    f1, f2 = (memory_by_stage(plan(gb, "1f1b", 1), tt)[0].gradients for gb in (8, 16))
    assert f1 == f2
