"""FP8 GEMMs in the trainer (trainer/fp8.py, ``exatrain train --fp8 current``).

The error bound the layer must meet, derived from the formats (Micikevicius et al. 2022, arXiv
2209.05433, Table 1): rounding a scaled value v to E4M3 (3 mantissa bits) moves it by at most
2^-4 |v| while v is normal, and by at most half the subnormal spacing, 2^-10, below 2^-6; E5M2 (2
bits): 2^-3 |v| and 2^-17. Unscaled, the error of an entry t of a tensor scaled by s is at most
e(t) = u |t| + d / s (u the relative rounding, d the subnormal half-spacing). A product of two rounded operands then
errs by at most sum_k (e(x_k) |w_k| + |x_k| e(w_k) + e(x_k) e(w_k)) per output entry, plus the output's own rounding
(2^-8 relative in bf16; fp32 summation adds K 2^-24 sum |x w|, covered by a 1e-5 slack).

Broken on purpose, and what failed:
* quantisation skipped (``fp8_linear`` returning ``F.linear``): test_forward_and_gradients_within_the_fp8_bound
  and test_gemms_run_in_fp8_and_match_the_dequantised_product (the "not the unquantised result"
  checks), test_a_converted_model_calls_scaled_mm_three_times_per_linear;
* the gradient cast to E4M3 instead of E5M2: test_gemms_run_in_fp8_and_match_the_dequantised_product
  (the backward GEMMs' operand dtypes);
* the scale fixed at 1 (no amax scaling): both bound tests (the small operands flush to subnormals
  and zero), test_scales_come_from_the_whole_tensors_amax, test_zero_and_constant_tensors;
* no lower clamp of the amax (``fp8_max / amax``): test_zero_and_constant_tensors (nan scale);
* each shard's own amax under tensor parallelism (no all-reduce): test_tensor_parallel_fp8_equals_one_process;
* the swap left out of parallelize (build.py): the one-rank run's layer was ``Linear`` and its losses
  equal to the bf16 run's (both checked by test_one_rank_run_trains_through_fp8_layers);
* the weight gradient's GEMM written straight in fp32 (a second out dtype): the 2-rank tensor-parallel
  run failed in the optimizer (DTensor's cached _scaled_mm output metadata said bf16).
"""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from tests.helpers.trainer_runs import max_rel_diff

from exatrain.catalog import get_model
from exatrain.cli import main
from exatrain.errors import PlanError
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.trainer.config import TrainConfig
from exatrain.trainer.fp8 import E4M3, E5M2, Float8Linear, amax_scale, convert_to_fp8, fp8_linear, to_fp8
from exatrain.trainer.model import Transformer

E4M3_U, E4M3_SUB = 2.0**-4, 2.0**-10  # relative rounding of a normal value, absolute below the normals
E5M2_U, E5M2_SUB = 2.0**-3, 2.0**-17
TWO_RANK_STEPS = 5  # the 2-rank runs' length (the one-rank run takes the helpers' 10)


def launch_cases(out) -> dict[int, dict[str, dict]]:
    """Runs in the trainer tests' shared launches (conftest.py); the bf16 reference is the parity
    tests' single-process ``gpt-bf16`` run of the same data and seed."""
    fp8 = dict(dtype="bfloat16", fp8="current")
    short = dict(steps=TWO_RANK_STEPS, **fp8)  # inside the 10 warm-up steps: the one-rank run's first lrs
    return {
        1: {"gpt": fp8},
        2: {
            "tp2-sp-recompute-full": dict(tp=2, sequence_parallel=True, recompute="full", **short),
            "dp2-fsdp-zero3": dict(dp=2, zero_stage=3, **short),
        },
    }


def _err(t: torch.Tensor, u: float, sub: float) -> torch.Tensor:
    """The largest rounding error of each entry of ``t`` once scaled by amax_scale and cast (module doc)."""
    fmt = E4M3 if u == E4M3_U else E5M2
    return u * t.abs() + sub * t.abs().max() / torch.finfo(fmt).max  # scale = fp8 max / amax


def _bound(a: torch.Tensor, ea: torch.Tensor, b: torch.Tensor, eb: torch.Tensor) -> torch.Tensor:
    """Bound on |(a + da)(b + db) - a b| per entry of a @ b, |da| <= ea, |db| <= eb (plus fp32 summation)."""
    a, b = a.double().abs(), b.double().abs()
    ea, eb = ea.double(), eb.double()
    return ea @ b + a @ eb + ea @ eb + 1e-5 * (a @ b)


