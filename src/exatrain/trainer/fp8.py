"""FP8 GEMMs for the transformer blocks' linear layers, with dynamic per-tensor ("current") scaling.

The recipe is torchao's ``Float8Linear`` with tensorwise dynamic scaling (torchao float8 README,
"float8 training": ``recipe_name="tensorwise"``) and Transformer Engine's ``Float8CurrentScaling``
(TE docs, "Using FP8 with Transformer Engine": the scale of every tensor from its own amax, no
history), in the "hybrid" format of Micikevicius et al. 2022, "FP8 Formats for Deep Learning"
(arXiv 2209.05433, Sec. 3-4): activations and weights in E4M3 (largest finite 448, Table 1),
gradients in E5M2 (largest finite 57344, Table 1; more range, less precision).

For ``y = x W^T`` (x: [M, K], W: [N, K]) the three GEMMs of forward and backward all run through
``torch._scaled_mm`` on FP8 operands, accumulating in fp32 and writing the given out dtype:

* forward       ``y      = (x_e4m3 / s_x) (W_e4m3 / s_w)^T``
* input grad    ``grad_x = (g_e5m2 / s_g) (W_e4m3 / s_w)``
* weight grad   ``grad_W = (g_e5m2 / s_g)^T (x_e4m3 / s_x)``

with ``s_t = fp8_max / amax(|t|)`` over the whole tensor (torchao ``float8_utils.amax_to_scale``:
the amax clamped below by 1e-12 so that an all-zero tensor gets a finite scale and stays zero).
The FP8 copies of x and W are what the autograd graph keeps for the backward (1 byte an element,
as ``accounting/fp8.py`` counts a GEMM input saved for the weight gradient). The bias is added after
the GEMM in fp32 and rounded once to the output dtype.

Under tensor parallelism x, W and the gradient are DTensors: ``amax`` of a sharded DTensor is a
partial max over its shards, redistributed to a replicated (global) value before the scale is
taken (one all-reduce per tensor, as torchao's ``Float8Linear`` does under DTensor), and
``torch._scaled_mm`` has a DTensor sharding rule (torch.distributed.tensor._ops._matrix_ops,
"mk,kn->mn" with tensorwise scales replicated), so column- and row-parallel layers shard their
FP8 GEMMs like their bf16 ones.

On the CPU ``torch._scaled_mm`` is the same operator, implemented by PyTorch's CPU kernels: the
operands really are rounded to FP8 and the products summed in fp32 — not an emulation in bf16, but
also not a speed anyone's GPU will show. On CUDA the operator needs the first operand row-major,
the second column-major, and every dimension a multiple of 16 (the layouts below are always the
required ones; ``check_fp8`` refuses a GPU plan whose per-rank GEMM shapes are not multiples of 16).

Which linears: every ``nn.Linear`` inside a transformer block (attention q, k, v, o; the dense MLP;
a MoE layer's shared experts would be too, but MoE models are refused, see ``check_fp8``); not the
embedding, the output head or a MoE router, which Transformer Engine and DeepSeek-V3's recipe keep
in higher precision (DeepSeek-V3 report, arXiv 2412.19437, Sec. 3.3.1), as ``accounting/fp8.py``
prices them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from exatrain.errors import PlanError

RECIPES_RUN = ("current",)  # of settings.FP8_RECIPES, what this trainer runs
E4M3 = torch.float8_e4m3fn  # activations and weights (Micikevicius et al. 2022, Table 1: max 448)
E5M2 = torch.float8_e5m2  # gradients (same table: max 57344)
AMAX_EPS = 1e-12  # torchao float8_utils.EPS: the smallest amax a scale is taken from


def _global(t: torch.Tensor) -> torch.Tensor:
    """A reduction's result made whole: a DTensor's partial max over its shards becomes the max
    over the whole tensor on every rank (an all-reduce); a plain tensor is returned as it is."""
    from torch.distributed.tensor import DTensor, Replicate

    if isinstance(t, DTensor):
        return t.redistribute(t.device_mesh, [Replicate()] * t.device_mesh.ndim)
    return t


def amax_scale(t: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """fp32 scale that maps ``t``'s largest magnitude onto ``fp8_dtype``'s largest finite value:
    ``fp8_max / max(amax(|t|), 1e-12)`` (torchao ``amax_to_scale``); the amax is over the whole
    (global, under tensor parallelism) tensor."""
    amax = _global(t.detach().abs().amax()).float()
    return torch.finfo(fp8_dtype).max / amax.clamp(min=AMAX_EPS)


def to_fp8(t: torch.Tensor, fp8_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(``t`` scaled and rounded to ``fp8_dtype``, the inverse scale that undoes the scaling).
    The clamp keeps a value the scale's fp32 rounding pushes just past the maximum finite
    (e4m3fn has no infinity: it would become NaN)."""
    scale = amax_scale(t, fp8_dtype)
    top = torch.finfo(fp8_dtype).max
    return (t.float() * scale).clamp(-top, top).to(fp8_dtype), scale.reciprocal()


def _col_major(t: torch.Tensor) -> torch.Tensor:
    """The same matrix stored column-major (the layout ``_scaled_mm`` wants for its second operand)."""
    return t.t().contiguous().t()


