"""What a layout must satisfy to run: one list of rules, each with its refusal reason.

Every rule is written once, as a numpy predicate over layouts given as arrays. ``Plan.validate``
evaluates them on the plan (a batch of one) and raises for the first broken one, with a message that
names the problem and its fix; the search evaluates them over its whole grid at once and counts each
rejected candidate under the first reason it fails (``RULES`` order); exatrain's trainer refuses what
the rules marked ``"trainer"`` name (``TrainConfig.check``). A run setting's own rule is its record's
(``settings.SETTINGS``), which ``extension_problem`` runs. Torch-free: the trainer imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from exatrain.catalog.hardware import ClusterSpec
from exatrain.errors import PlanError
from exatrain.layout_arrays import POSITIVE_FIELDS, RuleInputs, Shared, plan_rule_inputs, rule_inputs
from exatrain.limits import beyond, too_large
from exatrain.settings import (
    DTYPES,
    RECOMPUTE,
    RUNTIMES,
    SCHEDULE_RUNTIMES,
    SCHEDULES,
    SETTINGS,
    SPLIT_BACKWARD,
    V_SCHEDULES,
    cp_comm_for,
    cp_comm_problem,
    heads_not_split,
)

_INTERLEAVED = (SCHEDULES.index("interleaved"), SCHEDULES.index("zero_bubble"))
_PLAIN = (SCHEDULES.index("gpipe"), SCHEDULES.index("1f1b"), SCHEDULES.index("zbh1"))
_V = tuple(SCHEDULES.index(s) for s in V_SCHEDULES)
_SPLIT = tuple(SCHEDULES.index(s) for s in SPLIT_BACKWARD)


class RuleError(PlanError):
    """A layout that breaks a rule; ``reason`` is the rule's reason (as the search counts it)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


# Runtimes that fold expert parallelism over the tp*cp*dp ranks of a pipeline stage, with experts not
# split over tp (expert-tensor-parallel size 1):
#   megatron-core  "MoE parallel folding" (Megatron-Core MoE README; megatron/core/parallel_state.py
#                  initialize_model_parallel: the expert layers' ranks are an etp x ep x edp x pp grid of
#                  the same world, which must divide by etp*ep*pp): with etp 1, ep any divisor of tp*cp*dp;
#   torchtitan     ep inside dp as before, or its expert-tensor-parallel-1 layout, where ep takes all of
#                  tp and cp: tp*cp divides ep, ep divides tp*cp*dp (torchtitan/distributed/
#                  parallel_dims.py, ParallelDims._validate with etp 1).
# megatron-deepspeed keeps ep inside dp (DeepSpeed deepspeed/utils/groups.py: expert-parallel groups
# are carved out of the data-parallel group), and so does exatrain's own trainer (trainer/parallel/
# mesh.py; a rule of scope "trainer" refuses a wider ep in any plan it is handed).
FOLDING_RUNTIMES = ("megatron-core",)


def ep_fits(runtime: str, ep, *, tp, cp, dp) -> np.ndarray:
    """Whether an ep group fits the ranks ``runtime`` lets it take (see FOLDING_RUNTIMES): ep | dp for
    every runtime; ep | tp*cp*dp for the folding ones; for torchtitan also tp*cp | ep | tp*cp*dp."""
    ep, tp, cp, dp = (np.maximum(np.asarray(a, dtype=np.int64), 1) for a in (ep, tp, cp, dp))
    inside = dp % ep == 0
    folded = (tp * cp * dp) % ep == 0
    if runtime in FOLDING_RUNTIMES:
        return inside | folded
    if runtime == "torchtitan":
        return inside | (folded & (ep % (tp * cp) == 0))
    return inside


@dataclass(frozen=True)
class Rule:
    """``broken(layout)`` marks the layouts that break the rule; ``message(plan, cluster)`` is the one
    line a user reads for a plan that breaks it. ``scope``: "plan" (every runtime), "trainer" (a
    layout exatrain's trainer refuses), "run" (a trainer option with the layout: ``--compile``),
    "search" (legal, but left out of an unpinned search)."""

    reason: str
    broken: Callable[[RuleInputs], np.ndarray]
    message: Callable[[Any, ClusterSpec | None], str]
    scope: str = "plan"


