"""Fitting the cost model's free factors: to micro-benchmarks of a machine, and to real runs.

Both fits minimise the log-error of predicted against measured time (so a 10% miss counts the same
on a 1 ms GEMM and a 10 s step), over the logarithms of the factors so every factor stays positive,
with small solvers written here (numpy only): Nelder-Mead on the absolute log-error for the
micro-benchmarks (robust to a few disturbed timings), Levenberg-Marquardt on the squared log-error
for runs (each evaluation is a full step-time prediction per run, so few evaluations matter).

* ``calibration_from_bench``: GEMM points -> peak (CPU: the fitted asymptote; accelerators: the
  catalog's) and gemm_eff, gemm_dim_half; per-kernel overhead as training pays it ->
  gemm_overhead_s; the trainer's own layers at negligible size -> op_overhead_s (the kernels
  they really launch, spread over those the model counts); the loop's fixed per-step work ->
  step_overhead_s; attention
  points -> attn_eff; element-wise kernels -> mem_bytes_per_s (best streaming copy), mem_eff
  (the bandwidth a layer's mix of norms, residual additions and activation reaches);
  collectives -> one measured link tier (latency, bandwidth) for the local cluster. The raw points
  and the efficiency-vs-size curves go into the file too.
* ``fit_runs``: RunRecords of one cluster and engine -> a small set of factors shared by all of them
  (never one per run, ``run_factors``): one run fits one term of the cost model, two runs two (``fit_terms``: the
  terms that carry the most of the runs' prior uncertainty, their GEMM, attention, element-wise, communication or
  overhead seconds, each pulled to its prior by the spread published clusters show, ``cost.shrinkage``: every
  other factor stays at its prior; without those spreads step_scale alone, the measured over the predicted step
  time shrunk the same way); from three gemm_eff, step_overhead_s, mem_eff, attn_eff, link_eff, op_overhead_s in
  that order of priority, about one per two runs.
* ``held_out_band``: where those runs land when each is predicted by the factors fitted to the others
  (leave one run out): the p10-p90 of measured / predicted that an estimate calibrated on them carries,
  from ``MIN_BAND_RUNS`` runs up (below that the published-run band holds).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from exatrain.catalog.hardware import ClusterSpec, LinkTier
from exatrain.errors import UserError
from exatrain.plan import Plan
from exatrain.planner.cost import shrinkage
from exatrain.planner.cost.coefficients import Calibration, CostParams
from exatrain.planner.cost.fitting import error_stats, levenberg_marquardt, nelder_mead
from exatrain.planner.cost.fitting import robust_log_error as _robust

RUN_FACTORS = ("gemm_eff", "step_overhead_s", "mem_eff", "attn_eff", "link_eff", "op_overhead_s")
SCALE_FACTOR = "step_scale"  # CostParams.step_scale: the whole step's measured over predicted
MIN_BAND_RUNS = 4  # held-out runs from which a calibration measures its own band


def run_factors(n: int) -> tuple[str, ...]:
    """The factors ``n`` runs of one cluster and engine fit: from one or two a shrunk fit (``fit_terms``: which terms
    the runs' own breakdown picks; step_scale where no term spreads are shipped), from three the physical factors,
    which scale the parts apart (step_scale beside them would make them unidentifiable): gemm_eff from 3 runs,
    + step_overhead_s from 4, + mem_eff from 6, + attn_eff from 8, + link_eff from 10, + op_overhead_s from 12 (one
    per two runs)."""
    if n <= shrinkage.SHRUNK_RUNS:
        return (SCALE_FACTOR,)
    return RUN_FACTORS[: max(1, min(len(RUN_FACTORS), n // 2))]


_STEPS = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0}


def fit_gemm(points: Sequence[dict], catalog_peak: float | None, overhead_s: float | None = None) -> dict:
    """t = 2mnk / (P * prod d/(d + half)) + c, P = peak * gemm_eff (cost.compute), fitted to bare
    GEMM calls (c: the bare call's fixed time). The cost model's gemm_overhead_s is what a GEMM
    costs beyond its arithmetic inside training (autograd, module and dispatch), measured
    separately (``overhead`` points) when given, else c."""
    if not points:
        raise UserError("no GEMM measurements to fit")
    dims = np.array([[p["m"], p["n"], p["k"]] for p in points], dtype=float)
    t = np.array([p["seconds"] for p in points], dtype=float)
    flops = 2.0 * dims.prod(axis=1)
    best = float(np.max(flops / t))

    def unpack(x: np.ndarray) -> tuple[float, float, float]:
        return math.exp(x[0]), min(max(math.exp(x[1]), 0.5), 4096.0), min(max(math.exp(x[2]), 1e-8), 1e-2)

    def model(x: np.ndarray) -> np.ndarray:
        P, half, c = unpack(x)
        return flops / (P * np.prod(dims / (dims + half), axis=1)) + c

    x, _ = nelder_mead(lambda x: _robust(model(x), t), [math.log(best * 1.2), math.log(16.0), math.log(2e-6)])
    P, half, c = unpack(x)
    peak = catalog_peak or max(P, best)
    curve = [
        {
            "m": int(a),
            "n": int(b),
            "k": int(k),
            "measured_tflops": float(f / s / 1e12),
            "model_tflops": float(f / mt / 1e12),
        }
        for (a, b, k), f, s, mt in zip(dims, flops, t, model(x))
    ]
    return {
        "peak_flops": None if catalog_peak else peak,
        "gemm_eff": P / peak,
        "gemm_dim_half": half,
        "gemm_overhead_s": max(c, overhead_s) if overhead_s is not None else c,
        "_peak": peak,
        "_bare_call_s": c,
        "curve": curve,
    }


# The most of the peak attention's counted FLOPs can run at: they are the full count (cost.compute), of which a
# causal kernel computes about half (the masked half of the scores and values products is skipped).
ATTN_EFF_MAX = 2.0


def fit_attention(points: Sequence[dict], peak: float) -> dict:
    """attn_eff, attn_seq_half and attn_call_overhead_s (``cost.compute.flash_attention_s``) from causal
    SDPA forward + backward timings: ``flops`` counted as the cost model counts them (3.5 x the
    full-count forward), ``seconds``, and the shape (batch, heads, seq, head_dim).

    With at least three points, two sequence lengths and two FLOP counts among them, all three are
    fitted (least squares on the log time, from the summed rate, a 1000-token half and 10 us). The
    curve must stay inside what the points show: a half-point beyond the longest measured sequence
    (the rate still rising at the last point, its asymptote an extrapolation) or an asymptote above
    ATTN_EFF_MAX is refused, and the rate and call time are fitted alone (the half-point 0: the rate
    at longer sequences is the measured one). With fewer points, attn_eff alone: the points' FLOPs
    over their seconds, summed (so the larger, more representative cases weigh most), over peak, the
    other two 0. attn_eff never exceeds ATTN_EFF_MAX. ``curve``: each point's efficiency (counted
    FLOPs / seconds / peak), measured and modelled; ``note``: what was refused, if anything."""
    if not points:
        return {}
    flops = np.array([p["flops"] for p in points], dtype=float)
    t = np.array([p["seconds"] for p in points], dtype=float)
    seq = np.array([p["seq"] for p in points], dtype=float)
    total = float(flops.sum() / t.sum() / peak)
    eff, s_half, call = total, 0.0, 0.0
    note = ""

    def model(e: float, sh: float, c: float) -> np.ndarray:
        return flops / (peak * e * seq / (seq + sh)) + c

    if len(points) >= 3 and np.unique(seq).size >= 2 and np.unique(flops).size >= 2:
        with np.errstate(over="ignore"):  # a trial step far out is an infinite cost, refused by the solver
            x, _ = levenberg_marquardt(
                lambda x: np.log(model(*np.exp(x)) / t), [math.log(total), math.log(1000.0), math.log(1e-5)]
            )
        eff, s_half, call = (float(v) for v in np.exp(x))
        if s_half > seq.max() or eff > ATTN_EFF_MAX:
            note = (
                f"the rate's fitted half-point {s_half:.0f} tokens (asymptote {eff:.1%} of peak) lies beyond the "
                f"measured {seq.min():.0f}-{seq.max():.0f} tokens: fitted without a half-point"
            )
            x, _ = levenberg_marquardt(
                lambda x: np.log(model(math.exp(x[0]), 0.0, math.exp(x[1])) / t), [math.log(total), math.log(1e-5)]
            )
            eff, s_half, call = float(math.exp(x[0])), 0.0, float(math.exp(x[1]))
    if eff > ATTN_EFF_MAX:
        note = (note + "; " if note else "") + f"attn_eff {eff:.3g} clamped to {ATTN_EFF_MAX:g}"
        eff = ATTN_EFF_MAX
    modelled = flops / model(eff, s_half, call) / peak
    curve = [
        {
            "seq": p["seq"],
            "batch": p["batch"],
            "heads": p["heads"],
            "head_dim": p["head_dim"],
            "efficiency": float(f / s / peak),
            "model_efficiency": float(me),
        }
        for p, f, s, me in zip(points, flops, t, modelled)
    ]
    return {"attn_eff": eff, "attn_seq_half": s_half, "attn_call_overhead_s": call, "curve": curve, "note": note}


def fit_fp8(points: Sequence[dict]) -> dict:
    """fp8_speedup: the training dtype's GEMM seconds over the FP8 GEMM seconds of the same shapes,
    summed (``bench.micro.fp8_gemm_points``; the larger shapes weigh most). {} without points."""
    if not points:
        return {}
    return {"fp8_speedup": float(sum(p["seconds_16"] for p in points) / sum(p["seconds_fp8"] for p in points))}


def fit_flash2(points: Sequence[dict]) -> dict:
    """fa2_attn_ratio: the default SDPA backend's seconds over FlashAttention-2's at the same shape
    (``bench.micro.flash2_points``): FA2's rate relative to the kernel the attention fit describes
    (1 where the default is FA2 itself, as on torch before 2.11). {} without points."""
    if not points:
        return {}
    return {"fa2_attn_ratio": float(sum(p["seconds_default"] for p in points) / sum(p["seconds_fa2"] for p in points))}


# Element-wise bytes (read + written) per token of a GPT layer's forward, by kernel: two norms (4h),
# two residual additions (6h), the MLP activation (8h with ffn = 4h). The bandwidth the cost model
# uses for element-wise work is this mix's: some kernels stream at copy speed, others (GELU's
# transcendentals, on a CPU) are compute-bound.
LAYER_MIX = {"layer_norm": 4.0, "add": 6.0, "gelu": 8.0}


def fit_memory(points: Sequence[dict], overhead_s: float | None = None) -> dict:
    """mem_bytes_per_s: the best copy bandwidth; mem_eff: the bandwidth a transformer layer's mix
    of element-wise kernels reaches (``LAYER_MIX``, each kernel's bytes/s at sizes where its fixed
    cost is negligible) relative to it; op_overhead_s: the fixed cost per kernel at small sizes
    (the measured training-path overhead when given)."""
    if not points:
        return {}
    copies = [p["bytes"] / p["seconds"] for p in points if p["kernel"] == "copy"]
    bw = max(copies) if copies else max(p["bytes"] / p["seconds"] for p in points)
    largest = max(p["elements"] for p in points)
    big = [p for p in points if p["elements"] * 64 >= largest]  # the upper sizes: bandwidth-bound
    per_kernel = {}
    for name in LAYER_MIX:
        rates = [p["bytes"] / p["seconds"] for p in big if p["kernel"] == name]
        if rates:
            per_kernel[name] = float(np.median(rates))
    if per_kernel:
        w = {k: LAYER_MIX[k] for k in per_kernel}
        mix_bw = sum(w.values()) / sum(w[k] / per_kernel[k] for k in w)
    else:
        mix_bw = float(np.median([p["bytes"] / p["seconds"] for p in big]))
    eff = min(mix_bw / bw, 2.0)
    if overhead_s is None:
        small = [p for p in points if p["elements"] * 64 < largest]
        over = float(np.median([max(p["seconds"] - p["bytes"] / (bw * eff), 1e-8) for p in small])) if small else 5e-6
    else:
        over = overhead_s
    curve = [
        {
            "kernel": p["kernel"],
            "bytes": p["bytes"],
            "measured_bytes_per_s": p["bytes"] / p["seconds"],
            "model_bytes_per_s": float(p["bytes"] / (p["bytes"] / (bw * eff) + over)),
        }
        for p in points
    ]
    return {
        "mem_bytes_per_s": bw,
        "mem_eff": eff,
        "op_overhead_s": over,
        "curve": curve,
        "layer_mix_bytes_per_s": per_kernel,
    }


def fit_layer_overhead(points: Sequence[dict], params: CostParams, peak: float) -> dict:
    """op_overhead_s such that the cost model's time of each measured layer (``layer_points``:
    arithmetic negligible) equals the measurement: the framework's cost of the kernels the layer
    really launches, spread over the element-wise kernels the cost model counts (cost.compute);
    the geometric mean over the layers measured (GPT and Llama launch different numbers)."""
    from exatrain.catalog.models import ModelSpec
    from exatrain.planner.cost.compute import Device, dense_layer_times

    if not points:
        return {}
    per, curve = [], []
    for p in points:
        m = ModelSpec.from_dict(p["model"], source="bench layer")

        def model_s(over: float) -> float:
            dev = Device(
                peak_flops=peak,
                mem_bytes_per_s=params.mem_bytes_per_s or 1e10,
                params=params.replace(op_overhead_s=over),
            )
            lt = dense_layer_times(
                m, p["micro_batch"], 1, flash=True, recompute="none", sequence_parallel=False, dtype="float32", dev=dev
            )
            return float(lt.fwd + lt.bwd)

        base, slope = model_s(0.0), (model_s(1e-6) - model_s(0.0)) / 1e-6
        over = max((p["seconds"] - base) / slope, 1e-7)
        per.append(over)
        curve.append({"arch": m.arch, "seconds": p["seconds"], "op_overhead_s": over})
    return {"op_overhead_s": float(np.exp(np.mean(np.log(per)))), "curve": curve}


def _overheads(points: Sequence[dict]) -> tuple[float | None, float | None, float | None]:
    per = {p["kind"]: p["seconds"] / p["calls"] for p in points}
    return per.get("gemm"), per.get("elementwise"), per.get("step")


def fit_link(points: Sequence[dict], name: str = "measured") -> tuple[LinkTier | None, list[dict]]:
    """One tier from collectives over n ranks, ring model (cost.network): all-reduce
    2(n-1) latencies + 2(n-1)/n of the buffer over the link; all-gather / reduce-scatter half that;
    send/recv one latency + the buffer."""
    if not points:
        return None, []
    steps, frac, t = [], [], []
    for p in points:
        n, size = p["ranks"], p["bytes"]
        if p["kind"] == "send_recv":
            steps.append(1.0)
            frac.append(float(size))
        else:
            s = _STEPS[p["kind"]]
            steps.append(s * (n - 1))
            frac.append(s * (n - 1) / n * size)
        t.append(p["seconds"])
    steps_a, frac_a, t_a = (np.asarray(v, dtype=float) for v in (steps, frac, t))

    def model(x: np.ndarray) -> np.ndarray:
        lat, bw = np.exp(x)
        return steps_a * lat + frac_a / bw

    best_bw = float(np.max(frac_a / t_a))
    x, _ = nelder_mead(lambda x: _robust(model(x), t_a), [math.log(2e-5), math.log(best_bw)])
    lat, bw = (float(v) for v in np.exp(x))
    if bw > 2.0 * best_bw:
        # Too few bandwidth-bound points to pin the slope (e.g. --quick): no link outruns twice the
        # best throughput seen; the latency is what remains of each measurement.
        bw = 2.0 * best_bw
        lat = float(max(np.median((t_a - frac_a / bw) / steps_a), 0.0))
        x = np.log([max(lat, 1e-12), bw])
    curve = [
        {
            "kind": p["kind"],
            "bytes": p["bytes"],
            "ranks": p["ranks"],
            "seconds": p["seconds"],
            "model_seconds": float(mt),
        }
        for p, mt in zip(points, model(x))
    ]
    return LinkTier(name=name, span=0, bytes_per_s=bw, latency_s=lat), curve


def fit_framework(points: Sequence[dict], params: CostParams, cluster: ClusterSpec) -> tuple[dict, list[dict]]:
    """The framework-overhead parameters from bench.framework's tiny trainer steps: each step's
    time beyond what the cost model (with every other parameter already fitted) predicts for it,
    per layer (the slope between two depths) and per step (what is left at the shallow depth)."""
    from exatrain.plan import Plan
    from exatrain.planner.plan_cost import step_time

    resid: dict[tuple[str, int], tuple[float, Plan]] = {}
    curve = []
    for p in points:
        plan = Plan.from_dict(p["plan"], source="bench framework point")
        predicted = step_time(plan, cluster, params)[0].step
        resid[(p["case"], plan.model.layers)] = (p["seconds"] - predicted, plan)
        curve.append(
            {"case": p["case"], "layers": plan.model.layers, "seconds": p["seconds"], "model_seconds_before": predicted}
        )

    def slope_and_rest(case: str) -> tuple[float, float, int] | None:
        depths = sorted(d for c, d in resid if c == case)
        if len(depths) < 2:
            return None
        (r0, plan0), (r1, _) = resid[(case, depths[0])], resid[(case, depths[-1])]
        per_stage_layers = (depths[-1] - depths[0]) / plan0.pp
        # Micro-batch slots on the critical path: m on one stage, m + pp - 1 through a pipeline.
        m = plan0.num_microbatches + (plan0.pp - 1 if plan0.pp > 1 else 0)
        slope = (r1 - r0) / (per_stage_layers * m)  # per layer and micro-batch, on one rank
        return slope, r0 - slope * depths[0] / plan0.pp * m, m

    found: dict[str, float] = {}
    base = slope_and_rest("dp")
    if base is not None:
        found["dp_step_overhead_s"] = max(0.0, base[1])
        for case, key in (("tp", "tp_layer_overhead_s"), ("fsdp", "fsdp_layer_overhead_s")):
            got = slope_and_rest(case)
            if got is not None:
                found[key] = max(0.0, got[0] - base[0])
        got = slope_and_rest("pp")
        if got is not None:  # what each micro-batch adds per stage beyond the layers
            found["pp_microbatch_overhead_s"] = max(0.0, got[1] / got[2])
    return found, curve


def calibration_from_bench(
    raw: dict, *, device_name: str, base: CostParams, catalog_peak: float | None, cluster: ClusterSpec | None
) -> Calibration:
    """A calibration file's contents from ``exatrain bench``'s raw measurements."""
    gemm_over, op_over, step_over = _overheads(raw.get("overhead", []))
    gemm = fit_gemm(raw["gemm"], catalog_peak, gemm_over)
    peak = gemm.pop("_peak")
    gemm.pop("_bare_call_s")
    attention = fit_attention(raw.get("attention", []), peak)
    memory = fit_memory(raw.get("bandwidth", []), op_over)
    fields = {k: v for k, v in gemm.items() if k != "curve"}
    fields.update({k: v for k, v in attention.items() if k not in ("curve", "note")})
    fields.update(fit_fp8(raw.get("fp8_gemm", [])))
    fields.update(fit_flash2(raw.get("attention_fa2", [])))
    fields.update({k: v for k, v in memory.items() if k not in ("curve", "layer_mix_bytes_per_s")})
    layer = fit_layer_overhead(raw.get("layers", []), base.replace(**fields), peak)
    fields.update({k: v for k, v in layer.items() if k != "curve"})
    if step_over is not None:
        fields["step_overhead_s"] = step_over  # zero_grad + gradient norm + AdamW's per-tensor work
    cores = raw.get("machine", {}).get("cores")
    if device_name == "cpu" and cores:
        fields["cores_per_node"] = int(cores)  # ranks beyond this share cores
    tiers = {}
    framework = [p for p in raw.get("collectives", []) if p.get("kind") == "framework"]
    tier, link_curve = fit_link(
        [p for p in raw.get("collectives", []) if p.get("kind") != "framework"],
        name="loopback" if device_name == "cpu" else "local",
    )
    if tier is not None and cluster is not None:
        if device_name == "cpu" or len(cluster.tiers) == 1:
            tiers[cluster.name] = (tier,)
        else:  # a node's GPUs measured: the intra-node tier, the catalog's network beyond it
            inner = dataclasses.replace(tier, span=max(2, int(raw.get("ranks", 2))))
            tiers[cluster.name] = (inner, *[t for t in cluster.tiers if t.span == 0 or t.span > inner.span])
        fields["link_eff"] = 1.0  # the tier's bandwidth is what the collectives achieved
        if len(tiers[cluster.name]) == 1:  # the measured tier is the network itself: no catalog rate left
            fields["net_eff"] = None
    params = base.replace(**fields, source=f"exatrain bench ({raw.get('machine', {}).get('host', 'this machine')})")
    framework_curve: list[dict] = []
    if framework and cluster is not None:
        measured_cluster = dataclasses.replace(cluster, tiers=tiers[cluster.name]) if cluster.name in tiers else cluster
        found, framework_curve = fit_framework(framework, params, measured_cluster)
        params = params.replace(**found)
    extra = {
        "bench": {
            "machine": raw.get("machine", {}),
            "options": raw.get("options", {}),
            "load": raw.get("load"),
            "notes": [n for n in (attention.get("note"),) if n],
            "curves": {
                "gemm": gemm["curve"],
                "attention": attention.get("curve", []),
                "memory": memory.get("curve", []),
                "layers": layer.get("curve", []),
                "collectives": link_curve,
                "framework": framework_curve,
            },
            "raw": {k: raw.get(k, []) for k in ("gemm", "attention", "bandwidth", "overhead", "layers", "collectives")},
        }
    }
    return Calibration(devices={device_name: params}, cluster_tiers=tiers, extra=extra)


# ---- runs -> shared factors ------------------------------------------------------------------------
@dataclass(frozen=True)
class RunPoint:
    """One run to fit: its plan, the cluster it ran on (measured tiers applied) and its step time."""

    plan: Plan
    cluster: ClusterSpec
    measured_s: float
    name: str = ""
    overlap: str | None = "all"  # the overlaps the run had on, as `estimate --overlap` names them (None: defaults)


def predict_runs(points: Sequence[RunPoint], params: CostParams) -> np.ndarray:
    from exatrain.planner.plan_cost import step_time

    return np.array([step_time(p.plan, p.cluster, params, p.overlap)[0].step for p in points])


@dataclass(frozen=True)
class RunFit:
    params: CostParams
    factors: tuple[str, ...]
    before: dict[str, float]
    after: dict[str, float]
    predicted_before: tuple[float, ...]
    predicted_after: tuple[float, ...]
    terms: tuple[str, ...] = ()  # a shrunk fit's terms (cost.shrinkage.FIT_TERMS), in the order they were picked
    taken: float | None = None  # a shrunk fit: the share of the runs' mean log miss it removed


def _run_fit(points, fitted, factors, before, measured, **kw) -> RunFit:
    """A RunFit of ``fitted``: the runs' step-time errors before and after."""
    after = predict_runs(points, fitted)
    return RunFit(
        params=fitted,
        factors=factors,
        before=error_stats(before, measured),
        after=error_stats(after, measured),
        predicted_before=tuple(before.tolist()),
        predicted_after=tuple(after.tolist()),
        **kw,
    )