def _operands(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # Small and spread over four decades, as activations and gradients are: unscaled, most would be
    # below fp8's smallest subnormals (e4m3 2^-9, e5m2 2^-16) and flush to zero.
    x = torch.randn(4, 24, 80, generator=g) * torch.logspace(-6, -2, 80)
    w = torch.randn(48, 80, generator=g) * 1e-3
    b = torch.randn(48, generator=g) * 1e-6
    gy = torch.randn(4, 24, 48, generator=g) * 1e-6
    return x, w, b, gy


def _run(fn, x, w, b, gy):
    x, w, b = (t.clone().requires_grad_() for t in (x, w, b))
    y = fn(x, w, b)
    y.backward(gy)
    return y.detach(), x.grad, w.grad, b.grad


def test_forward_and_gradients_within_the_fp8_bound() -> None:
    x, w, b, gy = _operands()
    y, gx, gw, gb = _run(fp8_linear, x, w, b, gy)
    yr, gxr, gwr, gbr = _run(F.linear, x, w, b, gy)
    x2, g2 = x.reshape(-1, 80), gy.reshape(-1, 48)
    ex, ew, eg = _err(x2, E4M3_U, E4M3_SUB), _err(w, E4M3_U, E4M3_SUB), _err(g2, E5M2_U, E5M2_SUB)
    checks = {
        "y": (y.reshape(-1, 48), yr.reshape(-1, 48), _bound(x2, ex, w.t(), ew.t())),
        "grad_x": (gx.reshape(-1, 80), gxr.reshape(-1, 80), _bound(g2, eg, w, ew)),
        "grad_w": (gw, gwr, _bound(g2.t(), eg.t(), x2, ex)),
    }
    for name, (got, ref, bound) in checks.items():
        over = ((got.double() - ref.double()).abs() - bound).max().item()
        assert over <= 0, f"{name} exceeds the fp8 bound by {over}"
        # Quantisation happened: far from the unquantised product, whose fp32 rounding is ~1e-6.
        rel = ((got - ref).norm() / ref.norm()).item()
        assert rel > 1e-3, f"{name} is the unquantised result ({rel:.1e})"
    assert torch.allclose(gb, gbr, rtol=1e-6, atol=1e-6)  # the bias gradient: no GEMM, no fp8


def test_bf16_autocast_output_within_the_bound() -> None:
    x, w, b, _ = _operands(1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = fp8_linear(x, w, b)
    assert y.dtype == torch.bfloat16
    x2 = x.reshape(-1, 80)
    ref = F.linear(x2, w, b).double()
    bound = _bound(x2, _err(x2, E4M3_U, E4M3_SUB), w.t(), _err(w, E4M3_U, E4M3_SUB).t())
    bound = bound + 2.0**-8 * ref.abs() * 1.01
    assert ((y.reshape(-1, 48).double() - ref).abs() - bound).max().item() <= 0


def test_scales_come_from_the_whole_tensors_amax() -> None:
    t = torch.tensor([[0.5, -3.0], [2.0, 1.0]])
    assert amax_scale(t, E4M3).item() == pytest.approx(448.0 / 3.0)  # e4m3 max 448 (2209.05433 Table 1)
    assert amax_scale(t, E5M2).item() == pytest.approx(57344.0 / 3.0)  # e5m2 max 57344
    q, inv = to_fp8(t, E4M3)
    assert q.dtype == E4M3 and q.float().abs().max().item() == 448.0  # the amax entry maps onto the top
    assert inv.item() == pytest.approx(3.0 / 448.0)
    small = torch.full((16, 16), 1e-6)  # without scaling every entry would round to 0 in e4m3
    q, inv = to_fp8(small, E4M3)
    assert torch.allclose(q.float() * inv, small, rtol=2.0**-4)


def test_zero_and_constant_tensors() -> None:
    zeros = torch.zeros(16, 32)
    q, inv = to_fp8(zeros, E4M3)
    assert torch.isfinite(inv) and q.float().abs().max().item() == 0.0
    x, w = zeros.clone().requires_grad_(), torch.randn(8, 32).requires_grad_()
    y = fp8_linear(x, w)
    y.backward(torch.zeros_like(y))  # a zero gradient too: its amax is 0
    for t in (y, x.grad, w.grad):
        assert torch.isfinite(t).all() and t.abs().max().item() == 0.0
    c = torch.full((16, 32), -0.37)  # all equal: exact in fp8 once scaled (-> -448)
    q, inv = to_fp8(c, E4M3)
    assert torch.equal(q.float() * inv, c)
    y = fp8_linear(c, torch.full((8, 32), 2.0))
    assert torch.allclose(y, torch.full((16, 8), -0.37 * 2.0 * 32), rtol=1e-6)


class _Count(TorchDispatchMode):
    """Every _scaled_mm call's operand dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch.dtype, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._scaled_mm.default:
            self.calls.append((args[0].dtype, args[1].dtype))
        return func(*args, **(kwargs or {}))


def test_gemms_run_in_fp8_and_match_the_dequantised_product() -> None:
    x, w, _, gy = _operands(2)
    with _Count() as count:
        y, gx, gw, _ = _run(lambda a, b, c: fp8_linear(a, b), x, w, torch.zeros(48), gy)
    assert count.calls == [(E4M3, E4M3), (E5M2, E4M3), (E5M2, E4M3)]  # forward, grad_x, grad_w
    # The same product from the dequantised operands in float64: only fp32 summation apart.
    x2 = x.reshape(-1, 80)
    (x8, ix), (w8, iw), (g8, ig) = to_fp8(x2, E4M3), to_fp8(w, E4M3), to_fp8(gy.reshape(-1, 48), E5M2)
    xd, wd, gd = (q.double() * i.double() for q, i in ((x8, ix), (w8, iw), (g8, ig)))
    for got, ref in ((y.reshape(-1, 48), xd @ wd.t()), (gx.reshape(-1, 80), gd @ wd), (gw, gd.t() @ xd)):
        assert torch.allclose(got.double(), ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())
    assert not torch.allclose(y, F.linear(x, w), rtol=1e-3, atol=0)


def test_only_the_blocks_linears_become_fp8() -> None:
    for name, per_layer in (
        ("gpt-tiny", ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.fc1", "mlp.fc2")),
        ("llama-tiny", ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.w1", "mlp.w2", "mlp.w3")),
    ):
        spec = get_model(name)
        with torch.device("meta"):
            model = Transformer(spec)
        names = [n for n, _ in model.named_parameters()]
        params = {n: p for n, p in model.named_parameters()}
        assert convert_to_fp8(model) == spec.layers * len(per_layer)
        fp8 = sorted(n for n, m in model.named_modules() if isinstance(m, Float8Linear))
        assert fp8 == sorted(f"layers.{i}.{p}" for i in range(spec.layers) for p in per_layer)
        assert type(model.head) is nn.Linear  # the output head and the embedding stay
        assert [n for n, _ in model.named_parameters()] == names  # checkpoints and init see the same names
        assert all(p is params[n] for n, p in model.named_parameters())


def test_a_converted_model_calls_scaled_mm_three_times_per_linear() -> None:
    spec = get_model("gpt-tiny")
    torch.manual_seed(0)
    model = Transformer(spec)
    linears = convert_to_fp8(model)
    tokens = torch.randint(0, spec.vocab, (2, 32))
    with _Count() as count, torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(tokens).flatten(0, 1).float(), tokens.flatten())
        loss.backward()
    assert math.isfinite(loss.item())
    assert len(count.calls) == 3 * linears
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def _config(fp8: str = "current", device: str = "cpu", **model_kw) -> TrainConfig:
    spec = get_model(model_kw.pop("model", "gpt-tiny")).replace(**model_kw)
    plan = Plan(
        model=spec, dims=ParallelDims(tp=1, pp=1, dp=1), shape=TrainShape(2, 8), dtype="bfloat16", fp8=fp8
    ).validate()
    return TrainConfig(plan=plan, steps=1, device=device)


def test_config_runs_current_scaling_and_refuses_the_rest() -> None:
    _config().check()  # the CPU runs the same _scaled_mm code
    with pytest.raises(PlanError, match="runs --fp8 current .* not 'delayed'"):
        _config("delayed").check()
    with pytest.raises(PlanError, match="multiple of 16.*ffn_hidden/tp = 200"):
        _config(device="cuda", ffn_hidden=200).check()
    _config(device="cpu", ffn_hidden=200).check()  # any size on the CPU
    with pytest.raises(PlanError, match="dense models only"):
        _config(model="moe-tiny").check()
    with pytest.raises(PlanError, match="--fp8 does not run with --compile"):
        TrainConfig(plan=_config().plan, steps=1, compile=True).check()


def test_train_flag_reaches_the_plan(no_launch: list, capsys) -> None:
    assert main(["train", "--model", "gpt-tiny", "--gpus", "1", "--fp8", "current", "--steps", "2", "--quiet"]) == 0
    assert main(["train", "--fp8", "current", "--steps", "2", "--quiet"]) == 0  # the embedded float32 default
    assert len(no_launch) == 2
    for config in no_launch:
        assert config.plan.fp8 == "current" and config.plan.dtype == "bfloat16"  # --fp8 makes it bfloat16
    capsys.readouterr()
    code = main(["train", "--model", "gpt-tiny", "--gpus", "1", "--fp8", "block", "--steps", "2", "--quiet"])
    errors = [line for line in capsys.readouterr().err.splitlines() if "warning:" not in line]  # warning: no
    assert code == 2 and len(errors) == 1 and "use --fp8 current" in errors[0]  # prediction (no CPU fp8 peak)
    assert len(no_launch) == 2


@pytest.mark.slow
def test_one_rank_run_trains_through_fp8_layers(world1: dict) -> None:
    """`--fp8 current` on one rank: the blocks' linears are Float8Linear, the loss falls, and the run
    is not the bf16 run (quantisation happened) though close to it."""
    run, bf16 = world1["fp8"]["gpt"], world1["parity"]["gpt-bf16"]
    assert run.layer_class() == "Float8Linear" and bf16.layer_class() == "Linear"
    assert all(math.isfinite(x) for x in run.losses)
    assert run.losses[-1] < 0.9 * run.losses[0]
    diff = max_rel_diff(run.losses, bf16.losses)
    assert 1e-5 < diff < 0.05, diff


@pytest.mark.slow
def test_two_rank_layouts_train_like_one_rank(world1: dict, world2: dict) -> None:
    """Tensor + sequence parallel with full recompute, and FSDP (ZeRO-3), through the trainer: they
    run FP8 layers and train like the one-rank FP8 run. Only loosely: in bf16 a layout's different
    rounding flips some FP8 roundings, so these runs are about as far from the one-rank FP8 run (losses
    up to 6e-4 apart, measured) as that is from the bf16 run (3e-4); the exact tensor-parallel check
    is test_tensor_parallel_fp8_equals_one_process (float32)."""
    one = world1["fp8"]["gpt"].losses[:TWO_RANK_STEPS]
    for name, run in world2["fp8"].items():
        assert run.layer_class() == "Float8Linear", name
        assert len(run.losses) == TWO_RANK_STEPS and max_rel_diff(run.losses, one) < 5e-3, name
        assert run.losses[-1] < 0.95 * run.losses[0], name


def _tp_worker(rank: int, port: int) -> None:
    """Rank ``rank`` of 2: a column- then row-parallel pair of Float8Linear against the same pair in
    this process, float32 in and out (no autocast), so nothing but the shards differ."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        torch.manual_seed(0)
        ref = nn.Sequential(Float8Linear(64, 96), nn.ReLU(), Float8Linear(96, 48))
        with torch.no_grad():
            ref[0].weight[:48] *= 8.0  # rank 0's shard holds the amax: a per-shard scale would differ
        tp = nn.Sequential(Float8Linear(64, 96), nn.ReLU(), Float8Linear(96, 48))
        tp.load_state_dict(ref.state_dict())
        parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        x, g = torch.randn(2, 16, 64), torch.randn(2, 16, 48)
        y_ref, y_tp = ref(x), tp(x)
        y_ref.backward(g)
        y_tp.backward(g)
        got = {n: p.grad.full_tensor() for n, p in tp.named_parameters()}
        assert (y_tp - y_ref).abs().max().item() <= 1e-6 * y_ref.abs().max().item()  # summation order only
        for n, p in ref.named_parameters():  # weights: the same fp8 GEMMs; biases: a sum over tokens
            assert torch.equal(got[n], p.grad) if n.endswith("weight") else torch.allclose(got[n], p.grad), n
        # both ranks past every collective before either tears its gloo pairs down (destroying the group while the
        # other still talks over it can abort that process); bounded, so a rank that failed above is not waited on
        dist.monitored_barrier(timeout=timedelta(seconds=120))
    finally:
        dist.destroy_process_group()


def test_tensor_parallel_fp8_equals_one_process() -> None:
    """Two ranks (kept short: one small layer pair): the amax of every sharded tensor (activations,
    weights, gradients) is the whole tensor's, so each shard quantises exactly as one process does."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # fork: the ranks inherit this process's imports (a spawned rank spends most of its time importing torch)
    mp.start_processes(_tp_worker, args=(port,), nprocs=2, join=True, start_method="fork")
