"""The tuner's sampler on the real candidate set of gpt-tiny over 4 ranks: what it picks first,
how measurements move its model, when it calls the rest hopeless, and the pruner's rule."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest

from exatrain.catalog import get_cluster, get_model
from exatrain.planner.search.search import search
from exatrain.planner.search.space import SCHEDULE_VARIANTS, SpaceOptions
from exatrain.settings import V_SCHEDULES
from exatrain.tuning.sampler import (
    Candidates,
    HopelessPruner,
    Observations,
    choose,
    layout_key,
    observations,
    posterior,
)


@pytest.fixture(scope="module")
def cands() -> Candidates:
    # A runtime that runs every pipeline schedule and judges memory by the accounting (torchtitan): 80 layouts of
    # many meshes, schedules and ZeRO stages. (Megatron-DeepSpeed's run 1F1B only.) (exatrain's own candidates of this
    # size are mostly ZeRO twins of one mesh, among which a single fast measurement is, rightly, not believed enough to
    # stop the study.)
    # The set is pinned to the looped schedules and every overlap on, so that the sampler's checks stand on the same
    # layouts when the planner's space or defaults grow (the V schedules add near-twins of the looped ones).
    looped = SpaceOptions(schedules=tuple(v for v in SCHEDULE_VARIANTS if v[0] not in V_SCHEDULES + ("zbh1",)))
    result = search(
        get_model("gpt-tiny"),
        get_cluster("local-cpu"),
        4,
        8,
        top=80,
        dtype="float32",
        runtime="torchtitan",
        options=looped,
        overlap="all",
    )
    return Candidates.from_plans(result.ranked, gpus=4, global_batch=8)


def _obs(measured: dict[int, float], extra_excluded: tuple[int, ...] = ()) -> Observations:
    logs = {i: math.log(v) for i, v in measured.items()}
    return Observations(logs, frozenset(measured) | frozenset(extra_excluded), frozenset(measured))


def test_candidates_are_distinct_layouts_best_predicted_first(cands: Candidates) -> None:
    assert len(cands) == 80 and len(set(cands.keys)) == len(cands)
    assert list(cands.predicted) == sorted(cands.predicted, reverse=True)
    assert cands.features.min() >= 0 and cands.features.max() <= 1
    assert all(cands.index[layout_key(cands.params(i))] == i for i in range(len(cands)))


def test_without_runs_the_first_pick_is_the_best_prediction(cands: Candidates) -> None:
    assert choose(cands, _obs({})).index == 0
    assert choose(cands, _obs({}, extra_excluded=(0, 1))).index == 2  # queued or running layouts are skipped


def test_seeds_are_the_best_layout_of_distinct_meshes(cands: Candidates) -> None:
    seeds = cands.seeds(3)
    meshes = [(cands.plans[i].tp, cands.plans[i].pp) for i in seeds]
    assert seeds[0] == 0 and len(set(meshes)) == 3
    for i, mesh in zip(seeds, meshes):  # nothing of the same mesh is predicted faster
        assert all(
            cands.predicted[j] <= cands.predicted[i]
            for j in range(len(cands))
            if (cands.plans[j].tp, cands.plans[j].pp) == mesh
        )


def test_a_slow_measurement_lowers_similar_layouts_more_than_others(cands: Candidates) -> None:
    tp1 = next(i for i in range(len(cands)) if cands.plans[i].tp == 1 and cands.plans[i].pp == 1)
    tp2 = next(i for i in range(len(cands)) if cands.plans[i].tp == 2 and cands.plans[i].pp == 1)
    # both 10x slower than predicted (a global offset), tp2 another 4x: tp-2 layouts should drop
    measured = {tp1: cands.predicted[tp1] / 10, tp2: cands.predicted[tp2] / 40}
    mean, std = posterior(cands, {i: math.log(v) for i, v in measured.items()})
    resid = mean - np.log(cands.predicted)
    others_tp2 = [i for i in range(len(cands)) if cands.plans[i].tp == 2 and i != tp2]
    others_tp1 = [i for i in range(len(cands)) if cands.plans[i].tp == 1 and i != tp1]
    # by a clear margin (the size of the pull depends on how like the measured layout the set's other tp-2 layouts
    # are: 0.17 in log on the set of 2026-12-08); a sampler blind to tp moves both groups alike
    assert np.mean(resid[others_tp2]) < np.mean(resid[others_tp1]) - math.log(1.15)
    assert abs(mean[tp1] - math.log(measured[tp1])) < 0.15  # measured points are pinned (noise 10%)
    assert std[tp1] < std[others_tp1].min()
    pick = choose(cands, _obs(measured)).index
    assert pick is not None and pick not in measured and cands.plans[pick].tp != 2


def test_hopeless_when_nothing_untried_can_beat_the_best(cands: Candidates) -> None:
    # every layout measured at a tenth of its prediction except the best, 5x above that rule
    measured = {i: cands.predicted[i] / 10 for i in range(1, len(cands) - 10)}
    measured[0] = cands.predicted[0] / 2
    c = choose(cands, _obs(measured))
    assert c.index is not None and c.index >= len(cands) - 10 and c.hopeless
    assert not choose(cands, _obs({0: cands.predicted[0] / 10})).hopeless
    assert choose(cands, _obs({i: 1.0 for i in range(len(cands))})).index is None


def test_pruner_stops_only_runs_far_below_the_best_after_enough_steps() -> None:
    study = optuna.create_study(direction="maximize")
    study.add_trial(optuna.create_trial(value=1000.0))
    pruner = HopelessPruner(ratio=0.5, min_steps=2)

    def frozen(values: list[float]) -> optuna.trial.FrozenTrial:
        return optuna.create_trial(
            state=optuna.trial.TrialState.RUNNING, intermediate_values={3 + i: v for i, v in enumerate(values)}
        )

    assert not pruner.prune(study, frozen([100.0]))  # one step is not enough evidence
    assert pruner.prune(study, frozen([100.0, 120.0]))
    assert not pruner.prune(study, frozen([600.0, 450.0]))  # median 525 >= 500
    assert not HopelessPruner(ratio=0.0).prune(study, frozen([1.0, 1.0, 1.0]))
    assert not pruner.prune(optuna.create_study(direction="maximize"), frozen([1.0, 1.0]))  # no best yet


def test_a_failed_run_steers_the_sampler_away_from_its_neighbours(cands: Candidates) -> None:
    def trial(i: int, status: str, value: float | None = None) -> optuna.trial.FrozenTrial:
        attrs = {"layout": cands.keys[i], "status": status, "ran": True, "measured_tokens_per_s": value}
        return optuna.create_trial(
            state=optuna.trial.TrialState.FAIL if value is None else optuna.trial.TrialState.COMPLETE,
            value=value,
            user_attrs=attrs,
        )

    ok_run = trial(0, "ok", cands.predicted[0] / 10)
    crashed = next(i for i in range(1, len(cands)) if cands.plans[i].tp == 2)

    def but_zero(i: int) -> dict:
        return {k: v for k, v in cands.params(i).items() if k != "zero_stage"}

    twins = [i for i in range(len(cands)) if i not in (0, crashed) and but_zero(i) == but_zero(crashed)]
    assert twins
    without = choose(cands, observations(cands, [ok_run]))
    obs = observations(cands, [ok_run, trial(crashed, "failed")])
    assert obs.measured[crashed] < obs.measured[0] and crashed in obs.excluded and obs.ok == {0}
    mean_before, _ = posterior(cands, observations(cands, [ok_run]).measured)
    mean_after, _ = posterior(cands, obs.measured)
    assert all(mean_after[i] < mean_before[i] - 0.1 for i in twins)
    assert without.index in twins and choose(cands, obs).index not in twins  # the failure changed the pick