def _divisors(n: int) -> str:
    return ", ".join(str(k) for k in range(1, n + 1) if n % k == 0 and k <= 64)


def _positive_message(p, cluster) -> str:
    for flag, attr in POSITIVE_FIELDS:
        value = getattr(p, attr)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            return f"--{flag} must be a positive integer, got {value!r}"
        if beyond(value):
            return str(too_large(f"--{flag}", value))
    return "degrees and batch sizes must be positive integers"


def _choice_message(p, cluster) -> str:
    if p.zero_stage not in (0, 1, 2, 3):
        return f"--zero must be 0, 1, 2 or 3, got {p.zero_stage!r}"
    if p.recompute not in RECOMPUTE:
        return f"--recompute must be one of {', '.join(RECOMPUTE)}, got {p.recompute!r}"
    if p.schedule not in SCHEDULES:
        return f"--schedule must be one of {', '.join(SCHEDULES)}, got {p.schedule!r}"
    return f"--dtype must be one of {', '.join(DTYPES)}, got {p.dtype!r}"


def _tp_message(p, cluster) -> str:
    m, tp = p.model, p.tp
    if m.heads % tp:
        return f"heads {m.heads} of {m.name} are not divisible by tp {tp}; choose tp among {_divisors(m.heads)}"
    if m.kv_heads % tp:
        return (
            f"kv_heads {m.kv_heads} of {m.name} are not divisible by tp {tp}; choose tp among {_divisors(m.kv_heads)}"
        )
    if m.ffn_hidden % tp:
        return f"ffn_hidden {m.ffn_hidden} of {m.name} is not divisible by tp {tp}"
    return f"vocab {m.vocab} of {m.name} is not divisible by tp {tp}; pad the vocabulary (e.g. to a multiple of 128*tp)"


def _split_message(p, cluster) -> str:
    if len(p.stage_layers) != p.virtual_stages:
        return (
            f"stage_layers has {len(p.stage_layers)} entries but the plan has {p.virtual_stages} virtual "
            "stages (pp x interleave)"
        )
    if any((not isinstance(n, int)) or n <= 0 for n in p.stage_layers):
        return "every entry of stage_layers must be a positive integer"
    return f"stage_layers sums to {sum(p.stage_layers)} but {p.model.name} has {p.model.layers} layers"


def _split_broken(x: RuleInputs) -> np.ndarray:
    s = x.stage_layers
    if not s:
        return np.zeros(x.tp.shape, dtype=bool)
    bad = any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0 for n in s)
    return (len(s) != x.pp * x.interleave) | bad | (sum(int(n) for n in s) != x.model.layers)


def _schedules_run(runtime: str) -> list[int]:
    """The SCHEDULES indices ``runtime`` runs (settings.SCHEDULE_RUNTIMES; every one for a runtime it does not list)."""
    known = any(runtime in r for r in SCHEDULE_RUNTIMES.values())
    return [SCHEDULES.index(s) for s, r in SCHEDULE_RUNTIMES.items() if runtime in r or not known]


def _on(cond: bool, shape) -> np.ndarray:
    return np.full(shape, bool(cond))


def _d(a: np.ndarray) -> np.ndarray:
    """A divisor that is never 0 (a degree that is not positive is the first rule's to report)."""
    return np.maximum(a, 1)


