"""The typed requests the API's calls take: small frozen, keyword-only dataclasses, one per group of the CLI's flags
(``exatrain estimate --help`` lists the groups), so a call states what it asks in a few typed values rather than
fifty keywords.

* ``ModelQuery``   which model: a preset, a ModelSpec or a file, with shape values overriding it
* ``ClusterQuery`` which cluster and how many of its devices (``gpus``; scaling: a list of counts)
* ``Layout``       the layout values that pin a plan's (or a search's) dimensions; None: the default, or searched
* ``Engine``       the engine that runs the plan, which of its overlaps are on, and a calibration file
* ``Budget``       the whole run at a token budget: price, power, failures (``planner.time_to_train``)
* ``PlanOptions``  what a planner call also does: rank, keep, write, trace, start from a launch file
* run settings     ``RunSettings`` (or a mapping of setting names): ``exatrain.settings.SETTINGS``

Each call also takes its groups' fields flat by name (``estimate("llama3-70b", "dgx-h100", gpus=64, tp=8)``):
``routed`` puts each keyword into the group whose field it names, and a keyword no group has is a TypeError
naming it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from exatrain.catalog import ClusterSpec, ModelSpec
from exatrain.limits import check_counts
from exatrain.run_settings import RunSettings
from exatrain.settings import BY_NAME

Progress = Callable[[str], None]


class _Group:
    """What every request shares: its fields that differ from their defaults, and all of them by name."""

    def given(self) -> dict[str, Any]:
        """The fields set to something other than their default (by name)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}  # type: ignore[arg-type]

    def values(self) -> dict[str, Any]:
        """Every field by name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class ModelQuery(_Group):
    """A preset name, a ModelSpec or ``model_file``; the shape values override it (a preset so changed is named
    '<preset>*'); with neither, a model of the shape values alone (``plans.resolve_model``)."""

    model: str | ModelSpec | None = None
    model_file: str | Path | None = None
    arch: str | None = None
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    ffn_hidden: int | None = None
    seq_len: int | None = None
    vocab: int | None = None

    def shape(self) -> dict[str, Any]:
        """The shape values (arch .. vocab) by name, None where not given."""
        return {k: v for k, v in self.values().items() if k not in ("model", "model_file")}


@dataclass(frozen=True, kw_only=True)
class ClusterQuery(_Group):
    """A catalog name, a ClusterSpec or ``cluster_file`` (neither: the call's default), and ``gpus``: the devices
    (ranks) a plan uses; for ``scaling`` the increasing counts."""

    cluster: str | ClusterSpec | None = None
    cluster_file: str | Path | None = None
    gpus: int | Sequence[int] | None = None


@dataclass(frozen=True, kw_only=True)
class Layout(_Group):
    """Layout values (None: the base plan's, else ``plans``' default; a search explores it). dp = gpus /
    (tp*cp*pp) when not given; ``stage_layers``: layers per virtual stage."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    micro_batch: int | None = None
    global_batch: int | None = None
    zero: int | None = None
    recompute: str | None = None
    sequence_parallel: bool | None = None
    schedule: str | None = None
    interleave: int | None = None
    stage_layers: Sequence[int] | None = None
    dtype: str | None = None
    flash_attention: bool | None = None
    ep: int | None = None
    cp: int | None = None


@dataclass(frozen=True, kw_only=True)
class Engine(_Group):
    """The engine that runs the plan (``runtime``: megatron-core, megatron-deepspeed, torchtitan, exatrain,
    llm-foundry; None: the model's default, said in the notes), which of its overlaps are on (``overlap``: all,
    default, none or a comma list) and ``calibration``: cost parameters measured by ``bench`` or ``calibrate``."""

    runtime: str | None = None
    overlap: str | None = None
    calibration: str | Path | None = None


@dataclass(frozen=True, kw_only=True)
class Budget(_Group):
    """The run at a token budget (``tokens``: 15T, 300e9, ...): its days, GPU-hours, energy (at TDP times
    ``power_overhead``), cost (``gpu_hour_price``) and goodput under failures (``node_mtbf_hours``,
    ``checkpoint_bandwidth`` in GB/s, ``restart_minutes``; None: the catalog's)."""

    tokens: int | float | str | None = None
    gpu_hour_price: float | str | None = None
    power_overhead: float | str | None = None
    node_mtbf_hours: float | str | None = None
    checkpoint_bandwidth: float | str | None = None
    restart_minutes: float | str | None = None


@dataclass(frozen=True, kw_only=True)
class PlanOptions(_Group):
    """What a planner call does besides planning: ``top`` ranked layouts kept and ``rank_by`` (search), tight
    layouts dropped (``strict_memory``: search, scaling), weak or strong ``mode`` (scaling), ``out``: write the
    (best) plan as JSON, ``trace`` the trainer's model (estimate: True, "fast" or "full"), ``from_file``: a
    Megatron-LM / Megatron-DeepSpeed launch or torchtitan TOML filling what is left at its default (estimate,
    search), ``progress`` hears progress lines."""

    top: int = 10
    rank_by: str = "throughput"
    strict_memory: bool = False
    mode: str = "weak"
    out: str | Path | None = None
    trace: bool | str = False
    from_file: str | Path | None = None
    progress: Progress | None = None


@dataclass(frozen=True, kw_only=True)
class TrainRun(_Group):
    """How ``train`` runs: optimizer ``steps``, ``seed`` (weights and data order), the learning-rate schedule
    (peak ``lr``, linear ``warmup`` steps, cosine decay to ``min_lr_ratio`` x lr), AdamW's ``weight_decay``, the
    global ``grad_clip`` norm (0: off), ``device`` (None: cuda for a plan made for a GPU cluster, else cpu), where
    metrics go (``metrics_file``: a JSON line per step and the RunRecord; ``tensorboard``), ``nan_policy`` (stop or
    skip), ``calibration`` (predict with it), ``compile``, ``record_samples``, ``watchdog`` (seconds a rank's phase
    may last; 0: max(300 s, 20 x the median step)); ``warn`` hears warnings, ``progress`` what happens before the
    ranks start."""

    steps: int = 100
    seed: int = 0
    lr: float = 1e-3
    warmup: int = 10
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    device: str | None = None
    metrics_file: str | Path | None = None
    quiet: bool = False
    nan_policy: str = "stop"
    tensorboard: str | Path | None = None
    calibration: str | Path | None = None
    compile: bool = False
    record_samples: bool = False
    watchdog: float = 0.0
    warn: Callable[[str], None] | None = None
    progress: Progress | None = None


@dataclass(frozen=True, kw_only=True)
class TrainStore(_Group):
    """What ``train`` reads and keeps: ``data`` (a dataset made by ``prepare``; None: the built-in corpus),
    checkpoints in ``checkpoint_dir`` (every ``save_every`` steps, 0: after the last; the newest ``keep_last``,
    0: all; written in the background with ``async_save``) and ``resume``: 'auto' or a checkpoint path."""

    data: str | Path | None = None
    checkpoint_dir: str | Path | None = None
    save_every: int = 0
    keep_last: int = 0
    async_save: bool = False
    resume: str | Path | None = None


@dataclass(frozen=True, kw_only=True)
class TuneOptions(_Group):
    """How ``tune`` runs its study: ``trials`` (the study's total of finished runs), ``time_budget`` (e.g. '2h':
    stops starting trials), the Optuna ``study`` storage and ``study_name``, ``device``, ``steps`` and ``seed`` of
    each trial, ``trial_timeout``, a ``launcher`` template with {cmd}, how many ``candidates`` the search gives,
    ``seed_trials`` from its ranking, ``prune_ratio``; ``out`` (the best plan) and ``runs_file`` (a RunRecord per
    run), ``progress`` hears one line per finished trial."""

    trials: int = 20
    time_budget: str | float | None = None
    study: str = "sqlite:///tune.db"
    study_name: str | None = None
    device: str | None = None
    steps: int = 8
    seed: int = 0
    trial_timeout: str | float = "15m"
    launcher: str | None = None
    candidates: int = 256
    seed_trials: int = 2
    prune_ratio: float = 0.5
    out: str | Path | None = None
    runs_file: str | Path | None = None
    progress: Progress | None = None


@dataclass(frozen=True, kw_only=True)
class JobOptions(_Group):
    """What a ``launch`` job runs: ``nodes`` (None: gpus / gpus_per_node, rounded up), ``checkpoint_dir`` (made
    absolute; a restarted job resumes from it), ``steps`` (None: train's default), ``metrics_file``, the
    aws-ofi-rccl ``rccl_plugin_dir``; ``out``: also write the job there (executable); ``force``: write it even when
    the plan does not fit the cluster's memory."""

    nodes: int | None = None
    checkpoint_dir: str = "checkpoints"
    steps: int | None = None
    metrics_file: str | None = None
    rccl_plugin_dir: str = ""
    out: str | Path | None = None
    force: bool = False


@dataclass(frozen=True, kw_only=True)
class SlurmJob(_Group):
    """An sbatch script's own values: ``account``, wall-clock ``time``, ``partition``, ``job_name`` (default
    exatrain-<model>), the rendezvous ``master_port`` and ``setup`` lines run before the ranks start."""

    account: str = ""
    time: str = "02:00:00"
    partition: str = ""
    job_name: str = ""
    master_port: int = 29500
    setup: Sequence[str] = ()


@dataclass(frozen=True, kw_only=True)
class TorchrunJob(_Group):
    """A torchrun command's own value: the c10d rendezvous endpoint ``master`` (default: $MASTER_ADDR at run
    time)."""

    master: str = ""


@dataclass(frozen=True, kw_only=True)
class RecordedRun(_Group):
    """What a run measured elsewhere states (``record``): with a plan, its ``step_time`` (seconds) and
    ``peak_memory_gib``; or its launch ``from_file`` and the engine's ``log`` (``vocab`` where the launch leaves it
    to its tokenizer; logged steps up to ``warmup`` are warm-up); ``overlap``: the overlaps it had on."""

    step_time: float | None = None
    peak_memory_gib: float | None = None
    from_file: str | Path | None = None
    log: str | Path | None = None
    vocab: int | None = None
    warmup: int = 2
    overlap: str | None = None


@dataclass(frozen=True, kw_only=True)
class TokenizeOptions(_Group):
    """How ``prepare`` turns text into token shards: a Hugging Face ``tokenizer`` (tokenizer.json) or a
    byte-level BPE of ``train_tokenizer`` ids trained on the corpus, the document ``separator`` token and the
    ``shard_tokens`` per shard (None: the defaults)."""

    tokenizer: str | Path | None = None
    train_tokenizer: int | None = None
    separator: str | None = None
    shard_tokens: int | None = None


SettingsArg = RunSettings | Mapping[str, Any] | None


def settings_given(settings: SettingsArg, *, runtime: bool = False) -> dict[str, Any]:
    """The run settings a call was given, by name: a RunSettings' fields that differ from their defaults, or a
    mapping's values that are not None; ``runtime`` is kept only when asked (most calls take it in ``Engine``).
    A name that is no setting is a TypeError naming it."""
    if settings is None:
        return {}
    if isinstance(settings, RunSettings):
        values = {s.name: getattr(settings, s.name) for s in BY_NAME.values()}
        given = {k: v for k, v in values.items() if v != BY_NAME[k].default}
    else:
        unknown = [k for k in settings if k not in BY_NAME]
        if unknown:
            raise TypeError(f"unknown run setting {unknown[0]!r} (exatrain.settings.SETTINGS names them)")
        given = {k: v for k, v in settings.items() if v is not None}
    return {k: v for k, v in given.items() if runtime or k != "runtime"}


def coerce(cls: type, value: Any, first: str) -> Any:
    """``value`` as a ``cls`` request: itself, its defaults (None), or a request of ``first`` = value (a model or
    cluster name or spec given in its place)."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if not first:
        raise TypeError(f"expected a {cls.__name__}, got {type(value).__name__}")
    return cls(**{first: value})


def routed(call: str, pins: Mapping[str, Any], parts: Mapping[str, Any], settings: SettingsArg = None) -> dict:
    """``parts`` (request name -> a request) with each of ``pins`` (a call's flat keywords) set in the request that
    has a field of its name; a pin that names a run setting goes to the settings (returned under "settings", a
    dict of the settings given, ``settings_given``), unless a request has it. A keyword no request and no setting
    has is a TypeError naming it and the requests ``call`` takes."""
    left = dict(pins)
    out: dict[str, Any] = {}
    for name, req in parts.items():
        mine = {f.name: left.pop(f.name) for f in fields(req) if f.name in left}
        out[name] = dataclasses.replace(req, **mine) if mine else req
    runtime = "engine" not in parts
    extra = {k: left.pop(k) for k in list(left) if k in BY_NAME and (runtime or k != "runtime")}
    if left:
        kinds = ", ".join(type(r).__name__ for r in parts.values())
        raise TypeError(
            f"{call}() got an unexpected keyword argument {next(iter(left))!r} (not a field of {kinds}, nor a run "
            "setting)"
        )
    out["settings"] = {**settings_given(settings, runtime=runtime), **settings_given(extra, runtime=runtime)}
    check_counts({k: v for r in (*out.values(),) for k, v in _items(r)})
    return out


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """A planner call's whole request: its groups, and the run settings given (by name, ``settings_given``)."""

    model: ModelQuery = ModelQuery()
    cluster: ClusterQuery = ClusterQuery()
    layout: Layout = Layout()
    engine: Engine = Engine()
    budget: Budget = Budget()
    options: PlanOptions = PlanOptions()
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def replace(self, **changes: Any) -> "PlanRequest":
        return dataclasses.replace(self, **changes)


def plan_request(call: str, takes: Sequence[str], pins: Mapping[str, Any], **given: Any) -> PlanRequest:
    """The PlanRequest of a planner call: its groups as given (a model or cluster may be a name or a spec), each
    flat keyword routed into its group (``routed``); an option that ``call`` does not take (``takes``: the
    PlanOptions fields it does) is a TypeError naming it, as for any keyword a function does not have."""
    parts = {
        "model": coerce(ModelQuery, given.get("model"), "model"),
        "cluster": coerce(ClusterQuery, given.get("cluster"), "cluster"),
        **{k: coerce(cls, given.get(k), "") for k, cls in (("layout", Layout), ("engine", Engine))},
        **{k: coerce(cls, given.get(k), "") for k, cls in (("budget", Budget), ("options", PlanOptions))},
    }
    out = routed(call, pins, parts, given.get("settings"))
    wrong = [k for k in out["options"].given() if k not in takes]
    if wrong:
        raise TypeError(f"{call}() got an unexpected keyword argument {wrong[0]!r}")
    return PlanRequest(**out)


def _items(part: Any) -> list[tuple[str, Any]]:
    if isinstance(part, _Group):
        return list(part.values().items())
    return list(part.items()) if isinstance(part, Mapping) else []


__all__ = [
    "Budget",
    "ClusterQuery",
    "Engine",
    "Layout",
    "ModelQuery",
    "PlanOptions",
    "PlanRequest",
    "Progress",
    "RunSettings",
    "JobOptions",
    "RecordedRun",
    "SlurmJob",
    "TokenizeOptions",
    "TorchrunJob",
    "TrainRun",
    "TuneOptions",
    "TrainStore",
    "coerce",
    "plan_request",
    "routed",
    "settings_given",
]
