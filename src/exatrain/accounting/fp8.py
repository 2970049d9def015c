"""FP8 training: the extra state it keeps, what it saves in activations, and its GEMM peak.

Transformer Engine (TE) runs the linear layers' GEMMs in fp8 and keeps everything else (norms,
the attention core, the router, the embedding and the output head) in the 16-bit compute dtype —
what Megatron-Core's ``--fp8-format`` does, and DeepSeek-V3's recipe too (DeepSeek-V3 report,
arXiv 2412.19437, Sec. 3.3.1: embedding, output head, MoE gating, normalisation and attention stay
in higher precision). Four scaling recipes (TE ``transformer_engine.common.recipe``):

* ``delayed``: one fp32 scale per tensor from an amax history of ``amax_history_len`` steps
  (``DelayedScaling``, default length 1024; Megatron-LM's ``--fp8-amax-history-len`` defaults to 1).
  TE keeps, per GEMM, fp8 meta for 3 forward tensors (input, weight, output) and 2 backward ones
  (grad output, grad input): an fp32 amax history of that length plus an fp32 scale and inverse
  scale each (transformer_engine/pytorch/module/base.py, ``set_meta_tensor``).
* ``current``: per-tensor scales from the current amax (``Float8CurrentScaling``): no history.
* ``block``: DeepSeek-V3's fine-grained scaling (Sec. 3.3.2; TE ``Float8BlockScaling``): one fp32
  scale per 1x128 tile of activations and per 128x128 block of weights.
* ``mxfp8``: OCP microscaling (TE ``MXFP8BlockScaling``, Blackwell): one 8-bit (E8M0) scale per
  32 consecutive elements.

Weights: the 16-bit compute copy stays (the fp32 master with the optimizer) and TE caches the fp8
cast of every GEMM weight across micro-batches, plus its transpose where the hardware's fp8 GEMM
takes only one layout (Hopper: "TN" only, so TE keeps a column-wise copy; TE docs, "FP8 weight
caching" / ``is_first_microbatch``). With ``fp8_params`` (TE ``fp8_model_init``, Megatron-Core
``--fp8-param-gather``) the fp8 weight replaces the 16-bit compute copy.

Activations: each fp8 GEMM saves its input for the weight-gradient GEMM in fp8 (1 byte an element
plus its scale) instead of the 16-bit tensor; ``accounting.memory.layer_activation_bytes(fp8=...)``
applies that to the GEMM inputs it counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from exatrain.catalog.hardware import DeviceSpec
from exatrain.catalog.models import ModelSpec
from exatrain.errors import UserError
from exatrain.settings import FP8_RECIPES, HALF_DTYPES
from exatrain.accounting.params import attention_params, mlp_weight_params

META_TENSORS_PER_GEMM = 5  # 3 forward (input, weight, output) + 2 backward (grad output, grad input)


@dataclass(frozen=True)
class Fp8Recipe:
    """One fp8 training configuration (see the module doc)."""

    scaling: str = "delayed"
    amax_history_len: int = 1024  # delayed scaling only (TE's DelayedScaling default)
    fp8_params: bool = False  # the fp8 weight replaces the 16-bit compute copy
    transpose_cache: bool = True  # keep a second fp8 copy in the other layout (Hopper, and MXFP8's columns)

    def __post_init__(self) -> None:
        if self.scaling not in FP8_RECIPES:
            raise UserError(f"unknown fp8 scaling {self.scaling!r}; use one of {', '.join(FP8_RECIPES)}")
        n = self.amax_history_len
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UserError(f"fp8 amax_history_len must be a positive integer, got {n!r}")

    def activation_scale_bytes(self) -> float:
        """Scale bytes per fp8 activation element: fp32 per 1x128 tile (block), one byte per 32
        (mxfp8), ~0 for one fp32 scale per tensor."""
        return {"block": 4.0 / 128, "mxfp8": 1.0 / 32}.get(self.scaling, 0.0)

    def weight_scale_bytes(self) -> float:
        """Scale bytes per fp8 weight element: fp32 per 128x128 block (block), one byte per 32 (mxfp8)."""
        return {"block": 4.0 / (128 * 128), "mxfp8": 1.0 / 32}.get(self.scaling, 0.0)

    @property
    def saved_input_bytes(self) -> float:
        """Bytes per element of a GEMM input saved for backward in fp8."""
        return 1.0 + self.activation_scale_bytes()

    def weight_bytes_per_param(self, dtype: str) -> float:
        """Bytes per GEMM weight that fp8 training adds to the weights (negative if it saves):
        the cached fp8 copy (and its transpose), less the 16-bit compute copy under fp8_params."""
        copies = 2 if self.transpose_cache else 1
        fp8 = copies * (1.0 + self.weight_scale_bytes())
        copy16 = 2.0 if dtype in HALF_DTYPES else 0.0
        return fp8 - (copy16 if self.fp8_params else 0.0)

    def meta_bytes(self, gemms) -> float:
        """fp8 scaling state of ``gemms`` TE GEMMs: amax histories, scales and inverse scales
        (delayed scaling; the other recipes compute scales on the fly, nothing persistent)."""
        if self.scaling != "delayed":
            return 0.0 * gemms
        return gemms * META_TENSORS_PER_GEMM * (self.amax_history_len + 2) * 4.0


def gemm_weights(m: ModelSpec, moe: bool, tp: int = 1, ep: int = 1, etp: int = 1) -> float:
    """Weights of one layer's fp8 GEMMs held by one rank: the attention projections and the MLP,
    shared and local routed experts; not the router and not any norm."""
    a = attention_params(m)
    attn = a.sharded / tp + a.replicated
    if m.qk_norm:
        attn -= 2 * m.head_dim
    if m.mla:
        attn -= m.kv_lora_rank + m.q_lora_rank  # the latent RMSNorms
    if not (moe and m.is_moe):
        return attn + mlp_weight_params(m, m.ffn_hidden) / tp
    shared = m.shared_experts * mlp_weight_params(m, m.expert_width) / tp
    return attn + shared + routed_gemm_weights(m, ep, etp)


def routed_gemm_weights(m: ModelSpec, ep: int = 1, etp: int = 1) -> float:
    """The routed experts' share of ``gemm_weights`` of a MoE layer on one rank (the weights the
    expert-data-parallel group gathers; the rest the data-parallel group does)."""
    return m.experts * mlp_weight_params(m, m.expert_width) / (ep * etp) if m.is_moe else 0.0


def gemms_per_layer(m: ModelSpec, moe: bool, ep=1):
    """TE GEMM modules (each with its own fp8 meta) of one layer on one rank: QKV (or MLA's q and kv
    projections), output projection, fc1 and fc2; a MoE layer's grouped experts count one GEMM per
    local expert (TE GroupedLinear, num_gemms = experts / ep) for fc1 and for fc2."""
    attn = (2 + (1 if m.q_lora_rank else 0) + 1 + 1) if m.mla else 2
    if not (moe and m.is_moe):
        return attn + 2
    return attn + (2 if m.shared_experts else 0) + 2 * m.experts / ep


def gemm_peak_flops(device: DeviceSpec, dtype: str, fp8: Fp8Recipe | None) -> float | None:
    """Peak FLOP/s of the linear layers' GEMMs: the device's fp8 peak under an fp8 recipe, else its
    peak for ``dtype`` (the catalog's data-sheet figures)."""
    return device.peak_flops("float8" if fp8 is not None else dtype)


def fp8_flops_fraction(m: ModelSpec) -> float:
    """Share of a training step's model FLOPs that runs in fp8 under TE: the linear layers' GEMMs
    (not the attention core, the router or the output head)."""
    from exatrain.accounting.flops import layers_forward_flops_per_token, logits_forward_flops_per_token

    def linear_flops(moe: bool) -> float:
        # Active GEMM weights one token passes through (2 FLOPs each): top_k of the routed experts.
        w = gemm_weights(m, moe)
        if moe and m.is_moe:
            w -= (m.experts - m.top_k) * mlp_weight_params(m, m.expert_width)
        return 2.0 * w

    n_moe = m.moe_layers
    fp8 = (m.layers - n_moe) * linear_flops(False) + n_moe * linear_flops(True)
    return fp8 / (layers_forward_flops_per_token(m) + logits_forward_flops_per_token(m))
