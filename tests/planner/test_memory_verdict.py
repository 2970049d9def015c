"""The three-way memory verdict (planner/memory_band.py): fits, tight, does not fit; the estimate and search carry it.

A plan is "tight" when the device's capacity lies inside [low, high] of its predicted worst stage (both ends
included; the low end applied to the prediction without the engine's allocator allowance), "does not fit" when even
that low end is above capacity, "fits" otherwise. Broken on purpose (each fails here): the allowance left in the low
end (``p * lo > capacity`` in ``verdict_codes``) fails
``test_does_not_fit_is_judged_on_the_tensors_without_the_allocator_allowance`` and the search test, whose
independent count leaves it out; the verdict from the point prediction alone (``verdict`` returning fits / does not
fit by p <= C) fails ``test_the_three_cases_at_their_exact_boundaries`` and the search tests, which then find no
tight layout; a tight
layout dropped by a search that is not strict (``keep = codes == 0`` in search.search) fails
``test_search_keeps_tight_layouts_marked_and_strict_memory_drops_them``, as does a "fastest that fits outright" that
takes tight layouts too (``codes[order] <= 1`` in search.search); ``fits`` taken from the point prediction
again (estimate) fails ``test_the_estimate_and_its_json_carry_the_verdict``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from exatrain import api
from exatrain.catalog import get_cluster, get_model
from exatrain.cli import main
from exatrain.errors import UserError
from exatrain.plan import Plan
from exatrain.planner import memory_band as mb
from exatrain.planner.band import Traits, validated_summary
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.search import batch
from exatrain.planner.search.space import enumerate_space

GIB = 2.0**30


def test_the_three_cases_at_their_exact_boundaries() -> None:
    p, low, high = 100.0, 0.9, 1.2
    v = lambda cap, allowance=0.0: mb.verdict(p, cap, low, high, allowance=allowance)  # noqa: E731
    assert v(89.99) == "does not fit"  # capacity below p * low
    assert v(90.0) == "tight"  # capacity == p * low: inside the closed band
    assert v(100.0) == "tight"  # the point prediction fits, the band's top does not
    assert v(99.0) == "tight"  # the point prediction does not fit, the band's low end does
    assert v(120.0) == "tight"  # capacity == p * high
    assert v(120.01) == "fits"
    caps = np.array([89.99, 90.0, 99.0, 100.0, 120.0, 120.01])
    codes = [mb.verdict_codes(p, float(c), low, high, allowance=0.0) for c in caps]
    assert [mb.VERDICTS[int(c)] for c in codes] == [v(float(c)) for c in caps]
    arr = mb.verdict_codes(
        np.array([100.0, 50.0, 200.0]), 100.0, np.array([0.9, 0.9, 0.9]), np.array([1.2] * 3), allowance=0.0
    )
    assert [mb.VERDICTS[int(c)] for c in arr] == ["tight", "fits", "does not fit"]


def test_does_not_fit_is_judged_on_the_tensors_without_the_allocator_allowance() -> None:
    # p = 105 includes a 5% allowance: its tensors take 100; the low end of what they take is 90
    p, low, high = 105.0, 0.9, 1.2
    assert mb.verdict(p, 90.0, low, high, allowance=0.05) == "tight"  # 100 * 0.9 == capacity
    assert mb.verdict(p, 89.99, low, high, allowance=0.05) == "does not fit"
    assert mb.verdict(p, 94.0, low, high, allowance=0.0) == "does not fit"  # 105 * 0.9 = 94.5 without one
    # fitting is judged on the whole prediction, the allowance included: 105 * 1.2 = 126
    assert mb.verdict(p, 126.0, low, high, allowance=0.05) == "tight"
    assert mb.verdict(p, 126.01, low, high, allowance=0.05) == "fits"
    # every engine profile states 5% (accounting.engines): the value the verdict reads
    assert all(
        mb.allowance_of(e) == 0.05
        for e in ("exatrain", "megatron-core", "megatron-deepspeed", "torchtitan", "llm-foundry")
    )


def _table(center: float = 0.0, base: float = 0.1, unseen_engine: bool = True) -> dict:
    """A memory-band table whose measured runs are torchtitan ones on H100/H200 (8B-70B, seq 8192, selective, ZeRO-3),
    spread ``base``; an unmeasured engine takes the widest scale."""
    runs = [
        Traits(
            runtime="torchtitan",
            family="H100/H200",
            params=p,
            seq=8192,
            spans=False,
            fp8=False,
            moe=False,
            recompute="selective",
            zero=3,
        )
        for p in (8e9, 70e9)
    ]
    sigma = {"base": base, "far": 0.0, "default": 0.0, **{f: 0.0 for f in mb.MEMORY_FEATURES}}
    if unseen_engine:
        sigma["engine"] = base
    return {
        "center": center,
        "sigma": sigma,
        "quantiles": [-1.0, 1.0],
        "runs": 2,
        "sources": 2,
        "validated": validated_summary(runs),
    }


def test_the_band_widens_for_what_no_measured_run_validated() -> None:
    t = Traits(
        runtime="torchtitan",
        family="H100/H200",
        params=8e9,
        seq=8192,
        spans=False,
        fp8=False,
        moe=False,
        recompute="selective",
        zero=3,
    )
    near = mb.memory_band_of(t, _table())
    assert (near.low, near.high) == pytest.approx((np.exp(-0.1), np.exp(0.1))) and not near.widened
    far = mb.memory_band_of(Traits(**{**t.__dict__, "runtime": "megatron-core"}), _table())
    assert far.high == pytest.approx(np.exp(0.2)) and any("megatron-core" in w for w in far.widened)
    assert (
        mb.memory_band_of(t, {}).basis == "default"
        and (mb.memory_band_of(t, {}).low, mb.memory_band_of(t, {}).high) == mb.MEMORY_WIDE_DEFAULT
    )


@pytest.fixture
def table(monkeypatch):
    """Every plan's memory band [0.9, 1.2] x its prediction (a stored table with one spread and nothing unmeasured)."""
    t = _table(center=float(np.log(np.sqrt(0.9 * 1.2))), base=float(np.log(np.sqrt(1.2 / 0.9))), unseen_engine=False)
    monkeypatch.setattr(mb, "load_memory_bands", lambda path=mb.MEMORY_BANDS_PATH: t)
    return t


