"""A torchtitan job TOML read back (the file ``--job.config_file`` takes; what ``export-config --for torchtitan``
writes). Sections, keys and defaults are torchtitan v0.2.2's (torchtitan/config/job_config.py, the version the
exporter targets): local_batch_size 8, global_batch_size -1 (local x dp), seq_len 2048, data_parallel_shard_degree
-1 (every rank left), fsdp_reshard_after_forward "default" (reshard unless pipelined), pipeline_parallel_schedule
1F1B, activation_checkpoint selective with selective_ac_option "2", compile off, mixed_precision_param bfloat16.

The model is the flavor's: the model arguments an export's header registers for it (any family's:
engine_configs.torchtitan.registered_model), else torchtitan's own flavor of that name (engine_configs.torchtitan.
FLAVORS: llama3, qwen3, deepseek_v3, gpt_oss), read as the first catalog preset that is the same network, else the
catalog preset the flavor is named after.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from exatrain.accounting.engines import get_engine
from exatrain.catalog.models import ModelSpec, model_presets
from exatrain.engine_configs.read_common import AttentionShape, LaunchRead, positive
from exatrain.engine_configs.torchtitan import SCHEDULE_NAMES, architecture, flavor_model, registered_model
from exatrain.errors import UserError
from exatrain.plan import balanced_split
from exatrain.settings import cp_comm_for

TORCHTITAN_SECTIONS = (
    "job",
    "model",
    "training",
    "parallelism",
    "activation_checkpoint",
    "compile",
    "float8",
    "quantize",
    "optimizer",
    "lr_scheduler",
    "checkpoint",
    "metrics",
    "profiling",
    "comm",
    "validation",
    "fault_tolerance",
    "experimental",
    "memory_estimation",
    "debug",
)
# keys read without a word (they change nothing a plan holds); every other key not read is named
_IGNORED = {
    "job": None,
    "optimizer": {"name", "lr", "eps", "beta1", "beta2", "weight_decay", "early_step_in_backward"},
    "lr_scheduler": None,
    "checkpoint": None,
    "metrics": None,
    "profiling": None,
    "comm": None,
    "validation": None,
    "fault_tolerance": None,
    "experimental": None,
    "memory_estimation": None,
    "model": {"hf_assets_path", "tokenizer_path", "print_after_conversion"},
    "training": {
        "dataset",
        "dataset_path",
        "steps",
        "max_norm",
        "gc_freq",
        "gc_debug",
        "seed",
        "deterministic",
        "dataloader",
        "warmup_steps",
    },
    "parallelism": {
        "disable_loss_parallel",
        "pipeline_parallel_split_points",
        "context_parallel_load_balancer",
        "expert_parallel_comm_backend",
        "pipeline_parallel_schedule_csv",
    },
    "activation_checkpoint": {"preserve_rng_state", "determinism_check", "debug", "early_stop"},
    "debug": {"seed", "deterministic", "deterministic_warn_only"},
}


def looks_like_toml(text: str) -> bool:
    """A torchtitan job file: TOML with one of its sections (a shell script does not parse as TOML)."""
    data = _parse(text)
    return data is not None and any(k in data for k in TORCHTITAN_SECTIONS)


def _parse(text: str) -> dict | None:
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        return tomllib.loads(text)
    except (ValueError, TypeError):
        return None


class _Toml:
    """The sections; every read marks the key used, so the rest can be named."""

    def __init__(self, data: Mapping[str, Any], text: str, source: str) -> None:
        self.data, self.text, self.source, self.used = data, text, source, set()

    def get(self, section: str, key: str, default: Any = None) -> Any:
        self.used.add((section, key))
        table = self.data.get(section)
        if table is not None and not isinstance(table, dict):
            raise UserError(f"{self.source}: [{section}] is not a table")
        return default if table is None or key not in table else table[key]

    def has(self, section: str, key: str) -> bool:
        self.used.add((section, key))
        return isinstance(self.data.get(section), dict) and key in self.data[section]

    def int(self, section: str, key: str, default: int) -> int:
        value = self.get(section, key, default)
        if not isinstance(value, int) or isinstance(value, bool):
            raise UserError(f"{self.source}: {section}.{key} must be an integer, got {value!r}")
        return value

    def unknown(self) -> list[str]:
        out = []
        for section, table in self.data.items():
            if section == "quantize":
                table = (
                    {f"linear.{k}": v for k, v in (table.get("linear") or {}).items()}
                    if isinstance(table, dict)
                    else {}
                )
                out += [f"quantize.{k}" for k in table if ("quantize", k) not in self.used]
                continue
            ignored = _IGNORED.get(section, set())
            if section not in _IGNORED and section not in {s for s, _ in self.used}:
                out.append(f"[{section}]")
                continue
            if ignored is None or not isinstance(table, dict):
                continue
            out += [f"{section}.{k}" for k in table if (section, k) not in self.used and k not in ignored]
        return out


def _load(text: str, source: str) -> dict[str, Any]:
    """The job file's tables; UserError for text that is not TOML or holds no torchtitan section."""
    data = _parse(text)
    if data is None:
        try:
            import tomllib
        except ModuleNotFoundError:  # pragma: no cover - Python 3.10
            import tomli as tomllib  # type: ignore[no-redef]
        try:
            tomllib.loads(text)
        except (ValueError, TypeError) as exc:
            raise UserError(f"{source}: not valid TOML: {str(exc).splitlines()[0]}") from None
    if not any(k in data for k in TORCHTITAN_SECTIONS):
        raise UserError(
            f"{source}: no torchtitan section ([model], [training], [parallelism], ...): not a torchtitan job file"
        )
    return data


