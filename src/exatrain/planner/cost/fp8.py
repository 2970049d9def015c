"""FP8 GEMMs in the step time: their rate over a 16-bit GEMM's, and the casts each one makes.

Under FP8 (``accounting.fp8``) every linear-layer GEMM runs at the device's FP8 peak times the same efficiency
(the router, the attention core and the output head stay 16-bit, as Transformer Engine and DeepSeek-V3's recipe
keep them; arXiv 2412.19437 Sec. 3.3.1), and each FP8 GEMM first casts its input (forward) or output gradient
(backward) to FP8: read 2, write 1 byte per element and its transposed copy 1 more, plus a read for the amax
under current scaling (``CAST_BYTES``). ``cost.layer.layer_times`` prices them.
"""

from __future__ import annotations

from exatrain.catalog.hardware import ClusterSpec
from exatrain.errors import UserError
from exatrain.planner.cost.coefficients import CostParams


NOT_FP8 = ("attn_scores", "attn_values", "router")  # GEMMs that stay 16-bit under FP8


# Bytes moved per element of a tensor cast to FP8 for a GEMM, by recipe. Every recipe reads the 16-bit
# tensor (2) and writes it twice in FP8 (1 + 1): Hopper's FP8 GEMM takes only the "TN" layout, so the
# cast also writes the transposed copy the other GEMMs of the pair read (Transformer Engine's fused
# cast-transpose; accounting.fp8 keeps that copy for weights). Current scaling ("current") first reads
# the tensor once more for its amax (2); delayed scaling uses the previous amax and updates it inside the
# cast; block and MXFP8 scale each block inside the cast.
CAST_BYTES = {"delayed": 4.0, "current": 6.0, "block": 4.0, "mxfp8": 4.0}


def fp8_speedup(cluster: ClusterSpec, dtype: str, params: CostParams | None = None) -> float:
    """How much faster an FP8 GEMM runs than a ``dtype`` one: ``params.fp8_speedup`` (what ``exatrain
    bench`` measured, or the device prior's fitted ratio: Hopper's, coefficients.DEFAULTS), else the
    device's FP8 peak over its ``dtype`` peak (catalog data-sheet figures, the same fraction of each)."""
    if params is not None and params.fp8_speedup is not None:
        return float(params.fp8_speedup)
    fast, base = cluster.device.peak_flops("float8"), cluster.device.peak_flops(dtype)
    if not fast or not base:
        raise UserError(
            f"device {cluster.device.name!r} has no FP8 peak in the catalog: --fp8 needs one "
            "(e.g. H100, H200, B200, MI300X)"
        )
    return float(fast) / float(base)


__all__ = ["CAST_BYTES", "NOT_FP8", "fp8_speedup"]
