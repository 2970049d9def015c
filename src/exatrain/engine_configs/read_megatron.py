"""A Megatron-LM or Megatron-DeepSpeed launch read back: the script's ``pretrain_gpt.py`` command (after
``torchrun`` / ``python -m torch.distributed.run`` / ``deepspeed`` / ``srun``, its words expanded as bash would
expand the variables and arrays the script assigns), or the ``MEGATRON_ARGS`` / ``MEGATRON_DEEPSPEED_ARGS``
array of an ``export-config`` file; the DeepSpeed JSON its ``--deepspeed_config`` names (written by the script's
own here-document, or a file beside it). Option names and defaults are those of the versions the exporters target
(engine_configs/megatron.py: Megatron-LM d98e8a64 megatron/training/arguments.py, Megatron-DeepSpeed 4efb479d
megatron/arguments.py, DeepSpeed edaa7221 deepspeed/runtime/constants.py).

The world size comes from the launcher (torchrun --nproc_per_node x --nnodes, deepspeed --num_gpus x --num_nodes,
srun -n or --ntasks-per-node x --nodes, the #SBATCH lines), else from an export's "# Launch N ranks" line, else
from the DeepSpeed JSON's batch (train_batch_size / (micro-batch x accumulation) data-parallel ranks).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from exatrain.engine_configs.read_common import AttentionShape, LaunchRead
from exatrain.engine_configs.read_megatron_flags import IGNORED, _Flags, parse_flags
from exatrain.engine_configs.read_megatron_model import _model
from exatrain.engine_configs.read_megatron_settings import (
    _accum,
    _batch,
    _check_deepspeed_batch,
    _deepspeed_json,
    _ds_unknown,
    _memory,
    _moe_settings,
    _overlap,
    _pipeline,
    _precision,
)
from exatrain.engine_configs.shell import Script, run_script
from exatrain.errors import UserError
from exatrain.settings import cp_comm_for

PRETRAIN = re.compile(r"(^|/)pretrain_gpt\w*\.py$")
EXPORT_ARRAYS = ("MEGATRON_ARGS", "MEGATRON_DEEPSPEED_ARGS")  # what export-config writes the flags into
_LAUNCH_LINE = re.compile(r"^# Launch (\d+) ranks", re.M)  # an export's statement of its world size
_DS_CONFIG = ("--deepspeed_config", "--deepspeed-config", "--deepscale_config")


def _command(script: Script, source: str) -> tuple[list[str], list[str]]:
    """(the launcher's words before pretrain_gpt.py, pretrain_gpt.py's own words)."""
    for cmd in script.commands:
        for i, word in enumerate(cmd):
            if PRETRAIN.search(word):
                return cmd[:i], cmd[i + 1 :]
    for name in EXPORT_ARRAYS:
        if name in script.variables:
            return [], list(script.variables[name])
    raise UserError(
        f"{source}: no pretrain_gpt.py command: a Megatron-LM or Megatron-DeepSpeed launch runs "
        "pretrain_gpt.py (or give a torchtitan TOML)"
    )


def side_file_names(text: str, *, source: str) -> tuple[str, ...]:
    script = run_script(text)
    _, words = _command(script, source)
    flags = parse_flags(words)
    name = next((flags[n][0] for n in _DS_CONFIG if flags.get(n)), None)
    return (name,) if name and name not in script.heredocs else ()


def _option(words: list[str], *names: str) -> str | None:
    """The value of the first of ``names`` among a launcher's words (--x v, --x=v, -n v, -n8)."""
    for i, w in enumerate(words):
        for n in names:
            if w == n and i + 1 < len(words):
                return words[i + 1]
            if w.startswith(n + "=") and n.startswith("--"):
                return w[len(n) + 1 :]
            if len(n) == 2 and w.startswith(n) and len(w) > 2 and w[2:].isdigit():
                return w[2:]
    return None


def _count(value: str | None) -> int | None:
    """A launcher count, or None where the script leaves it to run time ($SLURM_NNODES, $(nproc), gpu, 1:4)."""
    if value is None:
        return None
    value = value.split("(")[0]  # SBATCH --ntasks-per-node=8(x2) style
    return int(value) if value.isdigit() and int(value) > 0 else None