def _degrees(t: _Toml, source: str, gpus: int | None, defaults: list[str]) -> tuple[int, int, int, int, int]:
    """(tp, pp, cp, replicate, shard) of [parallelism]; a shard degree of -1 (every rank left) resolved from
    ``gpus`` where given, else kept -1."""
    tp = t.int("parallelism", "tensor_parallel_degree", 1)
    pp = t.int("parallelism", "pipeline_parallel_degree", 1)
    cp = t.int("parallelism", "context_parallel_degree", 1)
    replicate = t.int("parallelism", "data_parallel_replicate_degree", 1)
    shard = t.int("parallelism", "data_parallel_shard_degree", -1)
    for what, n in (
        ("tensor_parallel_degree", tp),
        ("pipeline_parallel_degree", pp),
        ("context_parallel_degree", cp),
        ("data_parallel_replicate_degree", replicate),
    ):
        positive(n, f"parallelism.{what}", source)
    if shard == -1:
        if not t.has("parallelism", "data_parallel_shard_degree"):
            defaults.append("data_parallel_shard_degree (-1: every rank left)")
        if gpus is not None:
            rest = gpus // (tp * pp * cp * replicate) if gpus % (tp * pp * cp * replicate) == 0 else None
            if rest is None:
                raise UserError(
                    f"{source}: --gpus {gpus} is not a multiple of tp*pp*cp*replicate {tp * pp * cp * replicate}"
                )
            shard = rest
    elif shard < 1:
        raise UserError(f"{source}: parallelism.data_parallel_shard_degree must be -1 or positive, got {shard}")
    return tp, pp, cp, replicate, shard


@dataclass(frozen=True)
class _DataParallel:
    """The data-parallel split read: replicate (DDP) x shard (FSDP2) degrees, dp (None while the shard degree
    is left to the launcher) and the pipeline degree, on which FSDP's resharding default depends."""

    replicate: int
    shard: int
    dp: int | None
    pp: int


def _zero(t: _Toml, s: dict[str, Any], d: _DataParallel, read: tuple[str, list[str], list[str]]) -> bool:
    """ZeRO: FSDP2 over the shard degree (its resharding: ZeRO-3 or -2), DDP over the replicate degree; whether
    FSDP is on. ``read``: (source, defaults, notes)."""
    source, defaults, notes = read
    if not (d.shard > 1 or d.shard == -1):
        s["zero"] = 0
        return False
    reshard = t.get("parallelism", "fsdp_reshard_after_forward", "default")
    if reshard == "default":
        defaults.append(f"fsdp_reshard_after_forward (default: {'never, pipelined' if d.pp > 1 else 'always'})")
        reshard = "never" if d.pp > 1 else "always"
    if reshard not in ("always", "never"):
        raise UserError(f"{source}: fsdp_reshard_after_forward {reshard!r} is not always, never or default")
    s["zero"] = 3 if reshard == "always" else 2
    if d.replicate > 1:
        notes.append(
            f"HSDP (replicate {d.replicate} x shard {d.shard}) is priced as FSDP over all {d.dp} data-parallel ranks"
        )
    return True


