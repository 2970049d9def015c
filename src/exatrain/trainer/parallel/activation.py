"""What activations a layer keeps for the backward pass.

* recompute ``full``: each layer keeps only its input and recomputes the rest in the backward
  (Chen et al. 2016; Narayanan et al. 2021 Sec. 3.5); ``selective``: only the attention core
  (q k^T, softmax, times v) is recomputed (Korthikanti et al. 2022 Sec. 5), the cheap-to-recompute,
  expensive-to-store part. Both use ``torch.utils.checkpoint`` (non-reentrant) inside the layer,
  so parameter names and the wrappers applied later (FSDP, DDP) are unaffected.
* flash attention (SDPA's fused kernels) stores no s x s scores; without it, SDPA's math kernel.
"""

from __future__ import annotations

from exatrain.settings import RECOMPUTE
from exatrain.trainer.model import Transformer


def apply_activation_checkpointing(model: Transformer, recompute: str) -> None:
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    for block in model.layers.values():
        block.recompute = recompute == "full"
        block.attn.recompute = recompute == "selective"


def apply_attention_kernel(model: Transformer, flash_attention: bool) -> None:
    for block in model.layers.values():
        block.attn.math_kernel = not flash_attention


__all__ = ["apply_activation_checkpointing", "apply_attention_kernel"]