def test_the_estimate_and_its_json_carry_the_verdict(table, tmp_path, capsys) -> None:
    kw = dict(
        model="llama3-8b",
        cluster="dgx-h100",
        gpus=8,
        micro_batch=2,
        global_batch=64,
        zero=3,
        recompute="none",
        runtime="torchtitan",
    )
    plan = api.estimate(**kw)
    est = plan.estimate
    p, cap = est.memory_bytes.total, est.capacity_bytes
    assert est.memory_band["ratio_low"] == pytest.approx(0.9) and est.memory_band["ratio_high"] == pytest.approx(1.2)
    assert est.verdict == mb.verdict(p, cap, 0.9, 1.2, allowance=0.05) and est.fits == (est.verdict != "does not fit")
    d = est.to_dict()
    assert d["memory_verdict"] == est.verdict and d["memory_band"]["ratio_high"] == pytest.approx(1.2)
    # a plan written before the verdict existed loads, its verdict taken from fits
    path = tmp_path / "p.json"
    plan.save(path)
    raw = json.loads(path.read_text())
    for k in ("memory_verdict", "memory_band"):
        raw["estimate"].pop(k)
    path.write_text(json.dumps(raw))
    old = Plan.load(path).estimate
    assert old.memory_verdict == old.verdict == ("fits" if est.fits else "does not fit") and old.memory_band is None
    raw["estimate"]["memory_verdict"] = "roomy"  # a hand-edited file: one line, no traceback
    path.write_text(json.dumps(raw))
    with pytest.raises(UserError, match="memory_verdict must be fits, tight or does not fit") as err:
        Plan.load(path)
    assert "\n" not in str(err.value)
    # micro-batch 4 with full recomputation: predicted just above the capacity, the capacity inside the band — tight,
    # which a search keeps: fits is "not does not fit", not the point prediction against the capacity
    tight = api.estimate(**{**kw, "micro_batch": 4, "recompute": "full"}).estimate
    assert tight.memory_bytes.total > tight.capacity_bytes and tight.verdict == "tight" and tight.fits is True
    args = [
        "estimate",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "8",
        "--micro-batch",
        "4",
        "--global-batch",
        "64",
        "--zero",
        "3",
        "--recompute",
        "full",
        "--runtime",
        "torchtitan",
    ]
    code = main(args)
    out = capsys.readouterr().out
    # the window printed: the band's low end on the tensors (0.90 / 1.05 = 0.857), its high end on the whole
    assert code == 0 and "— tight (capacity inside 0.86–1.20 of the prediction)" in out
    code = main(args + ["--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and d["memory_verdict"] == "tight" and d["fits"] is True and d["memory_band"]["n"] == 2
    assert d["memory_band"]["allocator_allowance"] == 0.05 and mb.tight_window(d["memory_band"]) == pytest.approx(
        (0.9 / 1.05, 1.2)
    )


def _independent_verdicts(model, cluster, gpus, gb, runtime):
    """Each legal layout's verdict from the batch path's memory and the fixture's band, counted here."""
    m, c = get_model(model), get_cluster(cluster)
    space = enumerate_space(m, c, gpus, gb, runtime=runtime)
    res = batch.evaluate_space(space, m, c, gb, default_params(c.device.name), runtime=runtime)
    p, cap = res.memory_total, c.device.hbm_bytes
    a = p / 1.05  # the tensors without the engines' 5% allocator allowance
    return int((a * 0.9 > cap).sum()), int(((a * 0.9 <= cap) & (p * 1.2 >= cap)).sum()), int((p * 1.2 < cap).sum())


def test_search_keeps_tight_layouts_marked_and_strict_memory_drops_them(table, capsys) -> None:
    kw = dict(model="llama3-70b", cluster="dgx-h100", gpus=64, global_batch=256, runtime="megatron-core", top=40)
    dnf, tight, fits = _independent_verdicts("llama3-70b", "dgx-h100", 64, 256, "megatron-core")
    assert tight > 0 and fits > 0 and dnf > 0
    res = api.search(**kw)
    assert res.rejected["does not fit"] == dnf and res.tight == tight and res.feasible == tight + fits
    verdicts = [p.estimate.verdict for p in res.ranked]
    assert "tight" in verdicts and "does not fit" not in verdicts
    for p in res.ranked:
        assert p.estimate.memory_band["ratio_low"] == pytest.approx(0.9)
        assert p.estimate.verdict == mb.verdict(
            p.estimate.memory_bytes.total, p.estimate.capacity_bytes, 0.9, 1.2, allowance=0.05
        )
    strict = api.search(**kw, strict_memory=True)
    assert strict.rejected["tight (--strict-memory)"] == tight and strict.feasible == fits
    assert strict.ranked and all(p.estimate.verdict == "fits" for p in strict.ranked)
    # the fastest kept layout that fits outright is the strict search's winner, at its rank among the kept
    best = res.best_fitting
    assert best is not None and best.estimate.verdict == "fits" and res.best_fitting_rank > 1
    assert (best.label, best.micro_batch, best.zero_stage, best.recompute_label, best.schedule_label) == (
        strict.ranked[0].label,
        strict.ranked[0].micro_batch,
        strict.ranked[0].zero_stage,
        strict.ranked[0].recompute_label,
        strict.ranked[0].schedule_label,
    )
    assert best.estimate.time_s.step == pytest.approx(strict.ranked[0].estimate.time_s.step)
    if res.best_fitting_rank <= len(res.ranked):
        assert res.ranked[res.best_fitting_rank - 1] is best
    assert all(p.estimate.verdict != "fits" for p in res.ranked[: res.best_fitting_rank - 1])
    # the CLI: a column marks them, a line says why; --strict-memory drops them; --json carries both
    code = main(
        [
            "search",
            "--model",
            "llama3-70b",
            "--cluster",
            "dgx-h100",
            "--gpus",
            "64",
            "--global-batch",
            "256",
            "--runtime",
            "megatron-core",
            "--top",
            "60",
        ]
    )
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert code == 0 and any(line.rstrip("│ ").endswith("tight") for line in rows)
    assert "tight: #" in out and "--strict-memory drops them" in out and f"{tight:,} of them tight, kept" in out
    assert f"fastest that fits outright: #{res.best_fitting_rank:,} {best.label} " in out
    code = main(
        [
            "search",
            "--model",
            "llama3-70b",
            "--cluster",
            "dgx-h100",
            "--gpus",
            "64",
            "--global-batch",
            "256",
            "--runtime",
            "megatron-core",
            "--top",
            "60",
            "--strict-memory",
            "--json",
        ]
    )
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and d["strict_memory"] is True and d["tight"] == tight
    assert d["best_fitting"]["rank"] == 1 and d["best_fitting"]["memory_verdict"] == "fits"
    assert d["rejected"]["tight (--strict-memory)"] == tight and d["rejected"]["does not fit"] == dnf
    assert {r["memory_verdict"] for r in d["ranked"]} == {"fits"}


def test_scaling_follows_the_search(table, capsys) -> None:
    kw = dict(
        model="llama3-70b", cluster="dgx-h100", gpus=(64, 128), global_batch=256, runtime="megatron-core", mode="strong"
    )
    loose, strict = api.scaling(**kw), api.scaling(**kw, strict_memory=True)
    assert all(pt.plan.estimate.verdict == "fits" for pt in strict.points)
    for a, b in zip(loose.points, strict.points):  # dropping layouts never makes the best one faster
        assert a.plan.estimate.tokens_per_s >= b.plan.estimate.tokens_per_s
    code = main(
        [
            "scaling",
            "--model",
            "llama3-70b",
            "--cluster",
            "dgx-h100",
            "--gpus",
            "64,128",
            "--global-batch",
            "256",
            "--runtime",
            "megatron-core",
            "--mode",
            "strong",
            "--strict-memory",
            "--json",
        ]
    )
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and {p["memory_verdict"] for p in d["points"]} == {"fits"}


def test_the_shipped_memory_table_is_symmetric_and_says_what_it_covered() -> None:
    """The stored band (``prediction_error.py --write-bands``) is symmetric about its center (its half-width the 80%
    quantile of the out-of-source absolute residuals) and carries the leave-one-source-out coverage and verdicts it
    reached; no run that trained is called "does not fit" there, and the band holds at least three quarters of the
    measured peaks of sources it never saw."""
    t = mb.load_memory_bands()
    lo, hi = t["quantiles"]
    assert lo == -hi and hi > 0 and "central 80%" in t["statistic"]
    held = t["leave_one_source_out"]
    assert held["band"]["n"] == t["runs"] and held["verdicts"]["does not fit"] == 0
    assert held["band"]["coverage"] >= 0.75
