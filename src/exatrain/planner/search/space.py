"""The configuration space: every (tp, pp, dp, micro-batch, ZeRO, recompute, SP, schedule, ep, cp) of a
job, as numpy arrays, with the reason each illegal candidate was rejected.

Expert parallelism is searched for mixture-of-experts models only (ep among the divisors of the
experts; the rules refuse those that do not fit the ranks the runtime lets ep take: dp, or tp*cp*dp
where it folds ep over them, as Megatron-Core does, ``rules.ep_fits``), context parallelism for
sequences of 8,192 tokens or more (cp among the powers of two that divide seq_len/2, up to 64 and the
GPU count), for every runtime: for exatrain's own trainer the rules of scope "trainer" then drop the
ep and cp layouts it does not run (ep wider than dp, ep with ZeRO-1/2/3, cp with a mixture-of-experts
model, either with zero bubble).
``SpaceOptions.ep`` / ``cp`` pin or widen them; ``SpaceOptions.settings``: one set of run settings for every
candidate.

Rejection is a value, not an exception: the search reports how many candidates each constraint
removed (divisibility, topology, pipeline depth, schedule, memory) and can say which killed the most.
The constraints are ``exatrain.rules`` — the ones ``Plan.validate`` and the trainer apply — evaluated
over the whole grid at once; a candidate is counted under the first reason it fails.
Equivalent spellings (a schedule choice with pp = 1, ZeRO stages with dp = 1, sequence parallelism
with tp = 1) are collapsed to one canonical candidate and counted apart from rejections.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from exatrain import rules
from exatrain.accounting.engines import get_engine
from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.models import ModelSpec
from exatrain.settings import (
    FP8_PARAM_GATHER_RUNTIMES,
    OFFLOAD_RUNTIMES,
    RECOMPUTE,
    SCHEDULES,
)
from exatrain.run_settings import RunSettings, holds_settings

# Schedule variants searched: (name, interleave). interleave = virtual stages per rank.
SCHEDULE_VARIANTS: tuple[tuple[str, int], ...] = (
    ("gpipe", 1),
    ("1f1b", 1),
    ("interleaved", 2),
    ("interleaved", 3),
    ("interleaved", 4),
    ("zero_bubble", 2),
    ("zero_bubble", 4),
    ("zbh1", 1),
    ("zbv", 2),
    ("dualpipev", 2),
)

PLAN_REASONS = tuple(r.reason for r in rules.RULES if r.scope == "plan")
# Only when the candidates are for exatrain's own trainer (runtime "exatrain"): the layouts it refuses
# to run. (Its "run"-scope rules concern --compile, which the search does not choose.)
TRAINER_LAYOUT_REASONS = tuple(r.reason for r in rules.RULES if r.scope == "trainer")
RUNTIME_REASON = "ZeRO stage the runtime does not offer"
FP8_GATHER_REASON = "ZeRO stage below the one --fp8-param-gather needs"  # settings.FP8_PARAM_GATHER_RUNTIMES
OFFLOAD_REASON = "ZeRO stage (or dp) the runtime's --offload does not run at"  # settings.offload_problem


RECOMPUTE_LAYERS_AUTO = -1  # SpaceOptions.recompute_layers: fit each full-recomputation candidate's own


@holds_settings
@dataclass(frozen=True)
class SpaceOptions:
    """What to search over. ``None`` means "every legal value"."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    micro_batch: tuple[int, ...] | None = None
    zero_stage: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = RECOMPUTE
    sequence_parallel: tuple[bool, ...] = (False, True)
    schedules: tuple[tuple[str, int], ...] = SCHEDULE_VARIANTS
    ep: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    # Every candidate's run settings (settings.SETTINGS; their runtime is the search's, not this one), readable and
    # given by name (SpaceOptions(fp8="current"): holds_settings). recompute_layers RECOMPUTE_LAYERS_AUTO: the
    # fewest layers each full-recomputation candidate needs to fit (search.batch.fit_recompute_layers)
    settings: RunSettings = RunSettings()


