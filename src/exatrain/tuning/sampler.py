"""What the tuner may try, and how it picks the next layout to run.

The candidates are the memory-feasible layouts ``search`` ranks, each with its exact estimate. The
tuner models the measured throughput of a layout x as the cost model's prediction times a correction
learned from the runs so far (a Gaussian process on the log-residual):

    log measured(x) = log predicted(x) + r(x),    r ~ GP(0, c^2 + s^2 * exp(-|x - x'|^2 / 2 l^2)),
    measurement noise n ~ N(0, noise^2).

* The constant term c^2 absorbs a global offset: an uncalibrated cluster may be predicted 10x too
  fast, and one run corrects every layout at once without changing their order.
* The squared-exponential term learns *where* the cost model is wrong, correlated over the layout's
  structured parameters (log2 tp, pp, dp, micro-batch, ZeRO stage, recompute, SP, schedule,
  interleave, log2 ep and cp, each scaled to [0, 1]): measuring one tp-4 layout slower than predicted lowers every
  tp-4 layout. (s, l) and the noise are refit by marginal likelihood on a small grid once three
  runs exist, so a noisy machine is believed to be noisy and one lucky run does not end the search.

With no runs the posterior mean is the prediction itself, so the cost model's ranking seeds the
search; afterwards measurements override it where the two disagree. The next trial is the untried
candidate with the largest upper confidence bound, mean + kappa * std (UCB, the acquisition the
Frontier study ran in DeepHyper). When even mean + 3 std of every untried candidate is below the
best run's posterior mean, the rest is hopeless and the tuner stops before its trial budget. The
model is a few numpy lines (optuna's own GP sampler needs torch, which the planner never imports);
``CostModelSampler`` hands its picks to Optuna as the trial's parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from exatrain.plan import Plan
from exatrain.settings import RECOMPUTE, SCHEDULES

# Trial statuses. A *run* status means a training run was started and ended this way; only those
# count towards --trials. "rejected" (the trainer refused the plan before starting a rank, in about a
# second) is never tried again but does not count; "interrupted" (the tuner died or was stopped
# mid-run) is retried; "infeasible" and "duplicate" are answered without a run.
RUN_STATUSES = ("ok", "pruned", "oom", "timeout", "failed")
MEASURED_STATUSES = ("ok", "pruned")  # carry a throughput measurement
PARAM_NAMES = ("tp", "pp", "micro_batch", "zero_stage", "recompute", "sequence_parallel", "schedule", "interleave")


def layout_key(params: Mapping[str, Any]) -> str:
    """One spelling per layout, e.g. 'tp2.pp1.mb4.z1.none.sp1.1f1b1' (dp follows from tp, pp, cp,
    gpus); an ep or cp other than 1 adds '.ep2' / '.cp2' (so studies made before they were tuned keep
    their keys)."""
    extra = "".join(f".{k}{int(params.get(k, 1))}" for k in ("ep", "cp") if int(params.get(k, 1)) != 1)
    return (
        f"tp{params['tp']}.pp{params['pp']}.mb{params['micro_batch']}.z{params['zero_stage']}."
        f"{params['recompute']}.sp{int(bool(params['sequence_parallel']))}."
        f"{params['schedule']}{params['interleave']}{extra}"
    )


def plan_params(plan: Plan) -> dict[str, Any]:
    return {
        "tp": plan.tp,
        "pp": plan.pp,
        "micro_batch": plan.micro_batch,
        "zero_stage": plan.zero_stage,
        "recompute": plan.recompute,
        "sequence_parallel": plan.sequence_parallel,
        "schedule": plan.schedule,
        "interleave": plan.interleave,
        "ep": plan.ep,
        "cp": plan.cp,
    }


def _features(plan: Plan) -> list[float]:
    onehot = [1.0 if plan.schedule == s else 0.0 for s in SCHEDULES]
    return [
        math.log2(plan.tp),
        math.log2(plan.pp),
        math.log2(plan.dp),
        math.log2(plan.micro_batch),
        float(plan.zero_stage),
        float(RECOMPUTE.index(plan.recompute)),
        float(plan.sequence_parallel),
        *onehot,
        math.log2(plan.interleave),
        math.log2(plan.ep),
        math.log2(plan.cp),
    ]


@dataclass(frozen=True)
class Candidates:
    """The layouts the tuner may run, best predicted first, with what the sampler needs of them."""

    plans: tuple[Plan, ...]  # each with its estimate
    keys: tuple[str, ...]
    predicted: np.ndarray  # tokens/s per candidate
    features: np.ndarray  # (n, d), each column scaled to [0, 1]
    distributions: Mapping[str, BaseDistribution]  # the Optuna search space (stable for one problem)
    index: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_plans(cls, plans: Sequence[Plan], *, gpus: int, global_batch: int) -> "Candidates":
        plans = tuple(plans)
        if any(p.estimate is None or not p.estimate.tokens_per_s for p in plans):
            raise ValueError("every candidate needs an estimate with a predicted throughput")
        keys = tuple(layout_key(plan_params(p)) for p in plans)
        feats = np.array([_features(p) for p in plans], dtype=float).reshape(len(plans), -1)
        if len(plans):
            span = feats.max(axis=0) - feats.min(axis=0)
            feats = np.where(span > 0, (feats - feats.min(axis=0)) / np.where(span > 0, span, 1.0), 0.0)
        layers = plans[0].model.layers if plans else 1
        # Fixed by the problem (model, gpus, global batch), not by which layouts fit today: a rerun with
        # another calibration may rank other candidates, and Optuna needs the same distributions.
        dists: dict[str, BaseDistribution] = {
            "tp": IntDistribution(1, gpus),
            "pp": IntDistribution(1, gpus),
            "micro_batch": IntDistribution(1, global_batch),
            "zero_stage": IntDistribution(0, 3),
            "recompute": CategoricalDistribution(RECOMPUTE),
            "sequence_parallel": CategoricalDistribution((False, True)),
            "schedule": CategoricalDistribution(SCHEDULES),
            "interleave": IntDistribution(1, max(layers, 1)),
            "ep": IntDistribution(1, gpus),
            "cp": IntDistribution(1, gpus),
        }
        predicted = np.array([p.estimate.tokens_per_s for p in plans], dtype=float)  # type: ignore[union-attr]
        return cls(plans, keys, predicted, feats, dists, {k: i for i, k in enumerate(keys)})

    def __len__(self) -> int:
        return len(self.plans)

    def params(self, i: int) -> dict[str, Any]:
        return plan_params(self.plans[i])

    def seeds(self, n: int) -> list[int]:
        """The best predicted layout of each of the ``n`` best predicted (tp, pp) meshes: the first
        trials, spread over the dimension the cost model is least sure of on an uncalibrated cluster
        (how tensor- and pipeline-parallel communication really costs)."""
        out: list[int] = []
        meshes: set[tuple[int, int]] = set()
        for i in np.argsort(-self.predicted, kind="stable"):
            mesh = (self.plans[i].tp, self.plans[i].pp)
            if mesh not in meshes:
                meshes.add(mesh)
                out.append(int(i))
            if len(out) >= n:
                break
        return out


@dataclass(frozen=True)
class GPSettings:
    """The residual model's prior and the acquisition; defaults chosen before any benchmark."""

    offset_std: float = 2.0  # c: a global factor of e^2 ~ 7x either way is plausible before any run
    kappa: float = 1.96  # UCB width of the acquisition (DeepHyper's default)
    stop_kappa: float = 3.0  # "hopeless" means below the best run even at mean + 3 std
    length_scales: tuple[float, ...] = (0.3, 0.6, 1.2)
    residual_stds: tuple[float, ...] = (0.25, 0.5, 1.0)
    noise_stds: tuple[float, ...] = (0.05, 0.15, 0.3)  # run-to-run noise, fit too: a shared machine is noisy
    defaults: tuple[float, float, float] = (0.6, 0.5, 0.1)  # (length, residual std, noise) before 3 runs


