"""Search: enumerate every legal layout, prune by memory, rank by predicted throughput.

The whole space is evaluated in one vectorised pass (search.batch, through ``planner.evaluate``:
every stage's memory, the cost model's step time); the best are returned with ``estimate_plan``
attached, which runs the same code on each as a batch of one, so what the user sees is what the
search ranked by and what ``exatrain estimate`` says for that plan.

Memory prunes by the three-way verdict (planner/memory_band.py): a layout that "does not fit" (the device's
capacity below its band of measured peaks) is dropped; a "tight" one (capacity inside the band) is kept and ranked,
its plan's estimate saying so (``memory_verdict``), unless ``strict_memory`` drops it too. The counts say which.
Kept layouts rank by throughput, except that a tight one whose point prediction exceeds the device's capacity (more
likely than not to run out of memory, by the model's own estimate) ranks after every layout predicted within it.
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass, field

import numpy as np

from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.models import ModelSpec
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.settings import OFFLOAD_RUNTIMES, OFFLOADS, RECOMPUTE
from exatrain.units import GiB
from exatrain.planner.cost.coefficients import CostParams, default_params
from exatrain.planner.estimate import estimate_plan
from exatrain.planner.memory_band import allowance_of, layout_ratios, verdict_codes
from exatrain.planner.search import batch
from exatrain.planner.search.space import Space, SpaceOptions, enumerate_space


@dataclass
class SearchResult:
    ranked: list[Plan]  # best first, each with its estimate attached
    examined: int
    legal: int
    feasible: int
    rejected: dict[str, int] = field(default_factory=dict)
    collapsed: int = 0
    min_memory_bytes: float | None = None  # the leanest legal layout's worst stage
    notes: tuple[str, ...] = ()  # what the caller chose for the search (api.search: a default runtime)
    tight: int = 0  # legal layouts whose capacity lies inside their memory band (kept, unless strict_memory)
    strict_memory: bool = False  # whether the tight ones were dropped
    # the fastest kept layout whose verdict is "fits" and its rank among the kept (1 = the winner); None where none
    # fits outright. A user whose winner is tight reads here what fitting outright would cost.
    best_fitting: Plan | None = None
    best_fitting_rank: int = 0

    def why_empty(self, capacity_bytes: float) -> str:
        """One sentence on what left no feasible layout."""
        if self.legal and not self.feasible:
            why = (
                "do not fit or are tight (dropped by --strict-memory)"
                if self.strict_memory and self.tight
                else "do not fit in memory"
            )
            return (
                f"all {self.legal:,} legal layouts {why} (the leanest needs "
                f"{self.min_memory_bytes / GiB:,.1f} GiB per device of {capacity_bytes / GiB:,.0f})"
            )
        reason = self.top_reason
        if reason is None:
            return "nothing to examine"
        return f"no legal layout: {reason[0]!r} removed the most candidates ({reason[1]:,} of {self.examined:,})"

    @property
    def top_reason(self) -> tuple[str, int] | None:
        """The constraint that removed the most candidates."""
        if not self.rejected:
            return None
        name = max(self.rejected, key=lambda k: self.rejected[k])
        return (name, self.rejected[name]) if self.rejected[name] else None


def plan_at(
    space: Space,
    i: int,
    model: ModelSpec,
    global_batch: int,
    cluster: ClusterSpec,
    dtype: str,
    flash: bool,
    recompute_layers: int | None = None,
) -> Plan:
    sched, v = space.options.schedules[space.variant[i]]
    pp = int(space.pp[i])
    return Plan(
        model=model,
        dims=ParallelDims(int(space.tp[i]), pp, int(space.dp[i]), ep=int(space.ep[i]), cp=int(space.cp[i])),
        shape=TrainShape(int(space.micro_batch[i]), global_batch),
        zero_stage=int(space.zero[i]),
        recompute=RECOMPUTE[space.recompute[i]],
        sequence_parallel=bool(space.sp[i]),
        schedule=sched if pp > 1 else "1f1b",
        interleave=v if pp > 1 else 1,
        dtype=dtype,
        flash_attention=flash,
        cluster=cluster.name,
        settings=space.options.settings.replace(
            recompute_layers=(max(space.options.recompute_layers, 0) if recompute_layers is None else recompute_layers)
        ),
    )


def search(
    model: ModelSpec,
    cluster: ClusterSpec,
    gpus: int,
    global_batch: int,
    *,
    top: int = 10,
    options: SpaceOptions = SpaceOptions(),
    params: CostParams | None = None,
    dtype: str = "bfloat16",
    flash: bool = True,
    runtime: str = "exatrain",
    overlap: str | None = None,
    strict_memory: bool = False,
) -> SearchResult:
    """Rank every legal layout as run by ``runtime`` (an engine of ``accounting.engines``): its memory
    decides what fits (exatrain: its own trainer as it runs today, accounting.trainer_memory), its
    overlaps (those ``overlap`` turns on) and collectives the step time, and only its ZeRO stages
    are candidates. A layout that does not fit is dropped, a tight one kept (``strict_memory``: dropped too;
    the module doc). Where none fits and ``options`` offload nothing, the runtime's offloads are searched in turn
    (``with_offload``)."""
    result = _search(
        model,
        cluster,
        gpus,
        global_batch,
        top=top,
        options=options,
        params=params,
        dtype=dtype,
        flash=flash,
        runtime=runtime,
        overlap=overlap,
        strict_memory=strict_memory,
    )
    return with_offload(
        result,
        lambda o: _search(
            model,
            cluster,
            gpus,
            global_batch,
            top=top,
            options=o,
            params=params,
            dtype=dtype,
            flash=flash,
            runtime=runtime,
            overlap=overlap,
            strict_memory=strict_memory,
        ),
        options,
        runtime,
        cluster,
    )


def with_offload(
    result: SearchResult, again, options: SpaceOptions, runtime: str, cluster: ClusterSpec
) -> SearchResult:
    """``result``, or, where its legal layouts all failed to fit, ``options`` offloaded nothing and ``cluster``
    states its host memory, the first search ``again(options)`` with an offload ``runtime`` runs (optimizer states
    first, then the parameters too: settings.OFFLOAD_RUNTIMES) that finds layouts that fit, with a note saying
    so. Offloading is offered only when nothing else fits: it trades the host link and the CPU's Adam for memory."""
    if result.feasible or not result.legal or options.offload != "none" or cluster.host_memory_bytes is None:
        return result
    for value in (v for v in OFFLOADS if runtime in OFFLOAD_RUNTIMES.get(v, {})):
        found = again(dataclasses.replace(options, offload=value))
        if found.feasible:
            note = (
                f"no layout fits without offload ({result.why_empty(cluster.device.hbm_bytes)}): these keep "
                f"{'the optimizer states' if value == 'optimizer' else 'the sharded parameters and optimizer'} "
                f"in host memory (--offload {value}), priced with the host link and the CPU's Adam"
            )
            return dataclasses.replace(found, notes=(*found.notes, note))
    return result