def _mixed_precision(t: _Toml, s: dict[str, Any], through_wrapper: bool, source: str) -> None:
    """dtype and grad_accum: mixed precision comes through FSDP (or DDP-only autocast), ``through_wrapper``;
    otherwise training.dtype."""
    param = t.get("training", "mixed_precision_param", "bfloat16")
    own = t.get("training", "dtype", "float32")
    s["dtype"] = param if through_wrapper else own
    if s["dtype"] not in ("bfloat16", "float32"):
        raise UserError(f"{source}: precision {s['dtype']!r} is not planned (bfloat16 or float32)")
    reduce = t.get("training", "mixed_precision_reduce", "float32")
    if reduce != get_engine("torchtitan").accum_dtype(s["dtype"]):
        s["grad_accum"] = {"bfloat16": "bfloat16", "float32": "float32"}.get(reduce, reduce)


def _context_exchange(t: _Toml, s: dict[str, Any], model: dict[str, Any], source: str) -> None:
    """cp_comm from context_parallel_rotate_method, set only where it differs from the engine's default."""
    rotate = t.get("parallelism", "context_parallel_rotate_method", "allgather")
    comm = {"allgather": "all_gather", "alltoall": "p2p"}.get(rotate)
    if comm is None:
        raise UserError(f"{source}: context_parallel_rotate_method {rotate!r} is not allgather or alltoall")
    if comm != cp_comm_for("torchtitan", "", AttentionShape(model)):
        s["cp_comm"] = comm


def _experts(t: _Toml, s: dict[str, Any], model: dict[str, Any], notes: list[str]) -> None:
    """ep of a MoE model (expert-tensor parallelism noted, not modelled); the keys read either way."""
    if model.get("experts"):
        s["ep"] = t.int("parallelism", "expert_parallel_degree", 1)
        etp = t.int("parallelism", "expert_tensor_parallel_degree", 1)
        if etp != 1:
            notes.append(f"expert_tensor_parallel_degree {etp} is not modelled: experts priced whole on each rank")
    else:
        for key in ("expert_parallel_degree", "expert_tensor_parallel_degree"):
            t.get("parallelism", key)


def read_torchtitan(text: str, *, source: str, gpus: int | None = None) -> LaunchRead:
    """The job file ``text`` as a LaunchRead (the module doc); ``gpus``: the world size when the file leaves the
    data-parallel shard degree to it (-1)."""
    t = _Toml(_load(text, source), text, source)
    defaults: list[str] = []
    notes: list[str] = []
    s: dict[str, Any] = {}
    tp, pp, cp, replicate, shard = _degrees(t, source, gpus, defaults)
    dp = replicate * shard if shard > 0 else None
    world = dp * tp * pp * cp if dp else None
    s.update(tp=tp, pp=pp)
    if cp > 1:
        s["cp"] = cp
    model, missing = _model(t, source, defaults)
    fsdp = _zero(t, s, _DataParallel(replicate, shard, dp, pp), (source, defaults, notes))
    _mixed_precision(t, s, fsdp or (tp == 1 and pp == 1), source)
    s["sequence_parallel"] = tp > 1  # torchtitan's TP always shards the norms
    _pipeline(t, s, model.get("layers", 0), pp, source, defaults)
    _batch(t, s, dp, pp, defaults, source)
    _recompute(t, s, source, defaults)
    if cp > 1:
        _context_exchange(t, s, model, source)
    _experts(t, s, model, notes)
    _precision_extras(t, s, source)
    if s.get("fp8_param_gather") and not (fsdp and (dp or 2) > 1):
        del s["fp8_param_gather"]
        notes.append("enable_fsdp_float8_all_gather without FSDP (one data-parallel rank) gathers nothing: not planned")
    overlap = "tp,dp_param_gather,dp_grad_reduce" if _async_tp(t) else "default"
    if overlap == "default":
        defaults.append("overlap (FSDP2's prefetch and reduce-scatter on; async TP off)")
    return LaunchRead(
        source="torchtitan",
        runtime="torchtitan",
        model_fields=model,
        model_missing=missing,
        settings=s,
        gpus=world or gpus,
        overlap=overlap,
        world="the parallelism degrees" if world else "data_parallel_shard_degree -1 leaves it to the launcher",
        defaults=tuple(defaults),
        unknown=tuple(t.unknown()),
        notes=tuple(notes),
    )


