"""`--compile` (each block's forward and the loss under torch.compile) and the fused optimizer.

Compiled runs must train like eager ones: inductor reorders float32 reductions, so the bound is
looser than the parity tests' 1e-5, but far below what a wrong graph gives (a changed loss moves by
percents after a few steps at this learning rate).
"""

from __future__ import annotations

import pytest
import torch
from tests.helpers.trainer_runs import max_rel_diff

from exatrain.cli import main
from exatrain.trainer.train import fused_adamw_ok

pytestmark = pytest.mark.slow
RTOL = 1e-4


def launch_cases(out) -> dict[int, dict[str, dict]]:
    """Compiled runs, in the trainer tests' shared launches (conftest.py); their eager reference is the
    parity tests' single-process run of the same config (test_parity.REFERENCE["gpt"])."""
    return {
        1: {"compiled": dict(compile=True)},
        2: {"fsdp-compiled": dict(dp=2, zero_stage=3, recompute="full", compile=True)},
    }


def test_compiled_blocks_train_like_eager(world1: dict, world2: dict) -> None:
    """One process, then FSDP (ZeRO-3) over 2 ranks with compiled blocks and full recompute inside
    them, against the eager single-process run."""
    eager, compiled = world1["parity"]["gpt"], world1["compile"]["compiled"]
    assert max_rel_diff(compiled.losses, eager.losses) < RTOL
    assert max_rel_diff(compiled.grad_norms, eager.grad_norms) < RTOL
    assert compiled.losses[-1] < 0.9 * compiled.losses[0]  # it trained
    assert max_rel_diff(world2["compile"]["fsdp-compiled"].losses, eager.losses) < RTOL


def test_compile_with_tensor_parallel_is_refused(capsys) -> None:
    code = main(["train", "--model", "gpt-tiny", "--tp", "2", "--compile", "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--compile runs without tensor parallelism" in err


def test_fused_adamw_only_for_plain_tensors_on_a_gpu() -> None:
    params = [torch.empty(4, 4, device="meta")]
    assert fused_adamw_ok(params, torch.device("cuda"))
    assert not fused_adamw_ok(params, torch.device("cpu"))
