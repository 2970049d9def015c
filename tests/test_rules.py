"""One list of legality rules: per plan (Plan.validate), vectorised (the search's space) and the
trainer's refusals (TrainConfig.check) are the same predicates, reason by reason."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest

from exatrain import rules
from exatrain.catalog import get_cluster, get_model
from exatrain.errors import PlanError
from exatrain.plan import RECOMPUTE, SCHEDULES, ParallelDims, Plan, TrainShape
from exatrain.planner.search.space import REASONS, RUNTIME_REASON, TRAINER_REASON, SpaceOptions, enumerate_space
from exatrain.trainer.config import TrainConfig

MODELS = ("gpt-tiny", "llama-tiny", "gpt-175b", "llama3-70b")
ALL = ("plan", "run", "trainer", "search")


def _random_plan(rnd: random.Random) -> Plan:
    model = get_model(rnd.choice(MODELS))
    schedule = rnd.choice(SCHEDULES + ("pipedream",) * (rnd.random() < 0.05))
    pp = rnd.choice([1, 1, 2, 3, 4, 8, 16, 128])
    v = rnd.choice([1, 1, 2, 3, 4, 0])
    stage_layers: tuple = ()
    if rnd.random() < 0.2 and pp * max(v, 1) <= model.layers:
        k = pp * max(v, 1)
        cuts = sorted(rnd.sample(range(1, model.layers), k - 1))
        stage_layers = tuple(b - a for a, b in zip([0] + cuts, cuts + [model.layers]))
        if rnd.random() < 0.3:
            stage_layers = stage_layers[:-1] + (stage_layers[-1] + rnd.choice([-1, 1]),)
    mb = rnd.choice([1, 1, 2, 3, 4])
    dp = rnd.choice([1, 2, 3, 4, 8])
    gb = mb * dp * rnd.choice([1, 2, 4, 16, 64]) + (rnd.choice([1, 2]) if rnd.random() < 0.15 else 0)
    return Plan(model=model, dims=ParallelDims(tp=rnd.choice([1, 1, 2, 3, 4, 8, 16, 0]), pp=pp, dp=dp),
                shape=TrainShape(mb, gb), zero_stage=rnd.choice([0, 1, 2, 3, 3, 4]),
                recompute=rnd.choice(RECOMPUTE + ("some",) * (rnd.random() < 0.05)),
                sequence_parallel=rnd.random() < 0.4, schedule=schedule, interleave=v,
                stage_layers=stage_layers, dtype=rnd.choice(["bfloat16", "float32", "bfloat16", "fp8"]))


def test_vectorised_rules_equal_the_per_plan_ones_reason_by_reason() -> None:
    """3,000 random plans (most of them illegal somewhere): the masks the search computes over all
    of them at once equal each plan's own evaluation, rule by rule, and Plan.validate reports the
    first broken rule's reason (or passes when none is broken)."""
    rnd = random.Random(7)
    for cluster in (None, get_cluster("frontier"), get_cluster("local-cpu")):
        for compile_ in (False, True):
            plans = [_random_plan(rnd) for _ in range(250)]
            # A layout set shares the model, the custom split and the dtype (as the search's do).
            for model, split, dtype in {(p.model, p.stage_layers, p.dtype) for p in plans}:
                sub = [p for p in plans if (p.model, p.stage_layers, p.dtype) == (model, split, dtype)]
                x = rules.layout(model, tp=[p.tp for p in sub], pp=[p.pp for p in sub], dp=[p.dp for p in sub],
                                 micro_batch=[p.micro_batch for p in sub], global_batch=[p.global_batch for p in sub],
                                 zero_stage=[p.zero_stage for p in sub], recompute=[p.recompute for p in sub],
                                 sequence_parallel=[p.sequence_parallel for p in sub],
                                 schedule=[p.schedule for p in sub], interleave=[p.interleave for p in sub],
                                 stage_layers=split, dtype=dtype, cluster=cluster, compile=compile_)
                masks = rules.broken(x, scopes=ALL)
                assert list(masks) == list(rules.REASONS)
                for i, plan in enumerate(sub):
                    own = {r.reason for r in rules.problems(plan, cluster, scopes=ALL, compile=compile_)}
                    for reason, mask in masks.items():
                        assert bool(mask[i]) == (reason in own), (plan, reason)
            for plan in plans:
                first = rules.problems(plan, cluster)
                if first:
                    with pytest.raises(rules.RuleError) as err:
                        plan.validate(cluster)
                    assert err.value.reason == first[0].reason
                    assert isinstance(err.value, PlanError) and "\n" not in str(err.value)
                else:
                    assert plan.validate(cluster) is plan


