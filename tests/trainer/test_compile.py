"""`--compile` (each block's forward and the loss under torch.compile) and the fused optimizer.

Compiled runs must train like eager ones: inductor reorders float32 reductions, so the bound is
looser than the parity tests' 1e-5, but far below what a wrong graph gives (a changed loss moves by
percents after a few steps at this learning rate).
"""

from __future__ import annotations

import pytest
import torch
from tests.helpers.trainer_runs import max_rel_diff, run_batch

from exatrain.cli import main
from exatrain.trainer.train import fused_adamw_ok

pytestmark = pytest.mark.slow
RTOL = 1e-4


def test_compiled_blocks_train_like_eager(tmp_path) -> None:
    """One process, then FSDP (ZeRO-3) over 2 ranks with compiled blocks and full recompute inside
    them, against the eager single-process run."""
    one = run_batch(tmp_path, {"eager": {}, "compiled": {"compile": True}}, timeout_s=600)
    assert max_rel_diff(one["compiled"].losses, one["eager"].losses) < RTOL
    assert max_rel_diff(one["compiled"].grad_norms, one["eager"].grad_norms) < RTOL
    assert one["compiled"].losses[-1] < 0.9 * one["compiled"].losses[0]  # it trained
    two = run_batch(tmp_path, {"fsdp-compiled": dict(dp=2, zero_stage=3, recompute="full", compile=True)},
                    timeout_s=600)
    assert max_rel_diff(two["fsdp-compiled"].losses, one["eager"].losses) < RTOL


def test_compile_with_tensor_parallel_is_refused(capsys) -> None:
    code = main(["train", "--model", "gpt-tiny", "--tp", "2", "--compile", "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--compile runs without tensor parallelism" in err


def test_fused_adamw_only_for_plain_tensors_on_a_gpu() -> None:
    params = [torch.empty(4, 4, device="meta")]
    assert fused_adamw_ok(params, torch.device("cuda"))
    assert not fused_adamw_ok(params, torch.device("cpu"))