@dataclass(frozen=True)
class Observations:
    """What the study knows, by candidate index: measured log throughput, and what not to pick."""

    measured: Mapping[int, float]  # index -> log tokens/s (ok and pruned runs; failed ones imputed)
    excluded: frozenset[int]  # measured, failed, rejected, running or queued
    ok: frozenset[int] = frozenset()  # completed runs (the pruned ones stopped early)


@dataclass(frozen=True)
class Choice:
    index: int | None  # None: nothing untried is left
    ucb: float = -math.inf  # log tokens/s
    hopeless: bool = False  # no untried layout can beat the best run, even optimistically


def _kernel(a: np.ndarray, b: np.ndarray, length: float, std: float, offset: float) -> np.ndarray:
    d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=-1)
    return offset**2 + std**2 * np.exp(-d2 / (2 * length**2))


def posterior(
    cands: Candidates, measured: Mapping[int, float], gp: GPSettings = GPSettings()
) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and std of the true log throughput of every candidate (mean = log prediction +
    residual); the kernel's (length, std) and the noise are the grid point of largest marginal likelihood.

    K = c^2 11' + A with A = s^2 R + noise^2 I: one eigendecomposition of R per length scale serves every
    (s, noise), and the constant term is a rank-one update (Sherman-Morrison, matrix determinant lemma),
    so a refit over hundreds of runs stays well under a second."""
    prior = np.log(cands.predicted)
    if not measured:
        return prior, np.full(len(cands), math.hypot(gp.offset_std, gp.defaults[1]))
    idx = np.array(list(measured), dtype=int)
    r = np.array([measured[i] for i in idx]) - prior[idx]
    x = cands.features[idx]
    d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(axis=-1)
    c2 = gp.offset_std**2
    few = idx.size < 3
    best = None
    for length in (gp.defaults[0],) if few else gp.length_scales:
        lam, q = np.linalg.eigh(np.exp(-d2 / (2 * length**2)))
        lam = np.maximum(lam, 0.0)
        rq, oq = q.T @ r, q.sum(axis=0)  # r and the ones vector in R's eigenbasis
        pairs = [gp.defaults[1:]] if few else [(s, n) for s in gp.residual_stds for n in gp.noise_stds]
        for std, noise in pairs:
            dinv = 1.0 / (std**2 * lam + noise**2 + 1e-9)  # A^-1 in the eigenbasis
            a_rr, a_1r, a_11 = rq @ (dinv * rq), oq @ (dinv * rq), oq @ (dinv * oq)
            denom = 1.0 + c2 * a_11
            # log marginal likelihood, Rasmussen & Williams 2006, Eq. 2.30 (constant dropped)
            lml = -0.5 * (a_rr - c2 * a_1r**2 / denom) - 0.5 * (np.log(1.0 / dinv).sum() + math.log(denom))
            if best is None or lml > best[0]:
                best = (lml, length, std, q, dinv, oq, denom)
    _, length, std, q, dinv, oq, denom = best  # type: ignore[misc]

    def k_inv(b: np.ndarray) -> np.ndarray:  # K^-1 b for b of shape (n,) or (n, m)
        a_b = q @ (dinv[:, None] * (q.T @ b.reshape(len(r), -1)))
        a_1 = q @ (dinv * oq)
        return (a_b - np.outer(a_1, a_1 @ b.reshape(len(r), -1)) * c2 / denom).reshape(b.shape)

    ks = _kernel(cands.features, x, length, std, gp.offset_std)  # (candidates, runs)
    mean = prior + ks @ k_inv(r)
    var = c2 + std**2 - (ks.T * k_inv(ks.T)).sum(axis=0)
    return mean, np.sqrt(np.maximum(var, 1e-12))


def choose(cands: Candidates, obs: Observations, gp: GPSettings = GPSettings()) -> Choice:
    """The untried candidate with the largest upper confidence bound (ties: the better predicted), and
    whether every untried one is hopeless: its mean + stop_kappa std below the best run's posterior mean
    (the model's belief of that run's true speed, not its possibly lucky measurement)."""
    free = np.array([i for i in range(len(cands)) if i not in obs.excluded], dtype=int)
    if free.size == 0:
        return Choice(None)
    mean, std = posterior(cands, obs.measured, gp)
    ucb = mean[free] + gp.kappa * std[free]
    j = int(np.argmax(ucb))  # argmax takes the first maximum: candidates are ordered best predicted first
    ok = [i for i in obs.ok if i in obs.measured]
    hopeless = bool(ok) and float(np.max(mean[free] + gp.stop_kappa * std[free])) < max(mean[i] for i in ok)
    return Choice(int(free[j]), float(ucb[j]), hopeless)


# ---- the study's trials, as the sampler sees them --------------------------------------------------
def trial_key(t: FrozenTrial) -> str | None:
    """The layout a trial ran (or will run, when it waits in the queue with fixed parameters)."""
    if "layout" in t.user_attrs:
        return str(t.user_attrs["layout"])
    params = t.params or t.system_attrs.get("fixed_params") or {}
    return layout_key(params) if all(k in params for k in PARAM_NAMES) else None


def trial_status(t: FrozenTrial) -> str:
    """The tuner's status of a trial; a trial that failed without one was cut off mid-run."""
    if "status" in t.user_attrs:
        return str(t.user_attrs["status"])
    return {TrialState.RUNNING: "running", TrialState.WAITING: "queued"}.get(t.state, "interrupted")


