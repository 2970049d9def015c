"""A plan's layout as another engine's configuration: Megatron-LM flags, Megatron-DeepSpeed flags
plus a DeepSpeed JSON, or a torchtitan TOML job config (``exatrain export-config``).

Pure functions of a Plan, torch-free; the job launchers (SLURM, torchrun) are in ``exatrain.launch``.
"""

from exatrain.engine_configs.common import TARGETS, Export, export

__all__ = ["Export", "TARGETS", "export"]
