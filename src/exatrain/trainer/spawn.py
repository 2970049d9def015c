"""Starting the ranks: from torchrun's or srun's environment, or by spawning local processes.

Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) or srun (SLURM_PROCID, SLURM_NTASKS,
SLURM_LOCALID, with MASTER_ADDR/MASTER_PORT exported by the batch script) every process is one rank.
Otherwise ``launch_local`` spawns the plan's ranks on this machine, each with OMP_NUM_THREADS=1
(more threads per rank oversubscribe the cores: several times slower on a small CPU machine).
gloo on the CPU, NCCL on CUDA devices (the ROCm build's RCCL answers to the same name).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

from exatrain.errors import UserError
from exatrain.trainer.config import TrainConfig


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def dist_env(environ: Mapping[str, str] | None = None) -> DistEnv | None:
    """This process's rank when a launcher (torchrun, srun) started it; None otherwise."""
    env = os.environ if environ is None else environ
    try:
        if "RANK" in env and "WORLD_SIZE" in env:
            world = int(env["WORLD_SIZE"])
            return DistEnv(int(env["RANK"]), world, int(env.get("LOCAL_RANK", env["RANK"])),
                           int(env.get("LOCAL_WORLD_SIZE", world)))
        if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "MASTER_ADDR" in env:
            world = int(env["SLURM_NTASKS"])
            return DistEnv(int(env["SLURM_PROCID"]), world, int(env.get("SLURM_LOCALID", 0)),
                           int(str(env.get("SLURM_NTASKS_PER_NODE", world)).split("(")[0]))
    except ValueError as exc:
        raise UserError(f"malformed launcher environment ({exc})") from None
    return None


def backend(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def run_distributed(config: TrainConfig, env: DistEnv) -> None:
    """One rank started by torchrun or srun: join the process group, train, leave."""
    import torch.distributed as dist

    from exatrain.trainer.train import train

    if "MASTER_PORT" not in os.environ:
        raise UserError("MASTER_PORT is not set: export MASTER_ADDR and MASTER_PORT in the launch script")
    _prepare_rank(config, env.local_rank)
    dist.init_process_group(backend(config.device), init_method="env://", rank=env.rank,
                            world_size=env.world_size)
    try:
        train(config, env.local_rank)
    finally:
        dist.destroy_process_group()


def launch_local(configs: Sequence[TrainConfig], timeout_s: float | None = None) -> None:
    """Spawn the plan's ranks here and run ``configs`` one after another in them (tests batch
    several runs into one set of processes). Raises TimeoutError after ``timeout_s`` (the ranks are
    killed), RuntimeError carrying a failed rank's traceback; a UserError a rank raised (a
    TrainingStopped, a checkpoint that does not fit) is raised again here, as the same one line."""
    import torch.multiprocessing as mp

    world = configs[0].plan.gpus
    if any(c.plan.gpus != world for c in configs):
        raise ValueError("every config of one launch needs the same number of ranks")
    port = _free_port()
    errors = tempfile.mkdtemp(prefix="exatrain-rank-errors-")
    with _environ(OMP_NUM_THREADS="1"):
        ctx = mp.start_processes(_spawned, args=(world, port, tuple(configs), errors), nprocs=world, join=False,
                                 start_method="spawn")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=0.5):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{world} ranks did not finish within {timeout_s:.0f} s")
    except mp.ProcessRaisedException as exc:
        _raise_user_error(errors)
        raise RuntimeError(f"a rank failed:\n{exc}") from None
    except mp.ProcessExitedException as exc:
        raise RuntimeError(f"a rank exited with status {exc.exit_code}") from None
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)
        shutil.rmtree(errors, ignore_errors=True)


def _raise_user_error(errors: str) -> None:
    """Re-raise the UserError the lowest failed rank recorded, if any (its class and exit status kept)."""
    for path in sorted(Path(errors).glob("rank*.json"), key=lambda p: int(p.stem[4:])):
        info = json.loads(path.read_text())
        exc = UserError(info["message"])
        exc.exit_code = int(info["exit_code"])
        raise exc from None


def _spawned(local_rank: int, world: int, port: int, configs: tuple[TrainConfig, ...], errors: str) -> None:
    import torch.distributed as dist

    from exatrain.trainer.train import train

    _prepare_rank(configs[0], local_rank)
    dist.init_process_group(backend(configs[0].device), init_method=f"tcp://127.0.0.1:{port}",
                            rank=local_rank, world_size=world)
    try:
        for config in configs:
            train(config, local_rank)
            gc.collect()
    except UserError as exc:
        Path(errors, f"rank{local_rank}.json").write_text(json.dumps({"message": str(exc),
                                                                       "exit_code": exc.exit_code}))
        raise
    finally:
        dist.destroy_process_group()


def _prepare_rank(config: TrainConfig, local_rank: int) -> None:
    """One GPU per rank, bound before NCCL starts; one thread per CPU rank when so asked."""
    import torch

    if config.device == "cuda":
        torch.cuda.set_device(cuda_index(local_rank))
    elif os.environ.get("OMP_NUM_THREADS") == "1":
        torch.set_num_threads(1)


def cuda_index(local_rank: int) -> int:
    """The GPU a rank drives. A launcher may show each rank only its own GPU (SLURM's
    --gpu-bind=closest on Frontier, CUDA_VISIBLE_DEVICES per rank), so index modulo what is visible."""
    import torch

    return local_rank % max(1, torch.cuda.device_count())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Set environment variables for the processes started inside, then restore them."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


__all__ = ["DistEnv", "backend", "dist_env", "launch_local", "run_distributed"]