def fit_terms(points: Sequence[RunPoint], base: CostParams, prior: shrinkage.TermPrior, max_iter: int = 20) -> RunFit:
    """One term of the cost model per run (``cost.shrinkage``): the terms whose prior spread times the runs' share
    of them (sum over the runs of sigma_k^2 g_k^2) is largest, fitted by Levenberg-Marquardt to the runs' log step
    times, each log factor pulled to 0 by its sigma, the runs' own miss and the other terms' prior variance on them
    counted as the noise (their covariance: within^2 + the others' sigma^2 g g'). One run that is mostly GEMM moves
    gemm_eff; mostly communication, link_eff and net_eff; the rest stay at the prior."""
    measured = np.array([p.measured_s for p in points])
    before = predict_runs(points, base)
    g = shrinkage.shares(lambda q: predict_runs(points, q), base)
    var = prior.variances()
    carried = (g**2).sum(axis=0) * var
    picked = [int(k) for k in np.argsort(-carried, kind="stable") if carried[k] > 0][: len(points)]
    names = tuple(shrinkage.TERM_NAMES[k] for k in picked)
    rest = [k for k in range(var.size) if k not in picked]
    noise = (prior.within**2 + 1e-12) * np.eye(len(points)) + (g[:, rest] * var[rest]) @ g[:, rest].T
    whiten = np.linalg.inv(np.linalg.cholesky(noise))
    sd = np.sqrt(var[picked])
    log_measured = np.log(measured)

    def params_at(x: np.ndarray) -> CostParams:
        p = base
        for name, v in zip(names, x):
            p = shrinkage.scaled(p, name, float(v))
        return p

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.concatenate([whiten @ (np.log(predict_runs(points, params_at(x))) - log_measured), x / sd])

    x = levenberg_marquardt(residuals, np.zeros(len(names)), max_iter=max_iter)[0] if names else np.zeros(0)
    fitted = params_at(x).replace(source=f"exatrain calibrate ({len(points)} runs)")
    miss = float(np.mean(log_measured - np.log(before)))
    moved = float(np.mean(np.log(predict_runs(points, fitted)) - np.log(before)))
    factors = tuple(f for name in names for f in shrinkage.fields_of(name, base))
    taken = moved / miss if abs(miss) > 1e-12 else 0.0
    return _run_fit(points, fitted, factors, before, measured, terms=names, taken=taken)