def observations(cands: Candidates, trials: Iterable[FrozenTrial]) -> Observations:
    """The GP's data: measured runs, and failed or refused ones (oom, timeout, crash, rejected) at half
    the slowest run measured - a failure says its neighbours (more memory, the same kernel, the same
    bug, the same unsupported combination) are risky, so the sampler moves away instead of trying the
    next ZeRO stage of the same failing layout."""
    measured: dict[int, float] = {}
    failed: set[int] = set()
    excluded: set[int] = set()
    interrupted: dict[int, int] = {}
    ok: set[int] = set()
    for t in trials:
        key = trial_key(t)
        i = cands.index.get(key) if key is not None else None
        if i is None:
            continue
        status = trial_status(t)
        if status == "interrupted":  # twice cut off mid-run (did it take the tuner down?): leave it
            interrupted[i] = interrupted.get(i, 0) + 1
            if interrupted[i] >= 2:
                excluded.add(i)
        value = t.user_attrs.get("measured_tokens_per_s")
        if status in MEASURED_STATUSES and value:
            measured[i] = math.log(float(value))
            if status == "ok":
                ok.add(i)
        elif status in ("oom", "timeout", "failed", "rejected"):
            failed.add(i)
        if status in RUN_STATUSES or status in ("rejected", "running", "queued"):
            excluded.add(i)
    if measured:
        floor = min(measured.values()) - math.log(2)
        measured.update({i: floor for i in failed if i not in measured})
    return Observations(measured, frozenset(excluded), frozenset(ok))


