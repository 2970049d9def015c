"""Another engine's launch read back into plan values: what ``estimate --from`` and ``search --from`` start from.

``read_launch`` takes the text of a Megatron-LM or Megatron-DeepSpeed launch (a shell or sbatch script running
pretrain_gpt.py, or what ``export-config --for megatron/deepspeed`` writes) or a torchtitan job TOML and returns a
``LaunchRead``: the model's fields, the layout as ``api.make_plan``'s keyword arguments (tp, pp, micro_batch,
zero, recompute, ... only those the file states), the world size, the runtime and the overlaps it switches on,
which settings it leaves to the engine's defaults, and the flags or keys it does not know. Pure functions of
text: a DeepSpeed JSON beside the script comes in ``side_files`` (``side_file_names`` says which to read).
"""

from __future__ import annotations

from typing import Mapping

from exatrain.engine_configs import read_megatron, read_torchtitan
from exatrain.engine_configs.read_common import LaunchRead


def read_launch(
    text: str, *, source: str, side_files: Mapping[str, str] | None = None, gpus: int | None = None
) -> LaunchRead:
    """The launch ``text`` (from the file ``source``) read: a torchtitan TOML when it parses as TOML with a torchtitan
    section, else a Megatron-LM / Megatron-DeepSpeed script. ``gpus``: the world size where the file leaves it to
    the launcher (a torchtitan shard degree of -1)."""
    if source.lower().endswith(".toml") or read_torchtitan.looks_like_toml(text):
        return read_torchtitan.read_torchtitan(text, source=source, gpus=gpus)
    return read_megatron.read_megatron(text, source=source, side_files=side_files or {})


def side_file_names(text: str, *, source: str) -> tuple[str, ...]:
    """Files the launch refers to that its reading needs (a DeepSpeed JSON), as the script names them; those it
    writes itself (a here-document) are not listed."""
    if source.lower().endswith(".toml") or read_torchtitan.looks_like_toml(text):
        return ()
    return read_megatron.side_file_names(text, source=source)


__all__ = ["LaunchRead", "read_launch", "side_file_names"]