def fit_runs(
    points: Sequence[RunPoint], base: CostParams, factors: Sequence[str] | None = None, max_iter: int = 40
) -> RunFit:
    """Fit a few factors shared by all ``points`` (one cluster and engine) to their measured step times
    (``factors``: default ``run_factors``). One or two runs by default: one term of the cost model per run
    (``fit_terms``) where the shipped shrinkage has term spreads, else step_scale alone, the geometric mean of
    measured / predicted raised to the shrinkage weight of that many runs (``cost.shrinkage``: the part of their
    miss their cluster shares)."""
    if not points:
        raise UserError("no runs with a measured step time to fit")
    measured = np.array([p.measured_s for p in points])
    shrink = shrinkage.current()
    if factors is None and len(points) <= shrinkage.SHRUNK_RUNS and shrink is not None and shrink.terms is not None:
        return fit_terms(points, base, shrink.terms)
    factors = tuple(factors or run_factors(len(points)))
    before = predict_runs(points, base)
    if factors == (SCALE_FACTOR,):
        # the cluster's share of the runs' mean miss, the rest their own (cost.shrinkage)
        weight = shrink.weight(len(points)) if shrink is not None else 1.0
        scale = base.step_scale * float(np.exp(weight * np.mean(np.log(measured / before))))
        fitted = base.replace(step_scale=scale, source=f"exatrain calibrate ({len(points)} runs)")
        return _run_fit(points, fitted, factors, before, measured, taken=weight)
    x0 = np.log([max(getattr(base, f), 1e-9) for f in factors])

    def params_at(x: np.ndarray) -> CostParams:
        vals = {f: float(v) for f, v in zip(factors, np.exp(x))}
        for f in ("gemm_eff", "attn_eff", "mem_eff", "link_eff"):
            if f in vals:
                vals[f] = min(vals[f], 4.0)  # beyond this the peak itself is wrong; keep the search sane
        return base.replace(**vals)

    log_measured = np.log(measured)

    def residuals(x: np.ndarray) -> np.ndarray:
        pred = predict_runs(points, params_at(x))
        # A light pull towards the starting point keeps factors the runs cannot see where they were.
        return np.concatenate([(np.log(pred) - log_measured) / math.sqrt(len(points)), 1e-3 * (x - x0)])

    x, _ = levenberg_marquardt(residuals, x0, max_iter=max_iter)
    fitted = params_at(x).replace(source=f"exatrain calibrate ({len(points)} runs)")
    return _run_fit(points, fitted, factors, before, measured)