def _memory_bands(space, first: Plan, cluster: ClusterSpec) -> tuple[np.ndarray, np.ndarray]:
    """Each candidate's memory band (low, high ratios of measured to predicted peaks) from what varies across
    the space: ZeRO stage, recomputation, cp, ep; ``first``: the space's first layout as a plan."""
    return layout_ratios(
        first,
        cluster,
        zero=space.zero,
        recompute=np.asarray(RECOMPUTE)[space.recompute],
        cp=space.cp,
        ep=space.ep,
    )


def _kept(codes: np.ndarray, rejected: dict[str, int], strict_memory: bool) -> tuple[np.ndarray, np.ndarray]:
    """(kept, tight) of the verdict codes (0 fits, 1 tight, 2 does not fit); counts what is dropped in
    ``rejected``: what does not fit, and with --strict-memory what is tight."""
    tight = codes == 1
    rejected["does not fit"] = int((codes == 2).sum())
    if strict_memory:
        rejected["tight (--strict-memory)"] = int(tight.sum())
    return (codes == 0 if strict_memory else codes < 2), tight


def _best_fitting(codes: np.ndarray, order: np.ndarray, ranked: list[Plan], estimated) -> tuple[Plan | None, int]:
    """(plan, rank) of the fastest kept layout that fits outright ((None, 0) for none), estimated only if it is
    not already among the ``ranked``."""
    fitting = np.nonzero(codes[order] == 0)[0]
    best_rank = int(fitting[0]) + 1 if fitting.size else 0
    best = (
        None
        if not best_rank
        else ranked[best_rank - 1]
        if best_rank <= len(ranked)
        else estimated(int(order[best_rank - 1]))
    )
    return best, best_rank