# The one list, in the order a layout's first problem is reported (and the search counts it).
RULES: tuple[Rule, ...] = (
    Rule(
        "a degree or batch size is not a positive integer",
        lambda x: (
            x.malformed
            | (x.tp <= 0)
            | (x.pp <= 0)
            | (x.dp <= 0)
            | (x.micro_batch <= 0)
            | (x.global_batch <= 0)
            | (x.interleave <= 0)
            | (x.ep <= 0)
            | (x.cp <= 0)
        ),
        _positive_message,
    ),
    Rule(
        "not a ZeRO stage, recompute mode, schedule or dtype",
        lambda x: (
            (x.zero_stage < 0)
            | (x.zero_stage > 3)
            | (x.recompute < 0)
            | (x.schedule < 0)
            | _on(not x.dtype_ok, x.tp.shape)
        ),
        _choice_message,
    ),
    Rule(
        "tp does not divide heads / kv heads / ffn / vocab",
        lambda x: (
            (x.model.heads % _d(x.tp) != 0)
            | (x.model.kv_heads % _d(x.tp) != 0)
            | (x.model.ffn_hidden % _d(x.tp) != 0)
            | (x.model.vocab % _d(x.tp) != 0)
        ),
        _tp_message,
    ),
    Rule(
        "gpus not divisible by tp*pp",
        lambda x: _on(False, x.tp.shape) if x.gpus is None else x.gpus % _d(x.tp * x.pp) != 0,
        lambda p, c: f"--gpus {p.gpus} is not divisible by tp*pp = {p.tp}*{p.pp} = {p.tp * p.pp}",
    ),
    Rule(
        "gpus not divisible by tp*cp*pp",
        lambda x: _on(False, x.tp.shape) if x.gpus is None else x.gpus % _d(x.tp * x.cp * x.pp) != 0,
        lambda p, c: f"--gpus {p.gpus} is not divisible by tp*cp*pp = {p.tp}*{p.cp}*{p.pp} = {p.tp * p.cp * p.pp}",
    ),
    Rule(
        "ep without experts, or ep does not divide experts / dp",
        lambda x: (
            ((x.ep > 1) & _on(not x.model.is_moe, x.tp.shape))
            | (_on(x.model.is_moe, x.tp.shape) & (max(x.model.experts, 1) % _d(x.ep) != 0))
            | ~ep_fits(x.runtime, x.ep, tp=x.tp, cp=x.cp, dp=x.dp)
        ),
        lambda p, c: (expert_problem(p) or ("ep", f"--ep {p.ep} does not fit"))[1],
    ),
    # Megatron-LM (megatron/training/arguments.py) requires sequence parallelism for MoE with tp > 1;
    # an ep group wider than dp takes tp ranks, each dispatching its own s/tp tokens, which only
    # sequence parallelism gives it (without, every tp rank would route the same tokens).
    Rule(
        "ep wider than dp with tp > 1 and no sequence parallelism",
        lambda x: (x.ep > 1) & (x.dp % _d(x.ep) != 0) & (x.tp > 1) & ~x.sequence_parallel,
        lambda p, c: (
            f"--ep {p.ep} is wider than dp {p.dp}, so its groups take tensor-parallel ranks: that "
            "needs --sequence-parallel (each tp rank dispatches its own tokens)"
        ),
    ),
    Rule(
        "cp does not split the sequence into 2*cp chunks",
        lambda x: (x.cp > 1) & (x.model.seq_len % _d(2 * x.cp) != 0),
        lambda p, c: (extension_problem(p) or ("cp", f"--cp {p.cp} does not fit"))[1],
    ),
    # How the runtime exchanges attention's operands under cp (settings.CP_COMM_RUNTIMES, settings.cp_comm_for): one it
    # offers, that runs the model's sliding windows, and under a2a heads a rank holds that divide by cp.
    Rule(
        "cp exchange the runtime does not run for this layout",
        lambda x: (
            (x.cp > 1)
            & (_on(cp_comm_problem(x.cp_comm, x.runtime, x.model) is not None, x.tp.shape) | _a2a_heads_broken(x))
        ),
        lambda p, c: (extension_problem(p) or ("cp_comm", f"--cp {p.cp} does not fit"))[1],
    ),
    Rule(
        "global batch not divisible by micro-batch*dp",
        lambda x: x.global_batch % _d(x.micro_batch * x.dp) != 0,
        lambda p, c: (
            f"global batch {p.global_batch} is not divisible by micro-batch x dp = {p.micro_batch} x "
            f"{p.dp}; use a multiple of {p.micro_batch * p.dp}"
        ),
    ),
    Rule(
        "interleaved schedule with fewer than 2 virtual stages per rank",
        lambda x: np.isin(x.schedule, _INTERLEAVED) & (x.pp > 1) & (x.interleave < 2),
        lambda p, c: f"schedule {p.schedule} needs --interleave >= 2 (virtual stages per rank)",
    ),
    Rule(
        "virtual stages without an interleaved schedule",
        lambda x: np.isin(x.schedule, _PLAIN) & (x.interleave != 1),
        lambda p, c: f"--interleave {p.interleave} needs schedule interleaved, zero_bubble, zbv or dualpipev",
    ),
    # torch's ScheduleZBVZeroBubble and ScheduleDualPipeV raise unless a rank holds exactly two stages.
    Rule(
        "V schedule without exactly 2 stages per rank",
        lambda x: np.isin(x.schedule, _V) & (x.pp > 1) & (x.interleave != 2),
        lambda p, c: f"schedule {p.schedule} places exactly 2 stages per rank in a V: use --interleave 2",
    ),
    # Priced on the network tier (planner.cost.network) and run by every runtime, so no plan breaks
    # it; the search leaves such layouts out unless tp is pinned (scope "search").
    Rule(
        "tp larger than a node",
        lambda x: _on(False, x.tp.shape) if x.gpus_per_node is None else x.tp > x.gpus_per_node,
        lambda p, c: (
            f"tp {p.tp} is larger than a {c.name} node ({c.gpus_per_node} devices): its collectives cross the network"
        ),
        scope="search",
    ),
    Rule("stage_layers do not fit the model and its stages", _split_broken, _split_message),
    Rule(
        "more pipeline stages than layers",
        lambda x: _on(not x.stage_layers, x.tp.shape) & (x.pp * x.interleave > x.model.layers),
        lambda p, c: (
            f"cannot split {p.model.layers} layers into {p.virtual_stages} pipeline stages: every "
            "stage needs at least one layer; "
            + (
                f"lower pp to at most {p.model.layers}"
                if p.pp > p.model.layers
                else f"lower interleave to at most {p.model.layers // p.pp}"
            )
        ),
    ),
    Rule(
        "fewer micro-batches than pipeline stages",
        lambda x: (x.pp > 1) & (x.schedule != SCHEDULES.index("gpipe")) & (x.num_microbatches < x.pp),
        lambda p, c: (
            f"{p.num_microbatches} micro-batches per step are fewer than pp {p.pp}; the {p.schedule} "
            "schedule needs at least pp: raise the global batch or lower micro-batch"
        ),
    ),
    # torch's ScheduleDualPipeV: "requires at least as many microbatches as stages".
    Rule(
        "dualpipev with fewer micro-batches than stages",
        lambda x: (x.pp > 1) & (x.schedule == SCHEDULES.index("dualpipev")) & (x.num_microbatches < 2 * x.pp),
        lambda p, c: (
            f"{p.num_microbatches} micro-batches per step are fewer than the {2 * p.pp} stages of "
            "dualpipev (2 x pp): raise the global batch or lower micro-batch"
        ),
    ),
    # settings.SCHEDULE_RUNTIMES: Megatron runs no GPipe or zero-bubble schedule, DeepSpeed's pipeline engine 1F1B only.
    Rule(
        "a pipeline schedule the runtime does not run",
        lambda x: (x.pp > 1) & ~np.isin(x.schedule, _schedules_run(x.runtime)),
        lambda p, c: (
            f"--runtime {p.runtime} does not run the {p.schedule} schedule: use --schedule "
            f"{' or '.join(s for s, r in SCHEDULE_RUNTIMES.items() if p.runtime in r)}, or --runtime "
            f"{' or '.join(SCHEDULE_RUNTIMES.get(p.schedule, ()))}"
        ),
    ),
    # Megatron-DeepSpeed runs pp > 1 through DeepSpeed's pipeline engine, whose constructor asserts "ZeRO-2 and
    # ZeRO-3 are incompatible with pipeline parallelism" (deepspeed/runtime/pipe/engine.py PipelineEngine.__init__).
    Rule(
        "ZeRO-2/3 with a pipeline under megatron-deepspeed",
        lambda x: _on(x.runtime == "megatron-deepspeed", x.tp.shape) & (x.pp > 1) & (x.zero_stage >= 2),
        lambda p, c: (
            f"--runtime megatron-deepspeed runs pp {p.pp} through DeepSpeed's pipeline engine, which "
            f'refuses ZeRO-{p.zero_stage} ("ZeRO-2 and ZeRO-3 are incompatible with pipeline '
            'parallelism"): use --zero 0 or 1, or --pp 1'
        ),
    ),
    # llm-foundry's benchmark and pretraining configurations shard with Composer's FSDP alone: every rank a data-
    # parallel rank (composer/trainer/dist_strategy.py prepare_fsdp_module, one process group over the world).
    Rule(
        "tensor, pipeline, context or expert parallelism under llm-foundry",
        lambda x: _on(x.runtime == "llm-foundry", x.tp.shape) & ((x.tp > 1) | (x.pp > 1) | (x.cp > 1) | (x.ep > 1)),
        lambda p, c: (
            "--runtime llm-foundry shards with Composer's FSDP over data parallelism alone: use "
            "--tp 1 --pp 1 (and no --cp, --ep), or another runtime"
        ),
    ),
    Rule(
        "sequence parallel without tensor parallelism",
        lambda x: x.sequence_parallel & (x.tp == 1),
        lambda p, c: "--sequence-parallel needs tp > 1 (it splits the sequence over the tp group)",
    ),
    Rule(
        "sequence length not divisible by tp (sequence parallel)",
        lambda x: x.sequence_parallel & (x.model.seq_len % _d(x.tp) != 0),
        lambda p, c: f"sequence parallel needs seq_len {p.model.seq_len} divisible by tp {p.tp}",
    ),
    Rule(
        "--compile with tensor parallelism (the exatrain trainer refuses it)",
        lambda x: _on(x.compile, x.tp.shape) & (x.tp > 1),
        lambda p, c: (
            "--compile runs without tensor parallelism only (DTensor blocks are not compiled yet): "
            "use --tp 1, or drop --compile"
        ),
        scope="run",
    ),
    # Its weight-gradient pass bypasses the hooks FSDP reduces from: wrong gradients (torch 2.13).
    Rule(
        "a zero-bubble schedule with FSDP (ZeRO-2/3) and dp > 1 (the exatrain trainer refuses it)",
        lambda x: (x.pp > 1) & np.isin(x.schedule, _SPLIT) & (x.dp > 1) & (x.zero_stage >= 2),
        lambda p, c: (
            f"the {p.schedule} schedule cannot run with FSDP (--zero 2/3) and dp > 1: use --zero 0 or 1, "
            "or the interleaved schedule"
        ),
        scope="trainer",
    ),
    # What exatrain's trainer does not run yet with expert or context parallelism (trainer/moe.py,
    # trainer/parallel/expert.py, trainer/parallel/context.py), in the order it used to refuse them.
    Rule(
        "cp with a mixture-of-experts model (the exatrain trainer refuses it)",
        lambda x: (x.cp > 1) & (_on(x.model.is_moe, x.tp.shape) | (x.ep > 1)),
        lambda p, c: (
            f"--cp {p.cp} does not run mixture-of-experts models yet (expert capacity and the "
            "balancing loss are per rank's tokens): use --cp 1"
        ),
        scope="trainer",
    ),
    Rule(
        "cp with --compile (the exatrain trainer refuses it)",
        lambda x: _on(x.compile, x.tp.shape) & (x.cp > 1),
        lambda p, c: f"--cp {p.cp} does not run with --compile yet: drop --compile",
        scope="run",
    ),
    # Its separate weight-gradient pass is untested with the K/V gather.
    Rule(
        "cp with a zero-bubble schedule (the exatrain trainer refuses it)",
        lambda x: (x.cp > 1) & (x.pp > 1) & np.isin(x.schedule, _SPLIT),
        lambda p, c: (
            f"--cp {p.cp} does not run the {p.schedule} schedule yet (its separate weight-gradient "
            "pass is untested with the K/V gather): use the 1f1b, gpipe or interleaved schedule"
        ),
        scope="trainer",
    ),
    # Routing gives data-dependent shapes, which torch.compile would recompile for.
    Rule(
        "--compile with a mixture-of-experts model (the exatrain trainer refuses it)",
        lambda x: _on(x.compile and x.model.is_moe, x.tp.shape),
        lambda p, c: (
            "--compile does not run mixture-of-experts models yet (their routing has "
            "data-dependent shapes): drop --compile"
        ),
        scope="run",
    ),
    Rule(
        "a zero-bubble schedule with a mixture-of-experts model (the exatrain trainer refuses it)",
        lambda x: _on(x.model.is_moe, x.tp.shape) & (x.pp > 1) & np.isin(x.schedule, _SPLIT),
        lambda p, c: (
            f"the {p.schedule} schedule does not run mixture-of-experts models yet (its separate "
            "weight-gradient pass): use the 1f1b, gpipe or interleaved schedule"
        ),
        scope="trainer",
    ),
    # The trainer's device mesh carves the ep group out of the dp ranks (trainer/parallel/mesh.py).
    Rule(
        "ep wider than dp (the exatrain trainer refuses it)",
        lambda x: (x.ep > 1) & (x.dp % _d(x.ep) != 0),
        lambda p, c: (
            f"--ep {p.ep} is wider than dp {p.dp}: exatrain's trainer splits the experts over dp ranks "
            f"only (ep must divide dp); use an ep among {_divisors(p.dp)}, or run the plan with an "
            "engine that folds ep over tp*cp*dp (--runtime megatron-core)"
        ),
        scope="trainer",
    ),
    # ZeRO shards over the whole dp group, whose ranks hold different experts under ep.
    Rule(
        "ep > 1 with ZeRO-1/2/3 (the exatrain trainer refuses it)",
        lambda x: (x.ep > 1) & (x.zero_stage >= 1),
        lambda p, c: (
            f"--ep {p.ep} runs with --zero 0 only: ZeRO-1/2/3 shard states over the whole dp "
            "group, whose ranks hold different experts (no expert-data-parallel sharding yet); "
            "use --zero 0, or --ep 1"
        ),
        scope="trainer",
    ),
)
REASONS: tuple[str, ...] = tuple(r.reason for r in RULES)
TRAINER_REASONS: tuple[str, ...] = tuple(r.reason for r in RULES if r.scope not in ("plan", "search"))