def held_out_band(
    points: Sequence[RunPoint], base: CostParams, max_iter: int = 10
) -> tuple[float, float, tuple[float, ...]] | None:
    """(p10, p90, every ratio) of measured / predicted over ``points``, each run predicted by the factors
    (``run_factors`` of the others' count) fitted to the other runs from ``base``; None below MIN_BAND_RUNS runs."""
    if len(points) < MIN_BAND_RUNS:
        return None
    ratios = []
    for i, p in enumerate(points):
        fit = fit_runs([q for j, q in enumerate(points) if j != i], base, max_iter=max_iter)
        ratios.append(p.measured_s / float(predict_runs([p], fit.params)[0]))
    low, high = (float(np.percentile(ratios, q)) for q in (10, 90))
    return low, high, tuple(ratios)


__all__ = [
    "MIN_BAND_RUNS",
    "RUN_FACTORS",
    "RunFit",
    "RunPoint",
    "SCALE_FACTOR",
    "calibration_from_bench",
    "error_stats",
    "fit_attention",
    "fit_flash2",
    "fit_fp8",
    "fit_gemm",
    "fit_link",
    "fit_memory",
    "fit_runs",
    "fit_terms",
    "held_out_band",
    "levenberg_marquardt",
    "nelder_mead",
    "predict_runs",
    "run_factors",
]
