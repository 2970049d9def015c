"""The whole run at a token budget: steps, wall-clock days, GPU-hours, energy and cost of a plan.

A plan's estimate predicts one optimizer step (``step_s``) and where it is likely to land (the band,
``planner/band.py``: ``step_range_s``). A run of ``tokens`` tokens takes

    steps      = ceil(tokens / (global_batch · seq_len))        (the last step trains a whole batch)
    wall_s     = steps · step_s                                   (no checkpoints, evaluation, restarts, queueing)
    gpu_hours  = gpus · wall_s / 3600
    energy_MWh = gpus · tdp_watts · power_overhead · wall_s / 3.6e9   (1 MWh = 3.6e9 J)
    cost       = gpu_hours · gpu_hour_price

and each figure's low and high are the same formula at the band's ``step_range_s``. Energy prices every GPU at
the catalog's ``tdp_watts`` for the whole run: an upper bound for the GPUs themselves (a training step does not
hold every device at its maximum power throughout). ``power_overhead`` (default 1.0: the GPUs alone) multiplies
it for what the GPUs' figure leaves out: the hosts' CPUs, memory, NICs and switches, and the facility's cooling
(its PUE); docs/planning.md gives published system figures to choose it from.

With a budget, ``time_to_train`` also carries ``goodput`` (planner/goodput.py): the checkpoint, its save and load,
the checkpoint interval, the expected interruptions and the work they lose, and the wall-clock days, GPU-hours,
energy and cost with them; ``search --rank-by`` days, gpu_hours and cost order by those.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation, localcontext
from typing import Any, NamedTuple

from exatrain.catalog.hardware import ClusterSpec, DeviceSpec
from exatrain.errors import UserError
from exatrain.plan import Plan
from exatrain.planner.goodput import GoodputOptions, goodput, goodput_options

MAX_TOKENS = 10**18  # far above any corpus (15T = 1.5e13); bounds the integer a string like "1e999999" would build
SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12, "P": 10**15}
RANK_BY = ("throughput", "days", "gpu_hours", "cost")  # what `search --rank-by` orders layouts by
SECONDS_PER_DAY = 86_400
JOULES_PER_MWH = 3.6e9
TOKENS_HELP = "a whole number of tokens such as 300000000000, 300e9, 1.5e12, 300B or 15T"


def parse_tokens(value: Any) -> int:
    """A token budget as a whole positive number: an int, an integral float (300e9), or a string with an
    optional K / M / B (or G) / T / P suffix ("15T", "300B", "1.5e12"); anything else a one-line UserError."""
    if isinstance(value, bool):
        raise UserError(f"--tokens must be {TOKENS_HELP}, got {value!r}")
    text = str(value).strip().replace("_", "")
    scale = SUFFIXES.get(text[-1:].upper(), 1) if text else 1
    number = text[:-1] if scale != 1 else text
    try:
        given = Decimal(number)
    except InvalidOperation:
        raise UserError(f"--tokens must be {TOKENS_HELP}, got {value!r}") from None
    with localcontext() as ctx:
        ctx.prec = 80  # exact for every value up to MAX_TOKENS, however many digits the string has after its point
        exact = given * scale if given.is_finite() and abs(given.adjusted()) < 40 else given
    if not exact.is_finite() or exact <= 0 or exact > MAX_TOKENS:
        raise UserError(f"--tokens must be {TOKENS_HELP}, above 0 and at most 1e18, got {value!r}")
    if exact != exact.to_integral_value():
        raise UserError(f"--tokens must be a whole number of tokens, got {value!r}")
    return int(exact)


def _nonneg(flag: str, value: Any, least: float = 0.0) -> float:
    """``value`` as a finite float of at least ``least``, else a one-line UserError."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    if isinstance(value, bool) or not math.isfinite(x) or x < least:
        raise UserError(f"{flag} must be a finite number of at least {least:g}, got {value!r}")
    return x


class RunOptions(NamedTuple):
    """The whole run's options, checked (``run_options``)."""

    tokens: int
    gpu_hour_price: float | None = None
    power_overhead: float = 1.0
    goodput: GoodputOptions = GoodputOptions()