def _search(
    model: ModelSpec,
    cluster: ClusterSpec,
    gpus: int,
    global_batch: int,
    *,
    top: int,
    options: SpaceOptions,
    params: CostParams | None,
    dtype: str,
    flash: bool,
    runtime: str,
    overlap: str,
    strict_memory: bool,
) -> SearchResult:
    """One search over ``options`` as they are (``search``)."""
    coeffs = params or default_params(cluster.device.name)
    space = enumerate_space(model, cluster, gpus, global_batch, options, runtime=runtime, dtype=dtype)
    rejected = dict(space.rejected)
    if len(space) == 0:
        return SearchResult([], space.examined, 0, 0, rejected, space.collapsed, strict_memory=strict_memory)
    # each candidate's memory band (what varies across the space: ZeRO stage, recomputation, cp, ep)
    first = plan_at(space, 0, model, global_batch, cluster, dtype, flash).replace(runtime=runtime)
    low, high = _memory_bands(space, first, cluster)
    capacity = cluster.device.hbm_bytes
    allowance = allowance_of(runtime)
    # time every layout that may be kept: capacity at least the band's low end of its allocated part (tight) or
    # above the whole band (--strict-memory)
    res = batch.evaluate_space(
        space,
        model,
        cluster,
        global_batch,
        coeffs,
        dtype=dtype,
        flash=flash,
        runtime=runtime,
        time_if_fits=True,
        overlap=overlap,
        fit_bytes=capacity / float(high.min()) if strict_memory else capacity * (1 + allowance) / float(low.min()),
        recompute_limit_bytes=capacity / float(high.max()) if strict_memory else None,
    )
    codes = verdict_codes(res.memory_total, capacity, low, high, allowance=allowance)
    if res.host_fits is not None:  # offloaded states that a node's host memory does not hold: does not fit
        codes = np.where(res.host_fits, codes, 2)
    keep, tight = _kept(codes, rejected, strict_memory)
    feasible = np.nonzero(keep)[0]
    # a tight layout whose point prediction is above the capacity ranks after every one predicted within it
    over = res.memory_total[feasible] > capacity
    order = feasible[np.lexsort((-res.tokens_per_s[feasible], over))]

    def estimated(i: int) -> Plan:
        plan = plan_at(
            space,
            i,
            model,
            global_batch,
            cluster,
            dtype,
            flash,
            None if res.recompute_layers is None else int(res.recompute_layers[i]),
        )
        plan = plan.replace(runtime=runtime).validate(cluster)
        return plan.with_estimate(estimate_plan(plan, cluster, coeffs, overlap))

    ranked = [estimated(int(i)) for i in order[: max(top, 0)]]
    best, best_rank = _best_fitting(codes, order, ranked, estimated)
    return SearchResult(
        ranked,
        space.examined,
        len(space),
        int(keep.sum()),
        rejected,
        space.collapsed,
        float(res.memory_total.min()),
        tight=int(tight.sum()),
        strict_memory=strict_memory,
        best_fitting=best,
        best_fitting_rank=best_rank,
    )
