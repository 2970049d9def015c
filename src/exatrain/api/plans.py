"""From keyword values (the CLI's flags, by the same names) to typed inputs: a model, a cluster, a
validated Plan, the cost parameters of a calibration file, a plan read from any file that holds one.

Defaults live here and nowhere else: tp = pp = 1, dp = gpus / (tp * pp), micro-batch 1, a global
batch of micro-batch * dp (four micro-batches per pipeline stage when pp > 1), ZeRO-0, no
recomputation, 1F1B (interleaved/zero-bubble: 2 virtual stages per rank), flash attention on.
"""

from __future__ import annotations

import dataclasses
import warnings
from types import SimpleNamespace
from pathlib import Path
from typing import Any, Callable, Mapping

from exatrain.catalog import ClusterSpec, ModelSpec, get_cluster, get_model, load_cluster_file, load_model_file
from exatrain.errors import PlanError, UserError
from exatrain.limits import check_counts
from exatrain.paths import check_input_file
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.jsonio import read_json
from exatrain.api.requests import (
    ClusterQuery,
    Engine,
    Layout,
    ModelQuery,
    PlanRequest,
    SettingsArg,
    coerce,
    routed,
)
from exatrain.run_settings import RunSettings
from exatrain.settings import NAMES, check_settings, recompute_modules_of

Warn = Callable[[str], None]