def run_options(
    tokens: Any,
    gpu_hour_price: Any = None,
    power_overhead: Any = None,
    rank_by: str = "throughput",
    node_mtbf_hours: Any = None,
    checkpoint_bandwidth: Any = None,
    restart_minutes: Any = None,
) -> RunOptions | None:
    """The run's options checked, or None without a token budget; a one-line UserError for a bad value, for a
    price, overhead or failure flag without a budget, and for a ranking that needs what was not given."""
    if rank_by not in RANK_BY:
        raise UserError(f"--rank-by must be one of {', '.join(RANK_BY)}, got {rank_by!r}")
    if tokens is None:
        for flag, v in (
            ("--gpu-hour-price", gpu_hour_price),
            ("--power-overhead", power_overhead),
            ("--node-mtbf-hours", node_mtbf_hours),
            ("--checkpoint-bandwidth", checkpoint_bandwidth),
            ("--restart-minutes", restart_minutes),
        ):
            if v is not None:
                raise UserError(f"{flag} needs --tokens (the run's token budget)")
        if rank_by != "throughput":
            raise UserError(f"--rank-by {rank_by} needs --tokens (the run's token budget)")
        return None
    price = None if gpu_hour_price is None else _nonneg("--gpu-hour-price", gpu_hour_price)
    if rank_by == "cost" and price is None:
        raise UserError("--rank-by cost needs --gpu-hour-price")
    overhead = 1.0 if power_overhead is None else _nonneg("--power-overhead", power_overhead, least=1.0)
    failures = goodput_options(node_mtbf_hours, checkpoint_bandwidth, restart_minutes)
    return RunOptions(parse_tokens(tokens), price, overhead, failures)


@dataclass(frozen=True)
class Figure:
    """One figure of the run: the value at the predicted step time, and at the band's low and high."""

    value: float
    low: float | None
    high: float | None

    def to_dict(self) -> dict[str, float | None]:
        return {"value": self.value, "low": self.low, "high": self.high}


def _figure(per_step_s: float, step_range_s: tuple[float, float] | None, step_s: float) -> Figure:
    """``per_step_s`` (a figure at the predicted step time) with its value at each end of the band."""
    if step_range_s is None:
        return Figure(per_step_s, None, None)
    return Figure(per_step_s, per_step_s * step_range_s[0] / step_s, per_step_s * step_range_s[1] / step_s)


