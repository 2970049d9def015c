"""The bytes of tensors a real run of exatrain's trainer holds at its peak, counted per rank (not RSS).

Spawns ``world`` gloo ranks; each builds the trainer (``trainer.train.Trainer``) for every case in turn
(tests/helpers/trace_matrix.py's cases of that world size), runs one step (Adam's states exist from the
second step on), then runs a second step while counting: every tensor alive as the step starts (found
by the garbage collector: parameters, optimizer states, buffers, the pipeline's kept receive buffers;
not what was alive before the trainer was built)
and every tensor storage an op makes during the step (a TorchDispatchMode), each until its storage is
freed. The count's peak is the step's. Tensors made and held inside C++ alone (DDP's gradient
buckets, gloo's own buffers) are not seen: the trace leaves DDP's buckets out as well.

Prints one JSON object {case: [peak bytes of rank 0, rank 1, ...]}. Run as a script:
``python tests/helpers/counted_run.py WORLD CASE...`` (test_trace_counted.py).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import weakref


def _counter():  # type: ignore[no-untyped-def]
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
    from torch.utils._pytree import tree_leaves

    class Alive(TorchDispatchMode):
        """Bytes of the distinct tensor storages alive, and their peak."""

        def __init__(self) -> None:
            super().__init__()
            self.live: dict[int, int] = {}
            self.now = self.peak = 0

        def track(self, t: torch.Tensor) -> None:
            if is_traceable_wrapper_subclass(t):
                names, _ = t.__tensor_flatten__()
                for name in names:
                    inner = getattr(t, name)
                    if isinstance(inner, torch.Tensor):
                        self.track(inner)
                return
            if t.device.type == "meta":
                return
            st = t.untyped_storage()
            key = st._cdata  # the storage itself: its data pointer moves when FSDP resizes it
            if key in self.live:
                return
            self.live[key] = st.nbytes()
            self.now += st.nbytes()
            self.peak = max(self.peak, self.now)
            weakref.finalize(st, self._free, key)

        def _free(self, key: int) -> None:
            self.now -= self.live.pop(key, 0)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.track(t)
            return out

        def resized(self, st: torch.UntypedStorage) -> None:
            """A storage resized in place (FSDP2 frees and refills its unsharded parameters so)."""
            old = self.live.get(st._cdata)
            if old is None:
                self.live[st._cdata] = 0
                weakref.finalize(st, self._free, st._cdata)
                old = 0
            self.live[st._cdata] = st.nbytes()
            self.now += st.nbytes() - old
            self.peak = max(self.peak, self.now)

        def __enter__(self):  # type: ignore[no-untyped-def]
            resize, counter = torch.UntypedStorage.resize_, self

            def counted(st, size):  # type: ignore[no-untyped-def]
                out = resize(st, size)
                counter.resized(st)
                return out

            self._resize, torch.UntypedStorage.resize_ = resize, counted
            return super().__enter__()

        def __exit__(self, *exc):  # type: ignore[no-untyped-def]
            torch.UntypedStorage.resize_ = self._resize
            return super().__exit__(*exc)

    return Alive


def _storage_key(t):  # type: ignore[no-untyped-def]
    """The storage of a plain tensor, or the local tensor of a subclass (DTensor); None without one."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if is_traceable_wrapper_subclass(t):
        inner = getattr(t, t.__tensor_flatten__()[0][0], None)
        return None if inner is None else _storage_key(inner)
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


def _rank(rank: int, world: int, port: str, cases: list[str], data_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    from exatrain.trainer.config import TrainConfig
    from exatrain.trainer.train import Trainer
    from tests.helpers.trace_matrix import ALL, plan_for

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    alive_cls = _counter()
    out = {}
    for case in cases:
        fields, layout, _, _ = ALL[case]
        plan = plan_for(fields, layout)
        config = TrainConfig(
            plan=plan, steps=2, seed=0, lr=1e-3, quiet=True, data_dir=data_dir, straggler_every=0
        ).check()
        # what earlier cases left alive (caches, their last tensors) is not this run's: held, so that no
        # storage of this run can take one of their addresses
        gc.collect()
        before = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
        old = {_storage_key(t) for t in before}
        trainer = Trainer(config, local_rank=rank)
        trainer.step(0)
        gc.collect()
        alive = alive_cls()
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor) and _storage_key(obj) not in old:
                alive.track(obj)
        with alive:
            trainer.step(1)
        peaks = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(peaks, torch.tensor([float(alive.peak)], dtype=torch.float64))
        out[case] = [int(p.item()) for p in peaks]
        del trainer, alive, before
        gc.collect()
    if rank == 0:
        print(json.dumps(out), flush=True)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # as tests/helpers/fsdp_grad_passes.py: no gloo teardown once the counts are out


def main(argv: list[str]) -> None:
    import socket

    import torch.multiprocessing as mp

    from exatrain.data.prepare import default_dataset

    world, cases = int(argv[0]), argv[1:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    mp.spawn(_rank, args=(world, port, cases, str(default_dataset())), nprocs=world)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    main(sys.argv[1:])
