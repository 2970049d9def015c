"""A plan's layout as another engine's configuration: Megatron-LM flags, Megatron-DeepSpeed flags
plus a DeepSpeed JSON, or a torchtitan TOML job config (``exatrain export-config``).

Pure functions of a Plan, torch-free; the job launchers (SLURM, torchrun) are in ``exatrain.launch``.
"""

from exatrain.engine_configs import megatron, torchtitan
from exatrain.engine_configs.common import TARGETS, Export
from exatrain.errors import UserError
from exatrain.plan import Plan


def export(plan: Plan, target: str, *, ds_config_path: str = "ds_config.json") -> Export:
    """Render ``plan`` for ``target`` (one of TARGETS)."""
    if target == "megatron":
        return megatron.render_megatron(plan)
    if target == "deepspeed":
        return megatron.render_deepspeed(plan, ds_config_path=ds_config_path)
    if target == "torchtitan":
        return torchtitan.render_torchtitan(plan)
    if target == "torchtitan-0.3":
        return torchtitan.render_torchtitan_03(plan)
    raise UserError(f"unknown export target {target!r}; choose one of {', '.join(TARGETS)}")


__all__ = ["Export", "TARGETS", "export"]