def _model(t: _Toml, source: str, defaults: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The flavor's ModelSpec fields (module doc) at training.seq_len."""
    name, flavor = t.get("model", "name", "llama3"), str(t.get("model", "flavor", "debugmodel"))
    t.get("model", "converters")
    seq = t.get("training", "seq_len", None)
    if seq is None:
        defaults.append("training.seq_len (2048)")
        seq = 2048
    seq = positive(seq, "training.seq_len", source)
    registered = _registered(t).get((name, flavor))
    builtin = flavor_model(name, flavor)
    presets = model_presets()
    if registered is not None:  # the header's own line: its fields, rope base and epsilon included
        spec = registered
    elif builtin is not None:  # torchtitan's flavor, read as the first catalog preset that is the same network
        spec = next((p for p in presets.values() if architecture(p) == architecture(builtin)), builtin)
    else:
        spec = presets.get(flavor)
    if spec is None:
        why = f"torchtitan's {name} flavor {flavor!r} is not one exatrain knows: pass --model or --model-file"
        return {"seq_len": seq}, {"shape": why}
    fields = spec.to_dict()
    fields.pop("name")
    fields.pop("description", None)
    return {**fields, "seq_len": seq}, {}


def _registered(t: _Toml) -> dict[tuple[str, str], ModelSpec]:
    """The flavors an export's header registers (the line after "# Register the model as a flavor ..."), read as
    torchtitan's model args give them (engine_configs.torchtitan.registered_model)."""
    lines = t.text.splitlines()
    out = {}
    for i, line in enumerate(lines[:-1]):
        if line.startswith("# Register the model"):
            try:
                family, flavor, model = registered_model(lines[i + 1].lstrip("#").strip(), 2048)
            except UserError as exc:
                raise UserError(f"{t.source}: {exc}") from None
            out[(family, flavor)] = model
    return out


def _pipeline(t: _Toml, s: dict[str, Any], layers: int, pp: int, source: str, defaults: list[str]) -> None:
    schedule = t.get("parallelism", "pipeline_parallel_schedule", "1F1B")
    parts = t.get("parallelism", "module_fqns_per_model_part")
    per_stage = t.get("parallelism", "pipeline_parallel_layers_per_stage")
    for key in ("pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers"):
        t.get("parallelism", key)
    if pp == 1:
        return
    inverse = {v: k for k, v in SCHEDULE_NAMES.items()}
    if schedule not in inverse:
        raise UserError(f"{source}: pipeline_parallel_schedule {schedule!r} is not modelled ({', '.join(inverse)})")
    s["schedule"] = inverse[schedule]
    multi = s["schedule"] in ("interleaved", "zero_bubble", "zbv", "dualpipev")
    if parts is not None:
        counts = []
        for part in parts:
            if not isinstance(part, list):
                raise UserError(f"{source}: module_fqns_per_model_part must be a list of lists of module names")
            counts.append(sum(1 for name in part if re.fullmatch(r"layers\.\d+", str(name))))
        if len(counts) % pp:
            raise UserError(f"{source}: module_fqns_per_model_part has {len(counts)} parts, not a multiple of pp {pp}")
        if layers and sum(counts) != layers:
            raise UserError(f"{source}: module_fqns_per_model_part holds {sum(counts)} layers, the model {layers}")
        s["interleave"] = len(counts) // pp
        if not (layers and tuple(counts) == balanced_split(layers, len(counts))):
            s["stage_layers"] = tuple(counts)
    elif per_stage is not None and layers:
        stages = math.ceil(layers / positive(per_stage, "pipeline_parallel_layers_per_stage", source))
        if stages % pp:
            raise UserError(
                f"{source}: {stages} stages of pipeline_parallel_layers_per_stage {per_stage} do not "
                f"spread over pp {pp}"
            )
        s["interleave"] = stages // pp
    else:
        s["interleave"] = 2 if multi else 1
        if multi:
            defaults.append("virtual stages per rank (2)")
    if multi != (s["interleave"] > 1):
        raise UserError(f"{source}: schedule {schedule} with {s['interleave']} stage(s) per rank does not run")


def _batch(t: _Toml, s: dict[str, Any], dp: int | None, pp: int, defaults: list[str], source: str) -> None:
    local = t.get("training", "local_batch_size", None)
    if local is None:
        defaults.append("training.local_batch_size (8)")
        local = 8
    local = positive(local, "training.local_batch_size", source)
    micro = t.get("parallelism", "pipeline_parallel_microbatch_size", 1) if pp > 1 else local
    s["micro_batch"] = positive(micro, "pipeline_parallel_microbatch_size", source)
    if pp > 1 and local % s["micro_batch"]:
        raise UserError(
            f"{source}: local_batch_size {local} is not a multiple of pipeline_parallel_microbatch_size "
            f"{s['micro_batch']}"
        )
    glob = t.get("training", "global_batch_size", -1)
    if glob in (-1, None):
        if dp is None:
            raise UserError(
                f"{source}: global_batch_size -1 (local x data-parallel size) with the data-parallel size "
                "left to the launcher: pass --gpus"
            )
        defaults.append("training.global_batch_size (local x dp)")
        glob = local * dp
    s["global_batch"] = positive(glob, "training.global_batch_size", source)
    if dp is not None and s["global_batch"] % (local * dp):
        raise UserError(
            f"{source}: global_batch_size {glob} is not a multiple of local_batch_size {local} x "
            f"data-parallel size {dp}"
        )


def _recompute(t: _Toml, s: dict[str, Any], source: str, defaults: list[str]) -> None:
    if not isinstance(t.data.get("activation_checkpoint"), dict):
        defaults.append("activation_checkpoint (selective, selective_ac_option 2)")
    mode = t.get("activation_checkpoint", "mode", "selective")
    option = str(t.get("activation_checkpoint", "selective_ac_option", "2"))
    if mode == "none":
        s["recompute"] = "none"
    elif mode == "full":
        s["recompute"] = "full"
    elif mode == "selective" and option == "op":
        s["recompute"] = "selective"
    elif mode == "selective" and option.isdigit() and int(option) > 0:
        s["recompute"] = "full"  # layer-level: every N-th block checkpointed whole
        if int(option) > 1:
            s["recompute_every"] = int(option)
    else:
        raise UserError(
            f"{source}: activation_checkpoint mode {mode!r} with selective_ac_option {option!r} is not modelled"
        )
    for key in ("per_op_sac_force_recompute_mm_shapes_by_fqns", "memory_budget", "visualize_memory_budget_pareto"):
        t.get("activation_checkpoint", key)


def _precision_extras(t: _Toml, s: dict[str, Any], source: str) -> None:
    """Float8, compile, the Adam kernel, forced routing."""
    engine = get_engine("torchtitan")
    converters = t.get("model", "converters", []) or []
    if any(c in ("quantize.linear.float8", "float8") for c in converters):
        table = (
            (
                t.data.get("quantize", {}).get("linear", {}).get("float8")
                if isinstance(t.data.get("quantize"), dict)
                else None
            )
            or t.data.get("float8")
            or {}
        )
        for key in table:
            t.used.add(("quantize", f"linear.float8.{key}") if "quantize" in t.data else ("float8", key))
            t.used.add(("quantize", "linear.float8"))
        if table.get("enable_fsdp_float8_all_gather"):
            s.update(fp8="current", fp8_param_gather=True)
        else:
            recipe = table.get("recipe_name", "tensorwise")
            fp8 = {"tensorwise": "current", "rowwise": "block", "rowwise_with_gw_hp": "block"}.get(recipe)
            if fp8 is None:
                raise UserError(f"{source}: float8 recipe_name {recipe!r} is not modelled")
            s["fp8"] = fp8
    elif isinstance(t.data.get("quantize"), dict):
        t.used.add(("quantize", "linear.float8"))
    components = t.get("compile", "components", ["model", "loss"]) if t.get("compile", "enable", False) else []
    if "model" in components:
        s["elementwise"] = "fused"
    ce = "fused" if "loss" in components else "upcast"
    if ce != engine.cross_entropy("", s.get("elementwise", "")):
        s["cross_entropy"] = ce
    implementation = t.get("optimizer", "implementation")
    if implementation not in (None, "fused", "foreach"):
        raise UserError(f"{source}: optimizer.implementation {implementation!r} is not fused or foreach")
    if implementation == "foreach":
        s["adam_kernel"] = "foreach"
    if t.get("debug", "moe_force_load_balance", False):
        s["moe_force_balance"] = True


def _async_tp(t: _Toml) -> bool:
    return bool(
        t.get("parallelism", "enable_async_tensor_parallel", False)
        or t.get("compile", "enable_async_tensor_parallel", False)
    )


__all__ = ["TORCHTITAN_SECTIONS", "looks_like_toml", "read_torchtitan"]
