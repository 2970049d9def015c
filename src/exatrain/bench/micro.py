"""Micro-benchmarks of one rank: GEMMs, fused attention, memory bandwidth, per-kernel overhead.

Each function returns raw points (plain dicts, JSON-ready) that ``planner.cost.calibrate`` fits to
the cost model's parameters. Shapes come from the planner's own accounting (``layer_gemms`` of the
models a machine trains), so the fit sees the sizes the predictions will be made for; backward
GEMMs are measured in their own (transposed) shapes.

On the CPU every measurement runs on one thread, as each training rank does (the trainer's ranks run
with OMP_NUM_THREADS=1). Timing: warm up, then repeat until ``min_time_s`` has passed and keep the
median of a few such batches.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from exatrain.catalog import get_model
from exatrain.accounting.flops import layer_gemms, logits_gemm

BENCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class BenchOptions:
    device: str = "cpu"  # cpu | cuda
    dtype: str = "float32"
    quick: bool = False
    min_time_s: float = 0.02  # per timing batch

    @property
    def torch_dtype(self) -> torch.dtype:
        return BENCH_DTYPES[self.dtype]

    @property
    def batches(self) -> int:
        return 2 if self.quick else 3


def _sync(opts: BenchOptions) -> None:
    if opts.device == "cuda":
        torch.cuda.synchronize()


def time_call(fn: Callable[[], object], opts: BenchOptions) -> float:
    """Seconds per call of ``fn`` (after a warm-up): the median of a few timing batches. (On a
    shared machine this is the speed training runs there will see too, not the uncontended best.)"""
    fn()
    _sync(opts)
    t0 = time.perf_counter()
    fn()
    _sync(opts)
    one = max(time.perf_counter() - t0, 1e-7)
    reps = max(1, min(10_000, int(opts.min_time_s / one)))
    samples = []
    for _ in range(opts.batches):
        _sync(opts)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        _sync(opts)
        samples.append((time.perf_counter() - t0) / reps)
    return statistics.median(samples)


# ---- GEMMs ------------------------------------------------------------------------------------------
def model_shapes(opts: BenchOptions) -> list[tuple[int, int, int]]:
    """Distinct (m, n, k) of the forward GEMMs of a few models and micro-batches, with the two
    backward shapes of each (input gradient: m x k from m x n by n x k; weight gradient: n x k from
    n x m by m x k)."""
    if opts.device == "cpu":
        plan = (
            [("gpt-tiny", (1,)), ("gpt-small", (1,))]
            if opts.quick
            else [("gpt-tiny", (1, 4)), ("llama-tiny", (2,)), ("gpt-small", (1, 4))]
        )
        wide = [] if opts.quick else [(1024, 1024, 1024)]
    else:
        plan = [("gpt-1.3b", (1,))] if opts.quick else [("gpt-1.3b", (1, 4)), ("gpt-2.7b", (1,)), ("llama3-8b", (1,))]
        wide = [] if opts.quick else [(8192, 8192, 8192)]
    shapes: set[tuple[int, int, int]] = set()
    for name, mbs in plan:
        m = get_model(name)
        for mb in mbs:
            for g in [*layer_gemms(m, mb, 1), logits_gemm(m, mb, 1)]:
                if g.name.startswith("attn_"):
                    continue  # attention is measured as one fused kernel
                shapes.add((g.m, g.n, g.k))
                if not opts.quick:
                    shapes.update({(g.m, g.k, g.n), (g.n, g.k, g.m)})
    shapes.update(wide)
    return sorted(shapes)


def gemm_points(opts: BenchOptions) -> list[dict]:
    dev, dt = opts.device, opts.torch_dtype
    out = []
    for m, n, k in model_shapes(opts):
        a = torch.randn(m, k, device=dev, dtype=dt)
        b = torch.randn(k, n, device=dev, dtype=dt)
        s = time_call(lambda: torch.mm(a, b), opts)
        out.append({"m": m, "n": n, "k": k, "seconds": s, "tflops": 2.0 * m * n * k / s / 1e12})
    return out


def fp8_supported(opts: BenchOptions) -> bool:
    """Whether ``torch._scaled_mm`` runs here: PyTorch's CPU kernels, or a CUDA device of compute
    capability 8.9 or newer (Ada, Hopper, Blackwell: the FP8 tensor cores)."""
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return False
    if opts.device == "cuda":
        return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
    return opts.device == "cpu"


def fp8_gemm_points(opts: BenchOptions) -> list[dict]:
    """The same GEMM shapes as ``gemm_points`` (rounded up to multiples of 16, which the CUDA kernel
    needs; at most 8, or 2 when quick), each timed twice: in the bench's dtype (``seconds_16``, torch.mm)
    and with FP8 operands (``seconds_fp8``: ``torch._scaled_mm`` on E4M3 copies with per-tensor scales,
    the call trainer/fp8.py makes, into the bench's dtype). The cast is outside the timing: the cost
    model prices it as element-wise work. [] where FP8 GEMMs do not run (``fp8_supported``)."""
    if not fp8_supported(opts):
        return []
    from exatrain.trainer.fp8 import E4M3, to_fp8

    dev, dt = opts.device, opts.torch_dtype
    up = lambda d: -(-d // 16) * 16  # noqa: E731
    shapes = sorted({(up(m), up(n), up(k)) for m, n, k in model_shapes(opts)}, key=lambda s: s[0] * s[1] * s[2])
    step = max(1, len(shapes) // (2 if opts.quick else 8))
    out = []
    for m, n, k in shapes[::step][: 2 if opts.quick else 8]:
        a = torch.randn(m, k, device=dev, dtype=dt)
        w = torch.randn(n, k, device=dev, dtype=dt)
        a8, inv_a = to_fp8(a, E4M3)
        w8, inv_w = to_fp8(w, E4M3)
        wt = w.t().contiguous()
        t16 = time_call(lambda: torch.mm(a, wt), opts)
        t8 = time_call(lambda: torch._scaled_mm(a8, w8.t(), scale_a=inv_a, scale_b=inv_w, out_dtype=dt), opts)
        out.append({"m": m, "n": n, "k": k, "seconds_16": t16, "seconds_fp8": t8})
    return out


# ---- attention --------------------------------------------------------------------------------------
def attention_cases(opts: BenchOptions) -> list[tuple[int, int, int, int]]:
    """(batch, heads, seq, head_dim) of the models' attention, flash (SDPA) forward + backward."""
    if opts.device == "cpu":
        cases = [(1, 4, 64, 16), (4, 4, 64, 16), (1, 6, 128, 32), (4, 6, 128, 32)]
        return cases[:2] if opts.quick else cases
    cases = [(4, 16, 2048, 128), (8, 32, 2048, 128), (1, 32, 4096, 128), (2, 32, 8192, 128)]
    return cases[:1] if opts.quick else cases


def attention_points(opts: BenchOptions) -> list[dict]:
    """Seconds of a causal SDPA forward + backward; FLOPs counted as the cost model counts them:
    4*b*s^2*(heads*d) forward "full count" (Korthikanti Sec. 6), backward 2.5x the forward."""
    out = []
    for b, nh, s, d in attention_cases(opts):
        q, k, v = (
            torch.randn(b, nh, s, d, device=opts.device, dtype=opts.torch_dtype, requires_grad=True) for _ in range(3)
        )
        g = torch.randn(b, nh, s, d, device=opts.device, dtype=opts.torch_dtype)

        def step() -> None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y.backward(g)

        t = time_call(step, opts)
        flops = 3.5 * 4.0 * b * s * s * nh * d
        out.append({"batch": b, "heads": nh, "seq": s, "head_dim": d, "seconds": t, "flops": flops})
    return out


def flash2_points(opts: BenchOptions) -> list[dict]:
    """On a CUDA device: the largest attention case timed again with SDPA held to its FlashAttention-2
    backend (``SDPBackend.FLASH_ATTENTION``), beside the default backend's time (which torch 2.11 and newer
    run on cuDNN's kernel on Hopper): what ``fa2_attn_ratio`` is fitted from. [] on the CPU, or where the
    backend refuses the shape."""
    if opts.device != "cuda":
        return []
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, nh, s, d = attention_cases(opts)[-1]
    q, k, v = (
        torch.randn(b, nh, s, d, device=opts.device, dtype=opts.torch_dtype, requires_grad=True) for _ in range(3)
    )
    g = torch.randn(b, nh, s, d, device=opts.device, dtype=opts.torch_dtype)

    def step() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)

    default = time_call(step, opts)
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            fa2 = time_call(step, opts)
    except RuntimeError:
        return []
    return [{"batch": b, "heads": nh, "seq": s, "head_dim": d, "seconds_default": default, "seconds_fa2": fa2}]


