"""Launchers and exporters: pure functions from a Plan (and a cluster) to text.

* ``slurm.render_slurm``      an sbatch script (Frontier's ROCm/RCCL environment, NVIDIA's NCCL one,
                              or CPU ranks), requeue-safe;
* ``torchrun.render_torchrun`` the multi-node torchrun command (c10d rendezvous);
* ``export_config.export``    the same layout for Megatron-LM, Megatron-DeepSpeed (+ DeepSpeed JSON)
                              or torchtitan.

Nothing here imports torch or runs a process; ``exatrain launch`` / ``export-config`` write the text.
"""

from exatrain.launch.common import NodeLayout, TrainArgs, node_layout
from exatrain.launch.export_config import TARGETS, Export, export
from exatrain.launch.slurm import SlurmOptions, render_slurm
from exatrain.launch.torchrun import TorchrunOptions, render_torchrun

__all__ = ["Export", "NodeLayout", "SlurmOptions", "TARGETS", "TorchrunOptions", "TrainArgs", "export",
           "node_layout", "render_slurm", "render_torchrun"]