def broken(x: RuleInputs, *, scopes: tuple[str, ...] = ("plan",)) -> dict[str, np.ndarray]:
    """reason -> which layouts break that rule, for the rules of the given scopes (RULES order)."""
    return {r.reason: np.asarray(r.broken(x), dtype=bool) for r in RULES if r.scope in scopes}


def first_reasons(masks: dict[str, np.ndarray], alive: np.ndarray) -> tuple[dict[str, int], np.ndarray]:
    """Count each layout still ``alive`` under the first reason it breaks; return the counts and
    the layouts that break none."""
    alive = alive.copy()
    counts = {}
    for reason, bad in masks.items():
        hit = alive & bad
        counts[reason] = int(hit.sum())
        alive &= ~bad
    return counts, alive


def problems(
    plan, cluster: ClusterSpec | None = None, *, scopes: tuple[str, ...] = ("plan",), compile: bool = False
) -> list[Rule]:
    """The rules (of the given scopes) the plan breaks, in RULES order."""
    x = plan_rule_inputs(plan, cluster, compile=compile)
    return [r for r in RULES if r.scope in scopes and bool(np.asarray(r.broken(x)).reshape(-1)[0])]


def expert_problem(plan) -> tuple[str, str] | None:
    """(reason, message) for the first expert-parallel rule the plan breaks, or None: the message of
    the vectorised ep rule (RULES), with the fix. ep needs a mixture-of-experts model whose experts it
    divides, and ranks to take as the plan's runtime places them (``ep_fits``): dp ranks everywhere
    (ep consecutive dp ranks split the experts, as exatrain's trainer builds its mesh,
    trainer/parallel/mesh.py), the tp*cp*dp ranks of a stage where the runtime folds ep over them
    (Megatron-Core's MoE parallel folding; ``plan.ParallelDims``)."""
    m, ep = plan.model, getattr(plan.dims, "ep", 1)
    if isinstance(ep, bool) or not isinstance(ep, int) or ep <= 0:
        return "ep", f"--ep must be a positive integer, got {ep!r}"
    if ep > 1 and not m.is_moe:
        return "ep", f"--ep {ep} needs a mixture-of-experts model; {m.name} has no experts"
    if m.is_moe and m.experts % ep:
        return "ep", (
            f"experts {m.experts} of {m.name} are not divisible by ep {ep}; choose ep among {_divisors(m.experts)}"
        )
    dims = [getattr(plan.dims, k, 1) for k in ("tp", "cp", "dp")]
    if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
        return None  # the degree's own rule reports it
    tp, cp, dp = dims
    runtime = plan.runtime if isinstance(plan.runtime, str) else ""
    if bool(ep_fits(runtime, ep, tp=tp, cp=cp, dp=dp)):
        return None
    if runtime in FOLDING_RUNTIMES:
        return "ep", (
            f"tp*cp*dp = {tp * cp * dp} is not divisible by ep {ep}: the ep groups fold over the "
            f"tp*cp*dp ranks of a pipeline stage (runtime {runtime})"
        )
    if runtime == "torchtitan":
        return "ep", (
            f"dp {dp} is not divisible by ep {ep}, nor is ep {ep} a multiple of tp*cp = {tp * cp} "
            f"dividing tp*cp*dp = {tp * cp * dp}: torchtitan places ep inside dp, or over all of tp "
            "and cp and part of dp"
        )
    why = (
        "DeepSpeed carves its expert groups out of dp"
        if runtime == "megatron-deepspeed"
        else "exatrain's trainer builds its ep groups from dp ranks; to plan for Megatron-Core, which folds ep "
        "over tp*cp*dp, estimate or search with --runtime megatron-core"
    )
    return "ep", (
        f"dp {dp} is not divisible by ep {ep}: expert parallelism splits the dp ranks into groups of ep ({why})"
    )