@dataclass
class Space:
    """Legal, canonical candidates as parallel arrays, plus rejection counts."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    micro_batch: np.ndarray
    zero: np.ndarray
    recompute: np.ndarray  # index into RECOMPUTE
    sp: np.ndarray  # bool
    variant: np.ndarray  # index into options.schedules
    num_microbatches: np.ndarray
    options: SpaceOptions
    ep: np.ndarray | None = None
    cp: np.ndarray | None = None
    examined: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    collapsed: int = 0

    def __post_init__(self) -> None:
        for name in ("ep", "cp"):
            if getattr(self, name) is None:
                setattr(self, name, np.ones(self.tp.shape, dtype=np.int64))

    def __len__(self) -> int:
        return int(self.tp.size)


LONG_CONTEXT = 8192  # sequences from this length on get context-parallel candidates
MAX_CP = 64


def ep_candidates(model: ModelSpec) -> list[int]:
    """Expert-parallel degrees searched, for every runtime: the divisors of the experts (1 for a dense
    model). Those a runtime cannot run are the rules' to drop (``rules.ep_fits``; exatrain: ep wider
    than dp, ep with ZeRO-1/2/3)."""
    if not model.is_moe:
        return [1]
    return [k for k in range(1, model.experts + 1) if model.experts % k == 0]


def cp_candidates(model: ModelSpec, gpus: int) -> list[int]:
    """Context-parallel degrees searched, for every runtime: powers of two dividing seq_len/2 (two
    chunks per rank), up to MAX_CP and the GPU count, for sequences of LONG_CONTEXT tokens or more;
    else 1. Those a runtime cannot run are the rules' to drop (exatrain: cp with a MoE model)."""
    if model.seq_len < LONG_CONTEXT:
        return [1]
    out, k = [], 1
    while k <= min(MAX_CP, gpus) and (model.seq_len // 2) % k == 0:
        out.append(k)
        k *= 2
    return out


def _divisors(n: int, limit: int) -> list[int]:
    return [k for k in range(1, min(n, limit) + 1) if n % k == 0]


def _grid(model: ModelSpec, cluster: ClusterSpec, gpus: int, options: SpaceOptions) -> dict[str, np.ndarray]:
    """Every combination of the degrees, micro-batch sizes, ZeRO stages, recomputation, SP and schedules the
    options allow (each unpinned one from its default range), as flat arrays: tp, pp, mb, zero, rec (RECOMPUTE
    index), sp, var (the schedule variant), ep, cp, v (its interleave), sched (its name), code (SCHEDULES index)."""
    L = model.layers
    tps = list(options.tp) if options.tp else _divisors(gpus, 4 * cluster.gpus_per_node)
    if options.settings.distribute_saved_activations:  # its checkpoints split over the tp ranks: tp > 1 only
        tps = [t for t in tps if t > 1]
    pps = list(options.pp) if options.pp else _divisors(gpus, 2 * L)
    mbs = list(options.micro_batch) if options.micro_batch else [1, 2, 4, 8, 16, 32]
    variants = list(options.schedules)
    eps = list(options.ep) if options.ep else ep_candidates(model)
    cps = list(options.cp) if options.cp else cp_candidates(model, gpus)
    grid = np.meshgrid(
        np.array(tps),
        np.array(pps),
        np.array(mbs),
        np.array(options.zero_stage),
        np.arange(len(options.recompute)),
        np.array(options.sequence_parallel, dtype=bool),
        np.arange(len(variants)),
        np.array(eps),
        np.array(cps),
        indexing="ij",
    )
    tp, pp, mb, zero, rec, sp, var, ep, cp = (g.ravel() for g in grid)
    rec = np.array([RECOMPUTE.index(options.recompute[i]) for i in range(len(options.recompute))])[rec]
    v = np.array([iv for _, iv in variants])[var]
    sched = np.array([s for s, _ in variants])[var]
    code = np.array([SCHEDULES.index(s) for s, _ in variants])[var]
    return dict(tp=tp, pp=pp, mb=mb, zero=zero, rec=rec, sp=sp, var=var, ep=ep, cp=cp, v=v, sched=sched, code=code)


def _setting_masks(zero: np.ndarray, dpcp: np.ndarray, options: SpaceOptions, runtime: str, dtype: str) -> dict:
    """Layouts whose ZeRO stage the runtime does not offer, or offer with the options' FP8 gather or offload
    (``dpcp``: dp x cp of each)."""
    offered = get_engine(runtime).with_grad_accum(options.grad_accum).zero_stages(dtype)
    masks = {RUNTIME_REASON: ~np.isin(zero, offered)}
    if options.fp8_param_gather:  # the plan-level conditions (--fp8, the runtime) are rules.extension_problem's
        masks[FP8_GATHER_REASON] = zero < FP8_PARAM_GATHER_RUNTIMES.get(runtime, 0)
    if options.offload != "none":  # the stages each runtime offloads at (exatrain's FSDP2: only over dp x cp > 1)
        masks[OFFLOAD_REASON] = ~np.isin(zero, OFFLOAD_RUNTIMES[options.offload].get(runtime, ())) | (
            (runtime == "exatrain") & (dpcp < 2)
        )
    return masks


def enumerate_space(
    model: ModelSpec,
    cluster: ClusterSpec,
    gpus: int,
    global_batch: int,
    options: SpaceOptions = SpaceOptions(),
    runtime: str = "exatrain",
    dtype: str = "bfloat16",
) -> Space:
    """Every candidate of the grid, filtered to the legal canonical ones (arrays), with the ZeRO
    stages ``runtime`` offers (RUNTIME_REASON counts the others). With ``runtime`` "exatrain" also
    without the combinations exatrain's trainer refuses (TRAINER_LAYOUT_REASONS, each counted apart).
    Tensor parallelism wider than a node is priced (on the network) but searched only when pinned
    (``options.tp``): it is never faster per byte than tp inside a node, and leaving it out keeps
    the space small."""
    g = _grid(model, cluster, gpus, options)
    tp, pp, mb, zero, rec, sp, var, ep, cp = (g[k] for k in ("tp", "pp", "mb", "zero", "rec", "sp", "var", "ep", "cp"))
    v, sched, code = g["v"], g["sched"], g["code"]
    examined = tp.size

    # Canonical spellings: pp == 1 runs no schedule (keep 1f1b, v 1); tp == 1 has no SP; dp*cp == 1 no ZeRO.
    ranks = np.maximum(tp * pp * cp, 1)
    dp = np.where(gpus % ranks == 0, gpus // ranks, 0)
    redundant = ((pp == 1) & ~((sched == "1f1b") & (v == 1))) | ((tp == 1) & sp) | ((dp * cp == 1) & (zero != 0))
    keep = ~redundant
    collapsed = int(redundant.sum())

    scopes = ("plan", "trainer") if runtime == "exatrain" else ("plan",)
    if not options.tp:
        scopes += ("search",)
    shared = rules.Shared(model, cluster=cluster, settings=options.settings.replace(runtime=runtime))
    x = rules.rule_inputs(
        shared,
        tp=tp,
        pp=pp,
        gpus=gpus,
        micro_batch=mb,
        global_batch=global_batch,
        zero_stage=zero,
        recompute=rec,
        sequence_parallel=sp,
        schedule=code,
        interleave=v,
        ep=ep,
        cp=cp,
    )
    masks = {**rules.broken(x, scopes=scopes), **_setting_masks(zero, dp * cp, options, runtime, dtype)}
    rejected, alive = rules.first_reasons(masks, keep)
    m = np.where(dp > 0, x.num_microbatches, 0)
    idx = np.nonzero(alive)[0]
    return Space(
        tp=tp[idx],
        pp=pp[idx],
        dp=dp[idx],
        micro_batch=mb[idx],
        zero=zero[idx],
        recompute=rec[idx],
        sp=sp[idx],
        variant=var[idx],
        num_microbatches=m[idx],
        options=options,
        examined=int(examined),
        rejected=rejected,
        collapsed=collapsed,
        ep=ep[idx],
        cp=cp[idx],
    )