# ---- memory bandwidth and per-kernel overhead ---------------------------------------------------------
def bandwidth_points(opts: BenchOptions) -> list[dict]:
    """Element-wise kernels over sizes from tiny (overhead-bound) to large (bandwidth-bound): a copy,
    an add, GELU and LayerNorm; bytes = elements read + written."""
    dev, dt = opts.device, opts.torch_dtype
    e = torch.finfo(dt).bits // 8
    if dev == "cpu":
        sizes = [2**10, 2**14, 2**17, 2**20, 2**23] if not opts.quick else [2**10, 2**16, 2**20]
    else:
        sizes = [2**12, 2**18, 2**22, 2**26, 2**28] if not opts.quick else [2**12, 2**20, 2**26]
    out = []
    for n in sizes:
        x = torch.randn(n, device=dev, dtype=dt)
        y = torch.randn(n, device=dev, dtype=dt)
        z = torch.empty_like(x)
        h = 256 if n >= 256 else n
        w = torch.ones(h, device=dev, dtype=dt)
        kernels = {
            "copy": (lambda: z.copy_(x), 2),
            "add": (lambda: torch.add(x, y, out=z), 3),
            "gelu": (lambda: F.gelu(x, approximate="tanh"), 2),
            "layer_norm": (lambda: F.layer_norm(x.view(-1, h), (h,), w, w), 2),
        }
        for name, (fn, passes) in kernels.items():
            t = time_call(fn, opts)
            out.append({"kernel": name, "elements": n, "bytes": passes * n * e, "seconds": t})
    return out