class Fp8Matmul(torch.autograd.Function):
    """``x W^T`` for 2-D x [M, K] and W [N, K] with FP8 operands in all three GEMMs (module doc)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        x8, inv_x = to_fp8(x.contiguous(), E4M3)  # row-major, the first operand's required layout
        w8, inv_w = to_fp8(w.contiguous(), E4M3)
        ctx.save_for_backward(x8, inv_x, w8, inv_w)
        ctx.dtypes = (x.dtype, w.dtype, out_dtype)
        # W [N, K] row-major is W^T [K, N] column-major: the operand layout the kernel needs.
        return torch._scaled_mm(x8, w8.t(), scale_a=inv_x, scale_b=inv_w, out_dtype=out_dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x8, inv_x, w8, inv_w = ctx.saved_tensors
        x_dtype, w_dtype, out_dtype = ctx.dtypes
        g8, inv_g = to_fp8(grad.contiguous(), E5M2)
        # Both gradients are written in the forward's out dtype and then cast to their inputs' dtypes:
        # DTensor's sharding propagation for _scaled_mm caches the output's metadata without its
        # out_dtype (torch 2.13), so every call of a run must ask for the same out dtype.
        grad_x = torch._scaled_mm(g8, _col_major(w8), scale_a=inv_g, scale_b=inv_w, out_dtype=out_dtype)
        grad_w = torch._scaled_mm(
            g8.t().contiguous(), _col_major(x8), scale_a=inv_g, scale_b=inv_x, out_dtype=out_dtype
        )
        return grad_x.to(x_dtype), grad_w.to(w_dtype), None


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` with FP8 GEMMs: x [..., K], weight [N, K], bias [N] -> [..., N], in the autocast
    dtype when autocast is on (else x's dtype); the bias is added in fp32."""
    dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
    lead = x.shape[:-1]
    y = Fp8Matmul.apply(x.reshape(-1, x.shape[-1]), weight, dtype)
    if bias is not None:
        y = (y.float() + bias.float()).to(dtype)
    return y.reshape(*lead, weight.shape[0])


class Float8Linear(nn.Linear):
    """An ``nn.Linear`` whose GEMMs run in FP8 (``fp8_linear``); same parameters, same names, so
    checkpoints, tensor-parallel styles, FSDP and the initialisation see an ordinary linear layer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, self.weight, self.bias)


def convert_to_fp8(model: nn.Module) -> int:
    """Swap every ``nn.Linear`` inside the transformer blocks of ``model`` (a whole model or one
    pipeline stage, usually still on the meta device) for a ``Float8Linear`` holding the same
    parameter objects; the embedding, the output head and MoE routers (not ``nn.Linear``) stay.
    Returns how many layers were swapped."""
    swapped = 0
    for block in model.layers.values():
        for parent in list(block.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    new = Float8Linear(
                        child.in_features, child.out_features, bias=child.bias is not None, device="meta"
                    )
                    new.weight, new.bias = child.weight, child.bias
                    setattr(parent, name, new)
                    swapped += 1
    return swapped


def _gemm_dims(plan: Any) -> dict[str, int]:
    """The per-rank sizes that are a dimension of some block GEMM of ``plan``."""
    m, tp = plan.model, plan.tp
    kv = m.kv_heads * (m.hidden // m.heads)
    return {
        "hidden": m.hidden,
        "hidden/tp": m.hidden // tp,
        "kv_heads*head_dim/tp": kv // tp,
        "ffn_hidden/tp": m.ffn_hidden // tp,
        "micro_batch*seq_len/cp": plan.micro_batch * m.seq_len // plan.cp,
    }


def check_fp8(plan: Any, device: str, compile: bool = False) -> None:
    """Refuse, in one line each, what ``--fp8`` in this trainer does not run: a recipe other than
    per-tensor current scaling, a mixture-of-experts model (its grouped expert GEMMs stay in bf16
    here while the planner prices them in FP8), ``--compile`` (not tested with the FP8 GEMMs), and on
    a GPU GEMM sizes that are not multiples of 16 (``torch._scaled_mm``'s CUDA constraint; the CPU
    kernel takes any size)."""
    if plan.fp8 not in RECIPES_RUN:
        raise PlanError(
            f"the trainer runs --fp8 {' or '.join(RECIPES_RUN)} (per-tensor dynamic scaling) only, "
            f"not {plan.fp8!r}: use --fp8 current"
        )
    if plan.model.is_moe:
        raise PlanError(
            "--fp8 trains dense models only for now (the routed experts' grouped GEMMs have no FP8 "
            "path here): drop --fp8 or train a dense model"
        )
    if compile:
        raise PlanError("--fp8 does not run with --compile yet: drop one of them")
    if device != "cpu":
        bad = {k: v for k, v in _gemm_dims(plan).items() if v % 16}
        if bad:
            raise PlanError(
                "--fp8 on a GPU needs every GEMM dimension a multiple of 16 (torch._scaled_mm); "
                f"this plan has {', '.join(f'{k} = {v}' for k, v in bad.items())}"
            )


__all__ = [
    "AMAX_EPS",
    "E4M3",
    "E5M2",
    "Float8Linear",
    "Fp8Matmul",
    "RECIPES_RUN",
    "amax_scale",
    "check_fp8",
    "convert_to_fp8",
    "fp8_linear",
    "to_fp8",
]
