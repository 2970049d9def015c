"""Job launchers: pure functions from a Plan (and a cluster) to the text that starts its ranks.

* ``slurm.render_slurm``      an sbatch script (Frontier's ROCm/RCCL environment, NVIDIA's NCCL one,
                              or CPU ranks), requeue-safe;
* ``torchrun.render_torchrun`` the multi-node torchrun command (c10d rendezvous).

Configs for other engines (Megatron-LM, Megatron-DeepSpeed, torchtitan) live in
``exatrain.engine_configs``. Nothing here imports torch or runs a process; ``exatrain launch`` writes
the text.
"""

from exatrain.launch.common import NodeLayout, TrainArgs, node_layout
from exatrain.launch.slurm import SlurmOptions, render_slurm
from exatrain.launch.torchrun import TorchrunOptions, render_torchrun

__all__ = [
    "NodeLayout",
    "SlurmOptions",
    "TorchrunOptions",
    "TrainArgs",
    "node_layout",
    "render_slurm",
    "render_torchrun",
]