MODEL_FIELDS = ("arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "seq_len", "vocab")
LAYOUT_FIELDS = (
    "tp",
    "pp",
    "dp",
    "micro_batch",
    "global_batch",
    "zero",
    "recompute",
    "sequence_parallel",
    "schedule",
    "interleave",
    "stage_layers",
    "dtype",
    "flash_attention",
    "ep",
    "cp",
)
# ... and the run settings but the runtime (settings.SETTINGS), which each call takes as its own
_CUSTOM_NEEDS = ("layers", "hidden", "heads", "seq_len", "vocab")


class ExatrainWarning(UserWarning):
    """Something worth a user's attention that does not stop the work (e.g. a GPU job rendered for
    a plan made for CPU ranks). The CLI prints it as one line on stderr."""


def warner(warn: Warn | None) -> Warn:
    """``warn`` itself, or one that issues an ExatrainWarning."""
    return warn or (lambda message: warnings.warn(message, ExatrainWarning, stacklevel=3))


def resolve_model(
    model: str | ModelSpec | None = None,
    model_file: str | Path | None = None,
    *,
    base: ModelSpec | None = None,
    default: str | None = None,
    **shape: Any,
) -> ModelSpec:
    """A preset name, a ModelSpec or a model file; else ``base`` (a plan's model); else a model from
    the shape values alone (named 'custom'); else the ``default`` preset. Shape values (arch, layers,
    hidden, heads, kv_heads, ffn_hidden, seq_len, vocab) override; an overridden preset is named
    '<preset>*'. A Hugging Face config.json takes ``seq_len`` as its own training sequence, and what its
    reader chose (the sequence length when none is given, what it does not model) is an ExatrainWarning each."""
    unknown = set(shape) - set(MODEL_FIELDS)
    if unknown:
        raise TypeError(f"unknown model field(s): {', '.join(sorted(unknown))}")
    if model is not None and model_file is not None:
        raise UserError("give either --model or --model-file, not both")
    overrides = {k: v for k, v in shape.items() if v is not None}
    if isinstance(model, ModelSpec):
        found = model
    elif model_file is not None:  # a config.json takes the sequence length as its own (it states none)
        notes: list[str] = []
        found = load_model_file(
            check_input_file(model_file, "--model-file"), seq_len=overrides.get("seq_len"), notes=notes
        )
        overrides = {k: v for k, v in overrides.items() if not (k == "seq_len" and v == found.seq_len)}
        for note in notes:
            warner(None)(note)
    elif model is not None:
        found = get_model(model)
    elif base is not None:
        found = base
    elif set(_CUSTOM_NEEDS) <= set(overrides):
        return ModelSpec.from_dict({"name": "custom", "arch": "gpt", **overrides}, source="model flags")
    elif default is not None:
        found = get_model(default)
    else:
        raise UserError(
            "no model: pass --model NAME, --model-file PATH, or all of --layers --hidden --heads --seq-len --vocab"
        )
    if not overrides:
        return found
    # A changed shape is a different model: drop family defaults that depended on the old one.
    fields = found.to_dict()
    if "hidden" in overrides and "ffn_hidden" not in overrides and found.arch == "gpt":
        fields["ffn_hidden"] = 0
    if "heads" in overrides and "kv_heads" not in overrides and found.kv_heads == found.heads:
        fields["kv_heads"] = 0
    if "arch" in overrides and overrides["arch"] != found.arch:
        fields["tied_embeddings"] = None
    fields.update(overrides)
    fields["name"] = f"{found.name.rstrip('*')}*"  # marks a preset with overridden fields
    return ModelSpec.from_dict(fields, source="model flags")


def resolve_cluster(
    cluster: str | ClusterSpec | None = None,
    cluster_file: str | Path | None = None,
    *,
    default: str | None = "frontier",
) -> ClusterSpec:
    """A catalog name, a ClusterSpec or a cluster file; else the ``default`` catalog cluster."""
    if cluster is not None and cluster_file is not None:
        raise UserError("give either --cluster or --cluster-file, not both")
    if isinstance(cluster, ClusterSpec):
        return cluster
    if cluster_file is not None:
        return load_cluster_file(check_input_file(cluster_file, "--cluster-file"))
    if cluster is None and default is None:
        raise UserError("no cluster: pass --cluster NAME or --cluster-file PATH")
    return get_cluster(cluster or default)  # type: ignore[arg-type]


def _dp(gpus: int | None, dp: int | None, tp: int, pp: int, cp: int, base: Plan | None) -> int:
    """dp as given (checked against ``gpus``), else gpus / (tp*cp*pp), else the base plan's, else 1."""
    ranks = tp * pp * cp
    what = "tp*pp" if cp == 1 else "tp*cp*pp"
    sizes = f"{tp}*{pp}" if cp == 1 else f"{tp}*{cp}*{pp}"
    if dp is not None:
        if gpus is not None and gpus != ranks * dp:
            raise PlanError(f"--gpus {gpus} != {what}*dp = {sizes}*{dp} = {ranks * dp}; drop --dp to derive it")
        return dp
    if gpus is not None:
        if gpus % ranks:
            raise PlanError(f"--gpus {gpus} is not divisible by {what} = {sizes} = {ranks}")
        return gpus // ranks
    return base.dp if base else 1


def _pick(given: Any, from_base: Any, default: Any) -> Any:
    """A value given wins, then the base plan's, then the default."""
    if given is not None:
        return given
    return default if from_base is None else from_base


def make_plan(
    model: str | ModelSpec,
    cluster: str | ClusterSpec | None = None,
    *,
    layout: Layout | None = None,
    settings: SettingsArg = None,
    gpus: int | None = None,
    base: Plan | None = None,
    default_dtype: str = "bfloat16",
    **pins: Any,
) -> Plan:
    """Layout values (None: the base plan's, else the module doc's default) -> a validated Plan.
    dp is derived from ``gpus`` when not given (gpus / (tp*cp*pp)); given both, they must agree.
    ``layout.ep`` (default 1) splits the experts over ep ranks (``plan.ParallelDims``), ``layout.cp`` (default 1)
    the sequence over cp ranks; ``settings``: the run settings (a RunSettings or a mapping by name; None: the base
    plan's, else the default: "the runtime's own" for most; ``recompute_modules`` may be "layernorm,moe_act" or a
    list); its ``runtime``: the engine that runs it (default exatrain), which decides where ep may reach
    (``rules.ep_fits``). Layout fields and settings may also be given flat by name (``make_plan(m, c, gpus=8,
    tp=2, fp8="current")``)."""
    check_counts({"gpus": gpus})
    r = routed("make_plan", pins, {"layout": coerce(Layout, layout, "")}, settings)
    given = dict(r["settings"])
    runtime = given.pop("runtime", None)
    if given.get("recompute_layers") == "auto":
        raise UserError(
            "--recompute-layers auto lets a search fit each layout's own; one plan takes a number "
            "(search or scaling with auto, then its plan)"
        )
    m = get_model(model) if isinstance(model, str) else model
    c = get_cluster(cluster) if isinstance(cluster, str) else cluster
    b, lay = base, r["layout"]
    tp = _pick(lay.tp, b and b.tp, 1)
    pp = _pick(lay.pp, b and b.pp, 1)
    cp = _pick(lay.cp, b and b.cp, 1)
    ep = _pick(lay.ep, b.ep if b is not None and b.model == m else None, 1)  # experts belong to the base's model
    dp = _dp(gpus, lay.dp, tp, pp, cp, b)
    micro = _pick(lay.micro_batch, b and b.micro_batch, 1)
    global_batch = lay.global_batch
    if global_batch is None:
        same = b is not None and b.dp == dp and b.micro_batch == micro
        global_batch = b.global_batch if same else micro * dp * (4 * pp if pp > 1 else 1)  # type: ignore[union-attr]
    schedule = _pick(lay.schedule, b and b.schedule, "1f1b")
    interleave = _pick(
        lay.interleave,
        b and b.interleave,
        2 if schedule in ("interleaved", "zero_bubble", "zbv", "dualpipev") and pp > 1 else 1,
    )
    stage_layers = lay.stage_layers
    if stage_layers is None:
        keep = b is not None and b.pp == pp and b.interleave == interleave and b.model == m
        stage_layers = b.stage_layers if keep else ()  # type: ignore[union-attr]
    plan = Plan(
        model=m,
        dims=ParallelDims(tp=tp, pp=pp, dp=dp, ep=ep, cp=cp),
        shape=TrainShape(micro_batch=micro, global_batch=global_batch),
        zero_stage=_pick(lay.zero, b and b.zero_stage, 0),
        recompute=_pick(lay.recompute, b and b.recompute, "none"),
        sequence_parallel=bool(_pick(lay.sequence_parallel, b and b.sequence_parallel, False)),
        schedule=schedule,
        interleave=interleave,
        stage_layers=tuple(stage_layers),
        dtype=_pick(lay.dtype, b and b.dtype, default_dtype),
        flash_attention=bool(_pick(lay.flash_attention, b and b.flash_attention, True)),
        cluster=c.name if c is not None else (b.cluster if b else ""),
        settings=RunSettings.of(given, base=b and b.settings).replace(runtime=runtime or "exatrain"),
    )
    return plan.validate(c)


def layout_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The layout values and run settings (but the runtime) among ``values``: a function's keyword arguments,
    whose run settings may sit in its ``**settings``."""
    given = {**values, **(values.get("settings") or {})}
    return {k: given.get(k) for k in (*LAYOUT_FIELDS, *NAMES) if k != "runtime"}


def shape_of(values: Mapping[str, Any]) -> dict[str, Any]:
    """The model shape values among ``values``."""
    return {k: values.get(k) for k in MODEL_FIELDS}


def load_plan(path: str | Path | Plan, *, flag: str = "--plan", warn: Warn | None = None) -> Plan:
    """A Plan (with its estimate, when the file has one) from a plan file (`estimate/search --out`),
    `estimate --json` output, a RunRecord line's object, or `search --json` output: its first
    ranked plan, the best (``warn`` says so)."""
    from exatrain.report.inputs import classify, plan_from_json

    if isinstance(path, Plan):
        return path
    d = read_json(check_input_file(path, flag))
    if classify(d) == "search":
        if not d["ranked"]:
            raise UserError(f"{path}: a search result with no ranked plan (the search found no feasible layout)")
        warner(warn)(f"{path} is a search result: using its first ranked plan (of {len(d['ranked'])})")
        return plan_from_json(d["ranked"][0], f"{path}: ranked[0]")
    if classify(d) in ("estimate", "run_record"):
        return plan_from_json(d, str(path))
    return Plan.from_dict(d, source=str(path))


# estimate's and search's --from (from_launch, with_launch)
FROM_HELP = (
    "a launch to start from: a Megatron-LM or Megatron-DeepSpeed script running pretrain_gpt.py (its flags, "
    "variables, torchrun/deepspeed/srun line and DeepSpeed JSON), or a torchtitan job TOML (export-config "
    "writes all three); its model, world size, layout, batch, precision, recomputation, runtime and overlaps, "
    "flags given here winning (--overlap: any given); one line names what it leaves to the engine's "
    "defaults"
)


def from_launch(
    path: str | Path,
    *,
    gpus: int | None = None,
    model: bool = True,
    shape: Mapping[str, Any] | None = None,
    warn: Warn | None = None,
) -> dict[str, Any]:
    """The ``estimate`` / ``search`` keyword arguments a launch states: a Megatron-LM or Megatron-DeepSpeed script
    (pretrain_gpt.py and its flags, the DeepSpeed JSON beside it) or a torchtitan job TOML, as
    ``engine_configs.reading`` reads it — ``model`` (a ModelSpec; with ``model=False`` none, the caller gives its
    own), ``gpus``, the layout by ``make_plan``'s names, ``runtime`` and ``overlap``. One warning line names what the
    file leaves to the engine's defaults, one the options it has that exatrain does not read, one each what is read
    otherwise than the file says. ``gpus``: the caller's world size, which wins over the file's (and gives one the
    file leaves to its launcher); ``shape``: model shape values (vocab, layers, ...) filling or replacing the file's.
    Use: ``estimate(**from_launch("pretrain.sh"), cluster="dgx-h100")``."""
    from exatrain.engine_configs.reading import read_launch, side_file_names

    p = check_input_file(path, "--from")
    text = p.read_text(encoding="utf-8", errors="replace")
    side: dict[str, str] = {}
    for name in side_file_names(text, source=str(p)):
        found = next((c for c in (p.parent / name, Path(name)) if c.is_file()), None)
        if found is not None:
            side[name] = found.read_text(encoding="utf-8", errors="replace")
    read = read_launch(text, source=str(p), side_files=side, gpus=gpus)
    world = gpus or read.gpus
    if world is None:
        raise UserError(f"{p}: the world size is not stated ({read.world}); pass --gpus")
    values: dict[str, Any] = {**read.settings, "runtime": read.runtime, "overlap": read.overlap, "gpus": world}
    if model:
        values["model"] = read.model(p.stem, source=str(p), **dict(shape or {}))
    say = warner(warn)  # once the file is read whole: a refused file gets its one line only
    if read.defaults:
        say(f"{p.name} leaves to {read.source}'s defaults: {'; '.join(read.defaults)}")
    if read.unknown:
        say(f"{p.name}: options exatrain does not read (not planned): {', '.join(read.unknown)}")
    for note in read.notes:
        say(f"{p.name}: {note}")
    return values


def launch_request(
    path: str | Path, *, gpus: int | None = None, shape: Mapping[str, Any] | None = None, warn: Warn | None = None
) -> PlanRequest:
    """What a launch states (``from_launch``) as the requests a planner call takes: its model (ModelQuery), world
    size (ClusterQuery.gpus; ``gpus`` wins), Layout, Engine (runtime, overlap) and run settings. Use:
    ``r = launch_request("pretrain.sh"); estimate(r.model, "dgx-h100", layout=r.layout, engine=r.engine,
    settings=r.settings, gpus=r.cluster.gpus)``."""
    values = from_launch(path, gpus=gpus, shape=shape, warn=warn)
    return PlanRequest(
        model=ModelQuery(model=values["model"]),
        cluster=ClusterQuery(gpus=values["gpus"]),
        layout=_fill(Layout(), values),
        engine=_fill(Engine(), values),
        settings={k: v for k, v in values.items() if k in NAMES and k != "runtime" and v is not None},
    )


def with_launch(r: PlanRequest, call: str) -> PlanRequest:
    """The request ``r`` (estimate's or search's, with ``options.from_file``) with what the launch file states
    (``from_launch``) in place of every value left at its default: values given win (``engine.overlap``: any given;
    its default, None, is not stated). Search takes no stage split from it (it chooses one; a warning says so)."""
    path = r.options.from_file
    own_model = r.model.model is not None or r.model.model_file is not None
    shape = {} if own_model else {k: v for k, v in r.model.shape().items() if v is not None}
    gpus = r.cluster.gpus
    values = from_launch(path, gpus=gpus if isinstance(gpus, int) else None, model=not own_model, shape=shape)
    check_counts(values)
    model = r.model if own_model else ModelQuery()  # the shape values are in the file's model now
    if call == "search" and values.pop("stage_layers", None):
        warner(None)(f"{Path(path).name}: its stage split is not pinned (search chooses the split)")
    parts = {k: _fill(getattr(r, k), values) for k in ("cluster", "layout", "engine")}
    settings = {**{k: v for k, v in values.items() if k in NAMES and k != "runtime"}, **r.settings}
    return r.replace(
        model=_fill(model, values), **parts, settings=settings, options=dataclasses.replace(r.options, from_file=None)
    )


def _fill(part: Any, values: Mapping[str, Any]) -> Any:
    """``part`` (a request) with ``values`` in place of each of its fields left at its default."""
    left = {f.name: values[f.name] for f in dataclasses.fields(part) if f.name in values}
    return dataclasses.replace(part, **{k: v for k, v in left.items() if getattr(part, k) == _default(part, k)})


def _default(part: Any, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(part) if f.name == name)


def calibrated(cluster: ClusterSpec, calibration: str | Path | None, runtime: str = "") -> tuple[ClusterSpec, Any]:
    """(the cluster with the calibration's measured link tiers, its cost parameters: those `exatrain calibrate`
    fitted to this cluster's runs of ``runtime``, else the cluster's device's), or (cluster, None) without a
    calibration file."""
    if calibration is None:
        return cluster, None
    from exatrain.planner.cost.coefficients import load_calibration

    cal = load_calibration(check_input_file(calibration, "--calibration"))
    params = cal.params_for(cluster.device.name, cluster.name, runtime)
    if params is None:
        fits = ", ".join(f"{c}/{r}" for c, r in sorted(cal.fits))
        raise UserError(
            f"{calibration} has no parameters for device {cluster.device.name!r} "
            f"(it has: {', '.join(sorted(cal.devices)) or 'none'})"
            + (f" nor for {cluster.name}/{runtime} (fitted: {fits})" if fits else "")
        )
    return cal.apply(cluster), params


def _check_split_checkpoints(settings: dict, *, recompute, tp, sequence_parallel) -> bool:
    """Whether the search is asked for full recomputation's checkpoints split over tp ranks (then only such
    candidates: search.space._grid keeps tp > 1); a pinned value that cannot split them is refused in one line."""
    if not settings.get("distribute_saved_activations"):
        return False
    from exatrain.registry.problems import distribute_saved_problem

    pinned = SimpleNamespace(
        runtime=settings.get("runtime") or "megatron-core",
        recompute=recompute or "full",
        tp=tp or 2,
        sequence_parallel=bool(sequence_parallel),
    )
    if problem := distribute_saved_problem(True, pinned):
        raise UserError(problem)
    return True


def space_options(
    *,
    tp: int | None = None,
    pp: int | None = None,
    dp: int | None = None,
    micro_batch: int | None = None,
    zero: int | None = None,
    recompute: str | None = None,
    sequence_parallel: bool | None = None,
    schedule: str | None = None,
    interleave: int | None = None,
    stage_layers: Any = None,
    ep: int | None = None,
    cp: int | None = None,
    **settings: Any,
):
    """The search space with the given layout values pinned (search chooses dp and the stage split)."""
    from exatrain.planner.search.space import RECOMPUTE_LAYERS_AUTO, SCHEDULE_VARIANTS, SpaceOptions

    if stage_layers is not None or dp is not None:
        raise UserError(
            "search chooses dp and the stage split itself; drop --dp / --stage-layers (pin --tp / --pp instead)"
        )
    recompute_layers, recompute_every = settings.get("recompute_layers"), settings.get("recompute_every")
    modules = recompute_modules_of(settings.get("recompute_modules"))
    check_settings(settings, recompute=recompute)  # the pinned --recompute against what the settings rerun
    auto = recompute_layers == "auto"  # each full-recomputation candidate fits its own (search.batch)
    if (recompute_layers or recompute_every) and modules:
        raise UserError(
            f"--{'recompute-layers' if recompute_layers else 'recompute-every'} goes with --recompute "
            "full, --recompute-modules with selective: choose one"
        )
    if recompute_layers and recompute_every:
        raise UserError("--recompute-layers is Megatron-Core's, --recompute-every torchtitan's: choose one")
    split = _check_split_checkpoints(settings, recompute=recompute, tp=tp, sequence_parallel=sequence_parallel)
    variants = SCHEDULE_VARIANTS
    if schedule is not None:
        variants = tuple(v for v in variants if v[0] == schedule)
    if interleave is not None:
        variants = tuple(
            (s, interleave)
            for s in dict.fromkeys(s for s, _ in variants)
            if (interleave == 1) == (s in ("gpipe", "1f1b"))
        )
        if not variants:
            raise UserError(f"--interleave {interleave} does not go with --schedule {schedule}")
    return SpaceOptions(
        tp=(tp,) if tp else None,
        pp=(pp,) if pp else None,
        micro_batch=(micro_batch,) if micro_batch else None,
        zero_stage=(zero,) if zero is not None else (0, 1, 2, 3),
        # modules name what selective reruns: every candidate is selective
        recompute=(
            ("selective",)
            if modules
            else ("full",)
            if (recompute_layers and not auto) or recompute_every or split
            else (recompute,)
            if recompute
            else ("none", "selective", "full")
        ),
        sequence_parallel=(sequence_parallel,)
        if sequence_parallel is not None
        else (False,)
        if split
        else (False, True),
        schedules=variants,
        ep=(ep,) if ep else None,
        cp=(cp,) if cp else None,
        settings=RunSettings.of({**settings, "recompute_layers": None, "runtime": None}).replace(
            recompute_layers=RECOMPUTE_LAYERS_AUTO if auto else recompute_layers or 0
        ),
    )


__all__ = [
    "ExatrainWarning",
    "FROM_HELP",
    "LAYOUT_FIELDS",
    "MODEL_FIELDS",
    "calibrated",
    "from_launch",
    "launch_request",
    "layout_values",
    "load_plan",
    "make_plan",
    "resolve_cluster",
    "resolve_model",
    "shape_of",
    "space_options",
    "warner",
    "with_launch",
]