def _world_size(launcher: list[str], script: Script, text: str) -> tuple[int | None, str]:
    """(ranks, where the number comes from), or (None, why not)."""
    sb = script.sbatch
    sb_nodes = _count(_option(sb, "--nodes", "-N"))
    sb_per_node = _count(_option(sb, "--ntasks-per-node")) or _count(_option(sb, "--gpus-per-node"))
    names = [w.rsplit("/", 1)[-1] for w in launcher]
    if "torchrun" in names or "torch.distributed.run" in launcher or "torch.distributed.launch" in launcher:
        per_node = _count(_option(launcher, "--nproc_per_node", "--nproc-per-node"))
        nodes_text = _option(launcher, "--nnodes")
        nodes = _count(nodes_text) if nodes_text is not None else 1
        nodes = nodes or sb_nodes
        if per_node and nodes:
            return per_node * nodes, "torchrun"
        return None, "torchrun's --nproc_per_node / --nnodes are set at run time"
    if "deepspeed" in names:
        per_node = _count(_option(launcher, "--num_gpus", "--num-gpus"))
        nodes = _count(_option(launcher, "--num_nodes", "--num-nodes")) or (1 if per_node else None)
        if per_node and nodes:
            return per_node * nodes, "deepspeed"
        return None, "the deepspeed launcher's --num_gpus / --num_nodes are not given"
    if "srun" in names:
        tasks = _count(_option(launcher, "--ntasks", "-n"))
        per_node = _count(_option(launcher, "--ntasks-per-node")) or sb_per_node
        nodes = _count(_option(launcher, "--nodes", "-N")) or sb_nodes
        if tasks:
            return tasks, "srun"
        if per_node and nodes:
            return per_node * nodes, "srun"
    tasks = _count(_option(sb, "--ntasks", "-n"))
    if tasks:
        return tasks, "#SBATCH"
    if sb_per_node and sb_nodes and launcher:
        return sb_per_node * sb_nodes, "#SBATCH"
    m = _LAUNCH_LINE.search(text)
    if m:
        return int(m.group(1)), "the export's launch line"
    return None, "no launcher line states it"


def read_megatron(text: str, *, source: str, side_files: Mapping[str, str]) -> LaunchRead:
    """The launch ``text`` (the module doc) as a LaunchRead."""
    script = run_script(text)
    launcher, words = _command(script, source)
    f = _Flags(parse_flags(words), source)
    names = [w.rsplit("/", 1)[-1] for w in launcher]
    ds_path = f.value(*_DS_CONFIG)
    deepspeed = (
        f.has("--deepspeed")
        or ds_path is not None
        or "deepspeed" in names
        or "MEGATRON_DEEPSPEED_ARGS" in script.variables
    )
    runtime = "megatron-deepspeed" if deepspeed else "megatron-core"
    engine = "Megatron-DeepSpeed" if deepspeed else "Megatron-LM"
    ds = _deepspeed_json(ds_path, script, side_files, source) if deepspeed and ds_path else {}
    defaults: list[str] = []
    notes: list[str] = []
    s: dict[str, Any] = {}

    tp = f.int("--tensor-model-parallel-size", default=1)
    pp = f.int("--pipeline-model-parallel-size", default=1)
    cp = f.int("--context-parallel-size", default=1)
    ep = f.int("--expert-model-parallel-size", default=1)
    s.update(tp=tp, pp=pp)
    if cp > 1:
        s["cp"] = cp
    model, missing = _model(f, tp, deepspeed, source, defaults, notes)
    if model.get("experts"):
        s["ep"] = ep
        _moe_settings(f, s, source, defaults, notes)
    s["sequence_parallel"] = f.has("--sequence-parallel")
    _pipeline(f, s, model, pp, source, notes)
    _batch(f, s, ds, defaults, source)
    _memory(f, s, ds, deepspeed, source, defaults, notes)
    _precision(f, s, ds, runtime, source, defaults, notes)
    if cp > 1:
        comm = f.value("--cp-comm-type")
        if comm is not None:
            mapped = {"p2p": "p2p", "a2a": "a2a", "allgather": "all_gather"}.get(comm)
            if mapped is None:
                raise UserError(f"{source}: --cp-comm-type {comm} is not modelled (p2p, a2a or allgather)")
            if mapped != cp_comm_for(runtime, "", AttentionShape(model)):
                s["cp_comm"] = mapped
        else:
            defaults.append(f"--cp-comm-type ({cp_comm_for(runtime, '', AttentionShape(model))})")
    overlap = _overlap(f, ds, runtime, defaults)

    gpus, where = _world_size(launcher, script, text)
    if ds:
        _check_deepspeed_batch(ds, s, tp * pp * cp, gpus, source)
        if gpus is None and ds.get("train_batch_size"):
            gpus = ds["train_batch_size"] // (s["micro_batch"] * _accum(ds, s)) * tp * pp * cp
            where = "the DeepSpeed JSON's batch"
    unknown = f.unknown()
    return LaunchRead(
        source=engine,
        runtime=runtime,
        model_fields=model,
        model_missing=missing,
        settings=s,
        gpus=gpus,
        world=where,
        overlap=overlap,
        defaults=tuple(defaults),
        unknown=tuple(unknown) + _ds_unknown(ds),
        notes=tuple(notes),
    )


__all__ = ["EXPORT_ARRAYS", "IGNORED", "parse_flags", "read_megatron", "side_file_names"]
