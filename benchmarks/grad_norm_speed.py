"""Seconds the trainer's global gradient norm takes (``trainer.parallel.grads.clip_grad_norm``, the norm alone: no
gradient is above the limit), over the gradients of a catalog model on one rank, and the bytes a parameter that
implies at the machine's copy bandwidth (measured here with one fp32 ``copy_`` of the same tensors).

    python benchmarks/grad_norm_speed.py [--model gpt3-125m] [--repeat 5] [--device cpu|cuda]

Prints the best of ``--repeat`` timings. To compare two versions of the trainer, run this script with
``PYTHONPATH=<other tree>/src``."""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt3-125m")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    import torch
    import torch.distributed as dist

    from exatrain.catalog import get_model
    from exatrain.trainer.model import Transformer
    from exatrain.trainer.parallel.grads import GradEntry, clip_grad_norm

    device = torch.device(args.device)
    torch.manual_seed(0)
    with torch.device(device):
        model = Transformer(get_model(args.model))
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    entries = [GradEntry(p, copies=1) for p in params]
    n = sum(p.numel() for p in params)
    store = os.path.join(tempfile.mkdtemp(), "store")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)

    def best(fn) -> float:
        times = []
        for _ in range(args.repeat + 1):  # the first is a warm-up
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        return min(times[1:])

    copies = [torch.empty_like(p) for p in params]
    copy_s = best(lambda: torch._foreach_copy_(copies, [p.grad for p in params]))  # 8 bytes an element
    norm_s = best(lambda: clip_grad_norm(entries, 1e30, device))
    dist.destroy_process_group()
    bw = 8.0 * n / copy_s
    print(f"{args.model}: {n / 1e6:.1f} M parameters on {device}, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    print(f"fp32 copy: {copy_s * 1e3:.1f} ms ({bw / 1e9:.2f} GB/s)")
    print(f"gradient norm: {norm_s * 1e3:.1f} ms = {norm_s * bw / n:.1f} bytes a parameter at the copy's bandwidth")


if __name__ == "__main__":
    main()