def time_to_train(
    plan: Plan, device: DeviceSpec, tokens: int, gpu_hour_price: float | None = None, power_overhead: float = 1.0
) -> dict[str, Any] | None:
    """The ``time_to_train`` object of ``plan`` (with its estimate) on ``device`` for ``tokens`` tokens (the
    module doc's formulas), or None where the estimate has no step time."""
    est = plan.estimate
    if est is None or est.time_s is None:
        return None
    step_s, band = est.time_s.step, est.step_range_s
    steps = -(-tokens // plan.tokens_per_step)  # ceil, in integers
    wall_s = steps * step_s
    tdp = device.tdp_watts
    energy = None if tdp is None else _figure(plan.gpus * tdp * power_overhead * wall_s / JOULES_PER_MWH, band, step_s)
    gpu_hours = _figure(plan.gpus * wall_s / 3600, band, step_s)
    cost = None if gpu_hour_price is None else _figure(gpu_hours.value * gpu_hour_price, band, step_s)
    power = (
        f"every GPU at its TDP, {tdp:g} W, throughout (an upper bound), "
        + (
            "the GPUs alone: hosts, network and cooling excluded"
            if power_overhead == 1.0
            else f"× {power_overhead:g} for hosts, network and cooling"
        )
        + " (--power-overhead)"
        if tdp is not None
        else f"none: device {device.name!r} has no tdp_watts"
    )
    return {
        "tokens": tokens,
        "tokens_per_step": plan.tokens_per_step,
        "steps": steps,
        "tokens_trained": steps * plan.tokens_per_step,
        "gpus": plan.gpus,
        "step_s": step_s,
        "days": _figure(wall_s / SECONDS_PER_DAY, band, step_s).to_dict(),
        "gpu_hours": gpu_hours.to_dict(),
        "energy_mwh": None if energy is None else energy.to_dict(),
        "cost": None if cost is None else cost.to_dict(),
        "tdp_watts": tdp,
        "power_overhead": power_overhead,
        "gpu_hour_price": gpu_hour_price,
        "power": power,
        "band": None if band is None else (est.band or {}).get("text"),
        "excludes": "checkpointing, evaluation, restarts and queueing",
    }


def with_time_to_train(plan: Plan, cluster: ClusterSpec, options: tuple | None) -> Plan:
    """``plan`` with its estimate carrying ``time_to_train`` for ``options`` (``run_options``; None: unchanged) on
    ``cluster``, its ``goodput`` included (planner/goodput.py)."""
    if options is None or plan.estimate is None:
        return plan
    run = RunOptions(*options)
    ttt = time_to_train(plan, cluster.device, run.tokens, run.gpu_hour_price, run.power_overhead)
    if ttt is None:
        return plan
    ttt = {
        **ttt,
        "excludes": "evaluation and queueing (checkpoints and restarts: goodput)",
        "goodput": goodput(plan, cluster, ttt, run.goodput),
    }
    return plan.with_estimate(plan.estimate.replace(time_to_train=ttt))


def rank_key(plan: Plan, rank_by: str) -> float:
    """What ``rank_by`` orders ``plan`` by, smallest first (throughput: the negated tokens/s; days, gpu_hours and
    cost: the figure with failures, ``goodput``, where the plan carries it; a plan without the figure last, as is
    one whose run never finishes)."""
    est = plan.estimate
    if est is None:
        return math.inf
    if rank_by == "throughput":
        return -(est.tokens_per_s or 0.0)
    ttt = est.time_to_train or {}
    figure = (ttt["goodput"] if "goodput" in ttt else ttt).get(rank_by)
    return math.inf if figure is None else figure["value"]


def _fraction(plan: Plan) -> float | None:
    """The goodput fraction ``plan`` carries (None without one): a search's layouts share it where they share the
    GPU count, the engine and the checkpoint."""
    g = ((plan.estimate.time_to_train or {}) if plan.estimate is not None else {}).get("goodput")
    return None if g is None else round(g["fraction"], 12)


def rank(plans: list[Plan], rank_by: str) -> tuple[list[Plan], str | None]:
    """``plans`` (each with its ``time_to_train``) in ``rank_by`` order, stable, and a line saying how that order
    relates to throughput's (None for throughput itself). One search holds the GPU count and the global batch, so
    every layout runs the same steps on the same GPUs and days, GPU-hours, energy and cost are each the step time
    times one constant: their order is throughput's, and the line says so; it says otherwise where they differ."""
    if rank_by == "throughput":
        return plans, None
    ranked = sorted(plans, key=lambda p: rank_key(p, rank_by))
    runs = {
        (p.gpus, (p.estimate.time_to_train or {}).get("steps"), _fraction(p)) for p in plans if p.estimate is not None
    }
    same = [id(p) for p in ranked] == [id(p) for p in sorted(plans, key=lambda p: rank_key(p, "throughput"))]
    if len(runs) == 1 and same:
        ((gpus, steps, _),) = runs
        return ranked, (
            f"ranked by {rank_by}: every layout runs {steps:,} steps on {gpus:,} GPUs, so {rank_by} is "
            "the step time times one constant and the order is throughput's"
        )
    return ranked, (
        f"ranked by {rank_by}: the layouts differ in GPU count, steps or checkpoint, "
        + ("yet the order is throughput's" if same else "so the order differs from throughput's")
    )


# The command options of estimate, search and scaling that price the whole run (the CLI adds them as given here).
RUN_FLAGS = {
    "--tokens": (
        "N",
        "the run's token budget (e.g. 15T, 300B, 300e9): adds its steps, days, GPU-hours and energy "
        "(each with the step time's band) as time_to_train",
    ),
    "--gpu-hour-price": ("P", "with --tokens: the price of one GPU-hour, to add the run's cost (in its currency)"),
    "--power-overhead": (
        "F",
        "with --tokens: energy multiplier over the GPUs at TDP for the hosts (CPUs, memory, "
        "NICs, switches) and cooling (PUE); default 1.0, the GPUs alone",
    ),
    "--node-mtbf-hours": (
        "H",
        "with --tokens: a node's mean time between failures in hours, for the expected "
        "interruptions (default 6,334.5: Llama 3 405B's 419 in 54 days on 2,048 nodes)",
    ),
    "--checkpoint-bandwidth": (
        "GBPS",
        "with --tokens: the file system's aggregate write (and read) rate in GB/s "
        "for the checkpoint's save and load (default: the cluster's file system)",
    ),
    "--restart-minutes": (
        "M",
        "with --tokens: minutes from an interruption to the job running again, before it "
        "loads its checkpoint (default 11)",
    ),
}
RANK_BY_HELP = (
    "throughput (default), or with --tokens: days, gpu_hours or cost (--gpu-hour-price), each with "
    "checkpoints and interruptions (goodput); on one GPU count and batch these order as throughput does, "
    "and the output says so"
)

__all__ = [
    "MAX_TOKENS",
    "RANK_BY",
    "RANK_BY_HELP",
    "RUN_FLAGS",
    "Figure",
    "RunOptions",
    "parse_tokens",
    "rank",
    "rank_key",
    "run_options",
    "time_to_train",
    "with_time_to_train",
]