class CostModelSampler(optuna.samplers.BaseSampler):
    """Optuna sampler over ``Candidates``: every parameter of a trial at once (relative sampling),
    chosen by ``choose``. Enqueued trials (the cost model's seeds, retries) bypass it."""

    def __init__(self, cands: Candidates, gp: GPSettings = GPSettings()) -> None:
        self.cands, self.gp = cands, gp
        self._fallback = optuna.samplers.RandomSampler(seed=0)
        self._last: tuple[Any, Choice] | None = None  # the tuner asks before each trial, Optuna again

    def next_choice(self, trials: Iterable[FrozenTrial]) -> Choice:
        obs = observations(self.cands, trials)
        key = (tuple(sorted(obs.measured.items())), obs.excluded, obs.ok)
        if self._last is None or self._last[0] != key:
            self._last = (key, choose(self.cands, obs, self.gp))
        return self._last[1]

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.cands.distributions)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        choice = self.next_choice(study.get_trials(deepcopy=False))
        return {} if choice.index is None else self.cands.params(choice.index)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        # Only reached when nothing is left to pick (a race between tuners sharing a study): any
        # value will do, the objective answers a non-candidate without a run.
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)


class HopelessPruner(optuna.pruners.BasePruner):
    """Stop a run whose throughput after warm-up (the median of its reported steps, at least
    ``min_steps`` of them) is below ``ratio`` x the best completed run: it cannot win, and the
    rest of its steps would only spend the budget."""

    def __init__(self, ratio: float = 0.5, min_steps: int = 2) -> None:
        self.ratio, self.min_steps = ratio, min_steps

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        values = list(trial.intermediate_values.values())
        if self.ratio <= 0 or len(values) < self.min_steps:
            return False
        done = [t.value for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value is not None]
        return bool(done) and float(np.median(values)) < self.ratio * max(done)


__all__ = [
    "MEASURED_STATUSES",
    "PARAM_NAMES",
    "RUN_STATUSES",
    "Candidates",
    "Choice",
    "CostModelSampler",
    "GPSettings",
    "HopelessPruner",
    "Observations",
    "choose",
    "layout_key",
    "observations",
    "plan_params",
    "posterior",
    "trial_key",
    "trial_status",
]
