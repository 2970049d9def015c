"""The GPU plan's norms in the CPU trace (bench/gpu_rules.py): the rule it applies is CUDA autocast's,
and its RMSNorm keeps what the fused kernel keeps while computing what ``F.rms_norm`` computes.
The traced peaks of GPU plans against the trainer memory model are in the trace matrix
(tests/helpers/trace_matrix.py ``gpu-norms-*``, ``175b-*-gpu``; test_trace.py).

Broken on purpose and seen to fail here and there: ``cuda_norm_rules`` leaving the norms as they are
(test_trace.py: gpu-norms-gpt-long +8.7%, gpu-norms-llama-long-tp2-sp -8.6%);
``_FusedRMSNorm`` saving the normalised input as well (``test_fused_rms_norm_keeps_input_rstd_weight``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from exatrain.bench.gpu_rules import cuda_norm_rules, fused_rms_norm


def _autocast_dtype(device: str, op, *args) -> torch.dtype:
    """The output dtype of ``op`` under bf16 autocast on ``device`` for fake tensors of that device."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake = [FakeTensor(mode, torch.empty(shape, dtype=dt, device="meta"), torch.device(device)) for shape, dt in args]
    was, dtype = torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)
    torch.set_autocast_enabled(device, True)
    torch.set_autocast_dtype(device, torch.bfloat16)
    try:
        with mode:
            return op(*fake).dtype
    finally:
        torch.set_autocast_enabled(device, was)
        torch.set_autocast_dtype(device, dtype)


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm"])
def test_cuda_autocast_runs_the_norms_in_fp32_and_the_cpus_does_not(name) -> None:
    """The dispatcher's own autocast kernels, on fake tensors: CUDA's casts a bf16 input of either norm
    to fp32 (what gpu_rules applies to a GPU plan); the CPU's leaves it in bf16 (what the trace runs)."""
    op = getattr(torch.ops.aten, name)

    def norm(x, w):
        return op(x, [8], w, None, 1e-5) if name == "layer_norm" else op(x, [8], w, 1e-5)

    args = [((4, 8), torch.bfloat16), ((8,), torch.float32)]
    assert _autocast_dtype("cuda", norm, *args) == torch.float32
    assert (
        _autocast_dtype(
            "cpu", lambda x, w: op(x, [8], w.bfloat16(), *((None,) if name == "layer_norm" else ()), 1e-5), *args
        )
        == torch.bfloat16
    )
    linear = [((4, 8), torch.float32), ((3, 8), torch.float32)]  # and a 16-bit op stays one
    assert _autocast_dtype("cuda", torch.ops.aten.linear, *linear) == torch.bfloat16


def test_fused_rms_norm_computes_what_rms_norm_computes() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, dtype=torch.float64, requires_grad=True)
    g = torch.randn(3, 5, 16, dtype=torch.float64)
    got = fused_rms_norm(x, [16], w, 1e-6)
    gx, gw = torch.autograd.grad(got, (x, w), g)
    want = F.rms_norm(x, [16], w, 1e-6)
    wx, ww = torch.autograd.grad(want, (x, w), g)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(gx, wx)
    torch.testing.assert_close(gw, ww)


def test_fused_rms_norm_keeps_input_rstd_weight() -> None:
    """What the fused kernel's backward reads (its input, the per-token rstd, the weight), no more."""
    x = torch.randn(2, 32, 64, requires_grad=True)
    w = torch.randn(64, requires_grad=True)
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept[id(t.untyped_storage())] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fused_rms_norm(x, [64], w)
    assert sum(kept.values()) == 4 * (2 * 32 * 64 + 2 * 32 + 64)


def test_cuda_norm_rules_upcast_only_under_autocast_and_restore() -> None:
    x = torch.randn(2, 4, 8).bfloat16()
    ln, rms = F.layer_norm, F.rms_norm
    with cuda_norm_rules():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert F.layer_norm(x, [8]).dtype == torch.float32
            assert F.rms_norm(x, [8], torch.ones(8)).dtype == torch.float32
        assert F.layer_norm(x, [8]).dtype == torch.bfloat16  # no autocast: the input's dtype
    assert (F.layer_norm, F.rms_norm) == (ln, rms)
