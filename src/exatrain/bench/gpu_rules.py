"""What a GPU plan's norms keep, for a trace that runs on the CPU (``bench.trace``, accelerator plans).

The trace runs the trainer's model under the CPU's autocast, whose rules differ from CUDA's where it
matters for memory in one place: CUDA autocast runs ``layer_norm`` and ``rms_norm`` in float32 (its
fp32 list; checked on a fake CUDA tensor in tests/bench/test_trace_gpu_rules.py), so a GPU's norm keeps
a float32 copy of its 16-bit input, where the CPU's keeps the 16-bit input itself. The other ops the
model runs are alike under both: the linear layers and SDPA in 16 bits (the CPU's SDPA is a flash
kernel too, keeping q, k, v, the output and a float32 log-sum-exp per head, as the GPU's flash kernel
does, and no s x s scores), GELU and SiLU in their input's dtype, the loss on upcast logits.

RMSNorm on a GPU is torch's fused kernel (``_fused_rms_norm``), whose backward needs its input, its
per-token reciprocal root mean square and the weight; this build has only the CPU's composite of it,
which keeps the normalised input as well. ``fused_rms_norm`` keeps what the fused kernel keeps.
Not traceable here (a CPU build has no CUDA kernels): the SDPA kernel a GPU picks for a given head
size (flash needs a head size the kernel supports; other sizes fall back to the memory-efficient or
the math kernel), and the allocator's fragmentation.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F


class _FusedRMSNorm(torch.autograd.Function):
    """RMSNorm keeping what the fused kernel keeps for its backward: input, rstd, weight."""

    @staticmethod
    def forward(ctx, x, weight, eps):  # type: ignore[no-untyped-def, override]
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, weight)
        y = x * rstd
        return y * weight if weight is not None else y

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        x, rstd, weight = ctx.saved_tensors
        xhat = x * rstd
        gw = grad * weight if weight is not None else grad
        gx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        gweight = None
        if weight is not None and ctx.needs_input_grad[1]:
            gweight = (grad * xhat).sum(dim=tuple(range(grad.dim() - 1)))
        return gx, gweight, None


def fused_rms_norm(x: torch.Tensor, normalized_shape, weight=None, eps=None) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """``F.rms_norm`` over the last dimension, keeping what the GPU's fused kernel keeps."""
    if len(tuple(normalized_shape)) != 1:
        raise ValueError("fused_rms_norm normalises the last dimension only")
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    return _FusedRMSNorm.apply(x, weight, eps)


@contextlib.contextmanager
def cuda_norm_rules() -> Iterator[None]:
    """Inside: ``F.layer_norm`` and ``F.rms_norm`` run as a GPU runs them under autocast: on a float32
    copy of a 16-bit input (CUDA autocast's fp32 list), RMSNorm as the fused kernel."""
    layer_norm, rms_norm = F.layer_norm, F.rms_norm

    def upcast(x: torch.Tensor) -> torch.Tensor:
        on = torch.is_autocast_enabled(x.device.type)
        return x.float() if on and x.dtype in (torch.bfloat16, torch.float16) else x

    def gpu_layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):  # type: ignore[no-untyped-def]
        x = upcast(x)
        with torch.autocast(x.device.type, enabled=False):
            return layer_norm(x, normalized_shape, weight, bias, eps)

    def gpu_rms_norm(x, normalized_shape, weight=None, eps=None):  # type: ignore[no-untyped-def]
        x = upcast(x)
        with torch.autocast(x.device.type, enabled=False):
            return fused_rms_norm(x, normalized_shape, weight, eps)

    F.layer_norm, F.rms_norm = gpu_layer_norm, gpu_rms_norm
    try:
        yield
    finally:
        F.layer_norm, F.rms_norm = layer_norm, rms_norm


__all__ = ["cuda_norm_rules", "fused_rms_norm"]
