"""One-shot calibration on published runs: calibrate on one run of a cluster and engine, predict the others.

Rows: the published runs benchmarks/prediction_error.py reads and prices (benchmarks/data/published_runs_by_engine.csv),
each with its out-of-sample prediction there (the shipped prior where it never saw the row's source, else the prior
refitted without the source) and its band fitted without its source (nested leave one source out).

For every source with four or more priced runs on one cluster and engine (a group), the run at the median GPU count (the
lower of the two middle ones) is turned into a RunRecord and calibrated on through ``exatrain calibrate``'s own path
(``bench.fit.fit_calibration``, from the parameters that made the row's out-of-sample prediction): one run fits the one
term of the cost model (GEMM, attention, element-wise, communication, overheads) that carries the most of its prior
uncertainty, shrunk to the prior (``planner.cost.shrinkage``: each term's spread between sources and a run's own,
measured on the other sources' runs, never the group's own source). ``--scale-only`` fits step_scale alone, shrunk the
same way (the whole step's spreads); ``--no-shrink`` step_scale on the whole miss. Every other run of the group is
predicted with the calibrated parameters, and its measured over predicted step time is checked against the band a
one-run calibration carries (``planner.band.centred``): the published-run band (its ratios fitted without the source)
without the share of its centre (the pooled sources' median bias) that the calibration removed, around the calibrated
prediction; ``--keep-centre`` reports the band with its centre.

Printed per engine x hardware family and overall: runs predicted, groups, median |error|, p90 |error|, signed median
(predicted / measured - 1), band coverage, uncalibrated median and signed median on the same runs.

    python benchmarks/one_shot.py [--json OUT] [--keep-centre] [--scale-only | --no-shrink]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import prediction_error as pe  # noqa: E402

from exatrain.bench.fit import fit_calibration  # noqa: E402
from exatrain.planner import band as bandlib  # noqa: E402
from exatrain.planner.cost import shrinkage  # noqa: E402
from exatrain.plan import Measured, RunRecord  # noqa: E402
from exatrain.planner.cost.coefficients import Calibration, CostParams, default_params  # noqa: E402
from exatrain.planner.plan_cost import step_time  # noqa: E402

MIN_RUNS = 4  # runs of one source on one cluster and engine for the protocol to take the group
REL = 1e-6  # how closely the rebuilt parameters must reproduce the row's out-of-sample prediction


def _step(row: pe.Row, params: CostParams) -> float:
    return step_time(row.plan, row.cluster, params, row.overlap)[0].step


def out_of_sample(rows: list[pe.Row]) -> dict[int, CostParams]:
    """``prediction_error``'s out-of-sample predictions, and the parameters behind each: those of the last of its
    ``_predict_s`` calls on the row that gave the prediction it kept (a refit also prices the row while fitting to
    it as another source's run), else the device's prior, which ``price`` used; only rows whose prediction they
    reproduce (to ``REL``)."""
    seen: dict[int, list[tuple[CostParams, float]]] = {}
    predict = pe._predict_s

    def recording(row: pe.Row, params: CostParams) -> float:
        value = predict(row, params)
        seen.setdefault(row.index, []).append((params, value))
        return value

    pe._predict_s = recording
    try:
        pe.out_of_sample(rows)
        pe.blocking_out_of_sample(rows)
    finally:
        pe._predict_s = predict
    out = {}
    for r in rows:
        if r.oos_s is None or r.plan is None:
            continue
        kept = [p for p, v in seen.get(r.index, ()) if v == r.oos_s]
        # a factor the row does not exercise (FP8's speed-up on a bf16 run) leaves its price the same under a refit's
        # passing parameters: the refit's own result, where one gave the row's prediction, is the one it was made with
        refit = [p for p in kept if p.source.startswith("refit on")]
        params = (refit or kept or [default_params(r.cluster.device.name)])[-1]
        if abs(_step(r, params) / r.oos_s - 1) < REL:
            out[r.index] = params
    return out


def loso_band_params(rows: list[pe.Row]) -> dict[int, tuple[float, float, float]]:
    """Each row's band fitted without its source (``prediction_error.loso_bands``): (low, high, centre) ratios."""
    items = pe.band_items(rows)
    dist = pe._distances(items)
    out = {}
    for source in sorted({r.source for r, _ in items}):
        train = [i for i, (r, _) in enumerate(items) if r.source != source]
        params = bandlib.fit(*pe._fit_inputs([items[i] for i in train], [dist[i] for i in train]))
        for i, (r, tr) in enumerate(items):
            if r.source == source:
                lo, hi, _ = bandlib.interval(tr, dist[i], params)
                out[r.index] = (lo, hi, math.exp(params["center"]))
    return out


def groups(rows: list[pe.Row], usable: set[int]) -> dict[tuple[str, str, str], list[pe.Row]]:
    """(source, cluster, engine) -> its priced runs with a measured step, where there are MIN_RUNS or more."""
    by: dict[tuple[str, str, str], list[pe.Row]] = {}
    for r in rows:
        if r.index in usable and r.measured_s:
            by.setdefault((r.source, r.cluster.name, r.engine), []).append(r)
    return {k: v for k, v in by.items() if len(v) >= MIN_RUNS}


def anchor_of(runs: list[pe.Row]) -> pe.Row:
    """The run at the median GPU count (the lower middle one; the first such in the table)."""
    ordered = sorted(runs, key=lambda r: (r.plan.gpus, r.index))
    return ordered[(len(ordered) - 1) // 2]


def one_shot(
    rows: list[pe.Row], params: dict[int, CostParams], recentre: bool = False, how: str = "terms"
) -> list[dict]:
    """Every predicted run of every group: its errors before and after the one-run calibration and its band
    (``params``: each row's out-of-sample parameters, ``out_of_sample``). ``how``: "terms", the calibration fits the
    term the anchor's breakdown says is the most uncertain, shrunk by the spreads the other sources' runs show
    (``cost.shrinkage``, estimated without the group's source); "scale", step_scale shrunk by the whole step's
    spreads; "whole", step_scale on all of the anchor's miss."""
    bands = loso_band_params(rows)
    shares = pe.term_shares(rows) if how == "terms" else {}
    results = []
    for (source, cluster, engine), runs in sorted(groups(rows, set(params)).items()):
        a = anchor_of(runs)
        if how == "terms":
            held = pe.shrinkage_of(rows, shares, without=source)
        elif how == "scale":
            held = shrinkage.estimate(pe.log_ratios_by_source(rows, without=source))
        else:
            held = shrinkage.Shrinkage(between=1.0, within=0.0)
        weight = held.weight(1)  # the share of the published band's centre a one-run calibration takes out
        rec = RunRecord(
            plan=a.plan,
            measured=Measured(steps=0, step_time_s=a.measured_s, tokens_per_s=a.plan.tokens_per_step / a.measured_s),
            device=a.cluster.device.name,
            env={"overlap": a.overlap},
        )
        base = Calibration(devices={}, fits={(a.cluster.name, a.plan.runtime): params[a.index]})
        with shrinkage.using(held):
            result = fit_calibration([rec], base=base, cluster=a.cluster)
        fitted, fit = result.calibration, result.fits[0]
        for r in runs:
            if r is a or r.index not in bands:
                continue
            if abs(_step(r, params[a.index]) / r.oos_s - 1) >= REL:  # priced out of sample by other parameters
                continue
            p = fitted.params_for(r.cluster.device.name, r.cluster.name, r.plan.runtime)
            pred = _step(r, p)
            lo, hi, centre = bands[r.index]
            if recentre:  # the calibration took ``weight`` of the bias the band's centre stands for
                lo, hi = lo / centre**weight, hi / centre**weight
            ratio = r.measured_s / pred
            results.append(
                {
                    "index": r.index,
                    "name": r.name,
                    "engine": engine,
                    "family": r.family,
                    "cluster": cluster,
                    "source": source,
                    "anchor": a.index,
                    "gpus": r.plan.gpus,
                    "measured_s": r.measured_s,
                    "uncalibrated_s": r.oos_s,
                    "calibrated_s": pred,
                    "step_scale": p.step_scale,
                    "weight": weight,
                    "terms": list(fit.terms),
                    "taken": fit.taken,
                    "band": [lo, hi],
                    "inside": bool(lo <= ratio <= hi),
                }
            )
    return results


def stats(rs: list[dict]) -> dict:
    cal = np.array([r["calibrated_s"] / r["measured_s"] - 1 for r in rs])
    unc = np.array([r["uncalibrated_s"] / r["measured_s"] - 1 for r in rs])
    return {
        "n": len(rs),
        "groups": len({(r["source"], r["cluster"], r["engine"]) for r in rs}),
        "median": float(np.median(np.abs(cal))),
        "p90": float(np.percentile(np.abs(cal), 90)),
        "signed_median": float(np.median(cal)),
        "coverage": float(np.mean([r["inside"] for r in rs])),
        "width": float(np.median([r["band"][1] - r["band"][0] for r in rs])),
        "uncalibrated_median": float(np.median(np.abs(unc))),
        "uncalibrated_signed": float(np.median(unc)),
    }


def table(results: list[dict]) -> dict[str, dict]:
    cells: dict[str, list[dict]] = {}
    for r in results:
        cells.setdefault(f"{r['engine']}/{r['family']}", []).append(r)
    out = {k: stats(v) for k, v in sorted(cells.items())}
    out["all/all"] = stats(results)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, metavar="OUT", help="write every predicted run and the cells as JSON")
    ap.add_argument(
        "--keep-centre",
        action="store_true",
        help="the published-run band with its centre (the sources' "
        "median bias), as if the calibration had not removed it",
    )
    how = ap.add_mutually_exclusive_group()
    how.add_argument(
        "--scale-only",
        action="store_true",
        help="calibrate step_scale alone, shrunk by the whole step's spreads (no term picked from the breakdown)",
    )
    how.add_argument(
        "--no-shrink",
        action="store_true",
        help="calibrate on all of the anchor's miss (step_scale = its measured over predicted), as before shrinkage",
    )
    args = ap.parse_args(argv)
    rows = pe.load_rows()
    pe.price(rows)
    params = out_of_sample(rows)
    how = "whole" if args.no_shrink else "scale" if args.scale_only else "terms"
    results = one_shot(rows, params, recentre=not args.keep_centre, how=how)
    cells = table(results)
    print(
        f"{'engine/family':34} {'runs':>4} {'grp':>3} {'median':>7} {'p90':>7} {'signed':>7} {'band':>5} "
        f"{'width':>6}   {'uncal. median':>13} {'signed':>7}"
    )
    for key, s in cells.items():
        print(
            f"{key:34} {s['n']:4d} {s['groups']:3d} {s['median']:7.1%} {s['p90']:7.1%} {s['signed_median']:+7.1%} "
            f"{s['coverage']:5.0%} {s['width']:6.2f}   {s['uncalibrated_median']:13.1%} "
            f"{s['uncalibrated_signed']:+7.1%}"
        )
    band = "published-run band with its centre" if args.keep_centre else "published-run band without its centre"
    if results:
        anchors = {r["anchor"]: r for r in results}.values()
        w = float(np.median([r["taken"] for r in anchors]))
        picked: dict[str, int] = {}
        for r in anchors:
            for t in r["terms"] or ["step_scale"]:
                picked[t] = picked.get(t, 0) + 1
        fitted = ", ".join(f"{k} {n}" for k, n in sorted(picked.items(), key=lambda kv: -kv[1]))
        print(
            f"\nshrinkage: the calibration takes {w:.2f} of the anchor's log miss (median over groups; 1 = all); "
            f"fitted, groups: {fitted}"
        )
    print(
        f"\none run per group calibrated (the median GPU count), the group's other runs predicted; band: the {band}, "
        "fitted without the run's source, around the calibrated prediction; width: p90 - p10 over the prediction"
    )
    if args.json:
        args.json.write_text(json.dumps({"cells": cells, "runs": results}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
