"""Collectives over N local ranks: all-reduce, all-gather, reduce-scatter, send/recv by message size.

Ranks are spawned here (gloo on the CPU, each with one thread as the trainer's ranks run; NCCL on
CUDA, one GPU each). Every rank times the same collective between barriers; rank 0's median per
(kind, size) is the result — seconds per call with ``ranks`` taking part (send/recv: one hop
between ranks 0 and 1, the other ranks idle).
"""

from __future__ import annotations

import os
import socket
import statistics
import time

COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")


def message_sizes(device: str, quick: bool) -> list[int]:
    """Bytes per rank's buffer, from latency-bound to bandwidth-bound."""
    if device == "cpu":
        return [2**12, 2**20] if quick else [2**10, 2**12, 2**14, 2**16, 2**18, 2**20, 2**22, 2**24]
    return [2**16, 2**22, 2**26] if quick else [2**12, 2**16, 2**20, 2**24, 2**26, 2**28]


def collective_points(
    ranks: int, device: str = "cpu", quick: bool = False, timeout_s: float = 300.0, framework: bool = False
) -> list[dict]:
    """Spawn ``ranks`` processes and time every kind at every size; [] when ranks < 2. With
    ``framework`` (and 2 ranks) the same ranks then time the trainer's own steps at negligible size
    (bench.framework), returned as points of kind "framework"."""
    if ranks < 2:
        return []
    import torch.multiprocessing as mp

    port = _free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    old = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        procs = [
            ctx.Process(target=_rank_main, args=(r, ranks, port, device, quick, framework, queue)) for r in range(ranks)
        ]
        for p in procs:
            p.start()
    finally:
        if old is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = old
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        if any(p.is_alive() for p in procs):
            raise TimeoutError(f"collective benchmark on {ranks} ranks did not finish in {timeout_s:.0f} s")
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"a benchmark rank failed (exit codes {[p.exitcode for p in procs]})")
        return queue.get()
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)


def _rank_main(rank: int, world: int, port: int, device: str, quick: bool, framework: bool, queue) -> None:
    import warnings

    import torch
    import torch.distributed as dist

    # all_gather_into_tensor / reduce_scatter_tensor: deprecated names in torch 2.13, the only ones in 2.11
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    torch.set_num_threads(1)
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    reps = 3 if quick else 7
    points = []
    try:
        for size in message_sizes(device, quick):
            n = max(world, size // 4 // world * world)  # float32 elements, divisible by world
            x = torch.ones(n, device=dev)
            shard = torch.empty(n // world, device=dev)
            full = torch.empty(n, device=dev)
            calls = {
                "all_reduce": lambda: dist.all_reduce(x),
                "all_gather": lambda: dist.all_gather_into_tensor(full, shard),
                "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, x),
                "send_recv": lambda: _send_recv(dist, rank, x),
            }
            for kind, fn in calls.items():
                fn()  # warm-up (connection set-up, buffer registration)
                times = []
                inner = 1 if size >= 2**20 else (4 if quick else 10)
                for _ in range(reps):
                    dist.barrier()
                    if device == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(inner):
                        fn()
                    if device == "cuda":
                        torch.cuda.synchronize()
                    times.append((time.perf_counter() - t0) / inner)
                # The buffer each rank contributes: the whole tensor for all-reduce and reduce-scatter
                # (the cost model's message), one shard's worth gathered for all-gather -> n elements out.
                points.append({"kind": kind, "ranks": world, "bytes": n * 4, "seconds": statistics.median(times)})
        if framework and world == 2:
            from exatrain.bench.framework import framework_points

            points += framework_points(rank, device, quick)
        if rank == 0:
            queue.put(points)
    finally:
        dist.barrier()
        dist.destroy_process_group()


def _send_recv(dist, rank: int, x) -> None:
    if rank == 0:
        dist.send(x, 1)
    elif rank == 1:
        dist.recv(x, 0)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


__all__ = ["COLLECTIVE_KINDS", "collective_points", "message_sizes"]