def _a2a_heads_broken(x: RuleInputs) -> np.ndarray:
    """Layouts whose all-to-all context parallelism (the plan's or the runtime's own) does not divide the heads
    and K,V heads a rank holds by cp."""
    if x.runtime not in RUNTIMES or cp_comm_problem(x.cp_comm, x.runtime, x.model) is not None:
        return np.zeros(x.tp.shape, dtype=bool)
    if cp_comm_for(x.runtime, x.cp_comm, x.model) != "a2a":
        return np.zeros(x.tp.shape, dtype=bool)
    return heads_not_split(x.model, x.tp, x.cp)


def extension_problem(plan) -> tuple[str, str] | None:
    """(reason, message) for the first rule on context parallelism or a run setting the plan breaks, or None.
    The cp message is the vectorised cp rule's (RULES): cp needs every sequence split into 2*cp equal chunks
    (each cp rank holds one early and one late chunk, which balances causal attention, as Megatron-Core and
    torch's context parallel do). Then each run setting's own rule (``settings.SETTINGS``, in that order; the
    reason is the setting's name)."""
    cp = getattr(plan.dims, "cp", 1)
    if isinstance(cp, bool) or not isinstance(cp, int) or cp <= 0:
        return "cp", f"--cp must be a positive integer, got {cp!r}"
    if cp > 1 and plan.model.seq_len % (2 * cp):
        return "cp", (
            f"context parallelism needs seq_len {plan.model.seq_len} divisible by 2*cp = {2 * cp} "
            "(two load-balanced chunks per cp rank)"
        )
    for s in SETTINGS:
        problem = s.check(getattr(plan.settings, s.name), plan)
        if problem:
            return s.name, problem
    return None


def check(
    plan, cluster: ClusterSpec | None = None, *, scopes: tuple[str, ...] = ("plan",), compile: bool = False
) -> None:
    """Raise RuleError for the first rule (of the given scopes) the plan breaks."""
    for rule in problems(plan, cluster, scopes=scopes, compile=compile)[:1]:
        raise RuleError(rule.message(plan, cluster), rule.reason)
    for found in (expert_problem(plan), extension_problem(plan)):
        if found is not None:
            raise RuleError(found[1], found[0])


__all__ = [
    "FOLDING_RUNTIMES",
    "REASONS",
    "RULES",
    "TRAINER_REASONS",
    "RuleInputs",
    "Rule",
    "RuleError",
    "Shared",
    "broken",
    "rule_inputs",
    "check",
    "ep_fits",
    "expert_problem",
    "extension_problem",
    "first_reasons",
    "plan_rule_inputs",
    "problems",
]