def overhead_points(opts: BenchOptions) -> list[dict]:
    """Fixed time per kernel as training pays it: a tiny linear layer and a tiny LayerNorm, forward
    and backward through autograd and nn.Module (the framework's dispatch, not the arithmetic).
    A linear layer's step is 3 GEMMs (forward, input and weight gradient); a norm's 3 kernels
    (forward, backward counted as two, as the cost model counts element-wise backward)."""
    dev, dt = opts.device, opts.torch_dtype
    lin = torch.nn.Linear(8, 8, bias=False, device=dev, dtype=dt)
    norm = torch.nn.LayerNorm(8, device=dev, dtype=dt)
    x = torch.randn(8, 8, device=dev, dtype=dt, requires_grad=True)

    def linear_step() -> None:
        lin(x).sum().backward()

    def norm_step() -> None:
        norm(x).sum().backward()

    def sum_step() -> None:  # what both steps share: the loss, its backward, x's gradient
        x.sum().backward()

    base = time_call(sum_step, opts)
    return [
        {"kind": "gemm", "calls": 3, "seconds": max(time_call(linear_step, opts) - base, 0.0)},
        {"kind": "elementwise", "calls": 3, "seconds": max(time_call(norm_step, opts) - base, 0.0)},
        {"kind": "step", "calls": 1, "seconds": step_overhead_s(opts)},
    ]


def layer_points(opts: BenchOptions) -> list[dict]:
    """Forward + backward of one of the trainer's own layers (``trainer.model.Block``), GPT and Llama,
    at a size where the arithmetic is negligible: what remains is the framework's cost of every
    kernel the layer launches (more than the cost model's fused-kernel count: separate q, k, v
    projections, the rotary embedding, RMSNorm's composite ops), which the fit spreads over the
    kernels the cost model counts."""
    from exatrain.catalog.models import ModelSpec
    from exatrain.trainer.model import Block, rope_table

    out = []
    for fields in (
        dict(arch="gpt", hidden=32, heads=2),
        dict(arch="llama", hidden=32, heads=2, kv_heads=1, ffn_hidden=64),
    ):
        spec = ModelSpec(name=f"bench-{fields['arch']}", layers=1, seq_len=16, vocab=256, **fields)
        block = Block(spec).to(device=opts.device, dtype=opts.torch_dtype)
        rope = rope_table(spec, device=opts.device) if spec.arch == "llama" else None
        x = torch.randn(1, spec.seq_len, spec.hidden, device=opts.device, dtype=opts.torch_dtype, requires_grad=True)

        def step() -> None:
            block(x, rope).sum().backward()

        out.append({"model": spec.to_dict(), "micro_batch": 1, "seconds": time_call(step, opts)})
    return out


STEP_TENSORS = 64  # parameter tensors of a small preset (gpt-tiny 52, gpt-small 76, llama-tiny 39)


def step_overhead_s(opts: BenchOptions, tensors: int = STEP_TENSORS) -> float:
    """The fixed per-step work of the trainer's loop on tiny parameters (so the arithmetic is
    nothing and the per-tensor dispatch is everything): zero the gradients, the global gradient
    norm as ``trainer.parallel.grads.clip_grad_norm`` computes it (torch's foreach norms, their squares in
    float64, a scale), and AdamW's step (torch's default implementation for the device)."""
    dev, dt = opts.device, torch.float32
    params = [torch.nn.Parameter(torch.randn(64, device=dev, dtype=dt)) for _ in range(tensors)]
    decay = [p for i, p in enumerate(params) if i % 3]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": 0.1},
            {"params": [p for i, p in enumerate(params) if not i % 3], "weight_decay": 0.0},
        ],
        lr=1e-3,
        betas=(0.9, 0.95),
        eps=1e-8,
    )

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        for p in params:
            p.grad = torch.ones_like(p)  # what a backward leaves
        total = torch.nn.utils.get_total_norm([p.grad.detach() for p in params], 2.0).double() ** 2
        coef = 1.0 / (float(total.sqrt()) + 1e-6)
        for p in params:
            p.grad.mul_(coef)
        opt.step()

    return time_call(step, opts)


def machine() -> dict:
    """What ran the benchmark, for the calibration file."""
    import os
    import platform

    d = {
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    }
    if torch.cuda.is_available():
        d["gpu"] = torch.cuda.get_device_name(0)
        d["gpus"] = torch.cuda.device_count()
    return d


__all__ = [
    "BenchOptions",
    "attention_points",
    "bandwidth_points",
    "flash2_points",
    "fp8_gemm_points",
    "fp8_supported",
    "gemm_points",
    "layer_points",
    "machine",
    "model_shapes",
    "overhead_points",
    "step_overhead_s",
    "time_call",
]