def test_space_counts_each_candidate_under_its_first_rule() -> None:
    """The space's counts are Plan.validate's first reasons: every grid candidate (bar the collapsed
    equivalent spellings) made into a Plan fails validation with the reason it was counted under,
    and the legal ones validate."""
    m, c = get_model("gpt-small"), get_cluster("local-cpu")
    opts = SpaceOptions(tp=(1, 2, 3, 4, 6), pp=(1, 2, 3, 4, 8), micro_batch=(1, 2, 3), zero_stage=(0, 2),
                        recompute=("none",), sequence_parallel=(False, True),
                        schedules=(("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zero_bubble", 2)))
    gpus, gb = 24, 24
    for runtime in ("megatron-deepspeed", "exatrain"):  # both offer every ZeRO stage
        space = enumerate_space(m, c, gpus, gb, opts, runtime=runtime)
        expected = dict.fromkeys(REASONS + ((TRAINER_REASON,) if runtime == "exatrain" else ()) + (RUNTIME_REASON,), 0)
        legal = set()
        for tp in opts.tp:
            for pp in opts.pp:
                for mb in opts.micro_batch:
                    for zero in opts.zero_stage:
                        for sp in opts.sequence_parallel:
                            for sched, v in opts.schedules:
                                dp = gpus // (tp * pp) if gpus % (tp * pp) == 0 else 0
                                if (pp == 1 and (sched, v) != ("1f1b", 1)) or (tp == 1 and sp) or (dp == 1 and zero):
                                    continue  # collapsed: an equivalent spelling of another candidate
                                plan = Plan(model=m, dims=ParallelDims(tp, pp, max(dp, 1)), shape=TrainShape(mb, gb),
                                            zero_stage=zero, sequence_parallel=sp, schedule=sched, interleave=v)
                                scopes = ("plan", "trainer") if runtime == "exatrain" else ("plan",)
                                bad = rules.problems(plan, c, scopes=scopes)
                                if not dp:  # a Plan's gpus are tp*pp*dp: only a requested count breaks that rule
                                    gpus_rule = rules.REASONS.index("gpus not divisible by tp*pp")
                                    first = [r.reason for r in bad if rules.REASONS.index(r.reason) < gpus_rule]
                                    expected[(first or ["gpus not divisible by tp*pp"])[0]] += 1
                                    continue
                                if bad:
                                    expected[bad[0].reason] += 1
                                else:
                                    legal.add((tp, pp, mb, zero, sp, sched, v))
        assert space.rejected == expected
        names = [s for s, _ in opts.schedules]
        got = {(int(a), int(b), int(d), int(z), bool(s), names[k], opts.schedules[k][1])
               for a, b, d, z, s, k in zip(space.tp, space.pp, space.micro_batch, space.zero, space.sp, space.variant)}
        assert got == legal and len(space) == len(legal)


def _old_trainer_refusal(plan: Plan, compile_: bool) -> str | None:
    """What TrainConfig.check refused before the rules moved to exatrain.rules (its two checks)."""
    if compile_ and plan.tp > 1:
        return "--compile runs without tensor parallelism only"
    if plan.pp > 1 and plan.schedule == "zero_bubble" and plan.dp > 1 and plan.zero_stage >= 2:
        return "the zero_bubble schedule cannot run with FSDP"
    return None


def test_trainer_refuses_exactly_what_it_refused_before() -> None:
    rnd = random.Random(3)
    seen = set()
    for _ in range(600):
        plan = _random_plan(rnd)
        try:
            plan = plan.validate()
        except PlanError:
            continue
        compile_ = rnd.random() < 0.5
        want = _old_trainer_refusal(plan, compile_)
        if want is None:
            TrainConfig(plan=plan, compile=compile_).check()
        else:
            with pytest.raises(PlanError, match=want):
                TrainConfig(plan=plan, compile=compile_).check()
        seen.add(want)
    assert len(seen) == 3  # both refusals and acceptance were exercised


def test_reasons_are_one_list() -> None:
    assert len(set(rules.REASONS)) == len(rules.RULES)
    assert set(REASONS) | {TRAINER_REASON} <= set(rules.REASONS)
    assert TRAINER_REASON in rules.TRAINER_REASONS
    assert np.all([r.scope in ("plan", "run", "trainer", "search") for r in rules.RULES])


@pytest.mark.parametrize(("change", "said"), [
    ({"dims": ParallelDims(tp=1, pp=1, dp=2, cp=3)}, "divisible by 2*cp = 6"),
    ({"runtime": "deepspeed"}, "--runtime must be one of megatron-core, megatron-deepspeed, torchtitan, exatrain"),
    ({"fp8": "fast"}, "--fp8 must be one of"),
    ({"fp8": "delayed", "dtype": "float32"}, "use --dtype bfloat16"),
])
def test_context_runtime_and_fp8_rules_name_the_fix(change, said) -> None:
    plan = Plan(model=get_model("gpt-tiny"), dims=ParallelDims(dp=2), shape=TrainShape(1, 2))
    with pytest.raises(PlanError, match=re.escape(said)):
        plan.replace(**change).validate()


def test_cp_and_runtime_round_trip_through_plan_json() -> None:
    plan = Plan(model=get_model("gpt-tiny"), dims=ParallelDims(tp=2, dp=2, cp=2), shape=TrainShape(1, 2),
                runtime="megatron-core", fp8="delayed").validate()
    assert plan.gpus == 8 and plan.label == "tp2·pp1·dp2·cp2"
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan
    plain = Plan(model=get_model("gpt-tiny")).to_dict()
    assert not {"cp", "runtime", "fp8"} & set(plain)  # defaults stay out of the JSON users already have
