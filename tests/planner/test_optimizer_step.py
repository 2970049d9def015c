"""The optimizer step as each engine runs it (``EngineProfile.step_passes``, ``adam_kernel``;
``cost.step.optimizer_seconds``; ``--adam-kernel``): torch's two AdamW kernels and its gradient clipping counted byte by
byte with a dispatch-mode counter, exatrain's own gradient norm counted on its trainer's code, then priced exactly as
counted; torchtitan's kernel switch, its export, the refusals.

Broken on purpose and seen to fail here: the foreach kernel priced at 28 bytes like the fused one (the kernel-count
test), exatrain's fused kernel kept under tensor parallelism (the exatrain pricing test), the norm's pass priced over
the optimizer shard instead of the gradients as held (the exatrain pricing test at ZeRO-1), the trainer's norm back to a
float64 copy of every gradient (the trainer norm test: 36 bytes a parameter), ``estimate_plan`` dropping
``adam_kernel`` on its way to ``evaluate`` (the torchtitan pricing test), the rule offering the switch to exatrain (the
refusal tests), the torchtitan export without its ``[optimizer]`` section (the export test), the trainer's refusal
dropped (the trainer test)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from exatrain.accounting.engines import ADAM_BYTES, ENGINES, get_engine
from exatrain.api.plans import make_plan
from exatrain.catalog import get_cluster
from exatrain.engine_configs import export
from exatrain.errors import UserError
from exatrain.settings import ADAM_KERNEL_RUNTIMES
from exatrain.planner.cost.coefficients import default_params
from exatrain.planner.estimate import estimate_plan
from tests.helpers.cli import refused_by_planner, saved_plan
from tests.helpers.passes import pass_seconds
from tests.helpers.plan_fields import check_round_trip, trainer_refuses

H100 = get_cluster("dgx-h100")
N = 1 << 12  # elements per tensor: large enough that the optimizer's scalars do not count


def _size(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class _Bytes(TorchDispatchMode):
    """Bytes every op reads (its tensor arguments) and writes (its fresh outputs, and those of the arguments its
    schema marks as written whose values it changed: ``_foreach_mul_``'s self, ``_fused_adamw_``'s params and moments
    but not its gradients); views move nothing; tensors smaller than the parameters (the per-tensor norms, the
    scalars) left out."""

    def __init__(self) -> None:
        super().__init__()
        self.read = self.written = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}

        def tensors(x) -> list[torch.Tensor]:
            return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor) and t.numel() >= N]

        values = dict(zip((a.name for a in func._schema.arguments), args)) | kwargs
        mutable = [
            t
            for a in func._schema.arguments
            if a.alias_info is not None and a.alias_info.is_write
            for t in tensors(values.get(a.name))
        ]
        before = [t.clone() for t in mutable]
        out = func(*args, **kwargs)
        if any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns):
            return out  # a view (detach): no bytes move
        fresh = [] if any(r.alias_info is not None for r in func._schema.returns) else tensors(out)
        self.read += _size(tensors((args, kwargs)))
        self.written += _size(fresh) + _size(t for t, b in zip(mutable, before) if not torch.equal(t, b))
        return out


def _params(n_tensors: int = 3) -> list[torch.nn.Parameter]:
    params = [torch.nn.Parameter(torch.randn(N)) for _ in range(n_tensors)]
    for p in params:
        p.grad = torch.randn(N)
    return params


def _per_param(count: _Bytes, params) -> float:
    return (count.read + count.written) / sum(p.numel() for p in params)


@pytest.mark.parametrize("kernel", ["fused", "foreach"])
def test_torch_adamw_moves_what_the_kernel_table_says(kernel: str) -> None:
    params = _params()
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, **{kernel: True})
    opt.step()  # the moments exist from here on
    with _Bytes() as count:
        opt.step()
    assert _per_param(count, params) == ADAM_BYTES[kernel]


def test_torch_clipping_reads_the_norm_then_always_scales() -> None:
    # torchtitan's clip_grad_norm_: get_total_norm, then clip_grads_with_norm_ (a mul_ whatever the norm)
    params = _params()
    with _Bytes() as count:
        torch.nn.utils.clip_grad_norm_(params, max_norm=0.5, foreach=True)  # a scale below 1: the writes show
    assert _per_param(count, params) == sum(get_engine("torchtitan").step_passes("bfloat16")) == 12.0


def test_the_trainers_norm_is_what_exatrain_is_priced_for(one_rank) -> None:
    from exatrain.trainer.parallel.grads import GradEntry, clip_grad_norm

    params = _params()
    entries = [GradEntry(p, copies=1) for p in params]
    with _Bytes() as count:
        clip_grad_norm(entries, max_norm=1e9, device=torch.device("cpu"))  # no clipping: the norm only
    assert _per_param(count, params) == sum(get_engine("exatrain").step_passes("bfloat16")) == 4.0


def test_each_engine_states_its_passes_for_every_dtype_it_trains() -> None:
    for name, engine in ENGINES.items():
        for dtype in ("bfloat16", "float32"):
            if engine.zero_stages(dtype):
                assert sum(engine.step_passes(dtype)) > 0, (name, dtype)
        assert engine.step_pass_source and engine.adam_source, name
    # Megatron-Core: norm 4 + the main weights copied into the 16-bit ones (4 + 2); 16-bit main grads copied to fp32
    mc = get_engine("megatron-core")
    assert mc.step_passes("bfloat16") == (0.0, 0.0, 10.0)
    assert mc.with_grad_accum("bfloat16").step_passes("bfloat16") == (0.0, 0.0, 16.0)


def _plan(runtime: str = "exatrain", **kw):
    args = dict(gpus=8, tp=1, pp=1, micro_batch=1, global_batch=16, zero=0, recompute="full", runtime=runtime)
    args.update(kw)
    return make_plan("llama3-8b", H100, **args)


def _optimizer_s(plan) -> float:
    return estimate_plan(plan, H100, default_params(H100.device.name)).time_s.optimizer


@pytest.mark.parametrize(
    ("tp", "zero", "kernel", "held"),
    [(1, 0, "fused", 1), (2, 0, "foreach", 1), (1, 1, "foreach", 1), (1, 3, "foreach", 8)],
)
def test_exatrain_prices_its_own_kernel_and_norm(tp: int, zero: int, kernel: str, held: int) -> None:
    # fused only over plain tensors (tp 1, ZeRO-0); the norm over the gradients as held (sharded by FSDP only)
    plan = _plan(tp=tp, zero=zero)
    shard = plan.dp if zero >= 1 else 1
    expect = float(pass_seconds(plan, H100, ADAM_BYTES[kernel] / shard + 4.0 / held).max())
    assert _optimizer_s(plan) == pytest.approx(expect, rel=1e-9)
    assert any(f"optimizer step: {kernel} Adam" in n for n in estimate_plan(plan, H100).notes)


def test_the_cpu_runs_foreach() -> None:
    cpu = get_cluster("local-cpu")
    plan = make_plan("llama-tiny", cpu, gpus=1, micro_batch=1, global_batch=1)
    assert any("optimizer step: foreach Adam" in n for n in estimate_plan(plan, cpu).notes)


def test_torchtitan_prices_the_kernel_it_is_told() -> None:
    plan = _plan("torchtitan", zero=3)
    fused, foreach = (_optimizer_s(plan.replace(adam_kernel=k)) for k in ("fused", "foreach"))
    assert _optimizer_s(plan) == fused  # its own since 2025-02
    shard = float(pass_seconds(plan, H100, 1.0 / plan.dp).max())
    assert foreach - fused == pytest.approx((ADAM_BYTES["foreach"] - ADAM_BYTES["fused"]) * shard, rel=1e-9)
    assert fused == pytest.approx((ADAM_BYTES["fused"] + 12.0) * shard, rel=1e-9)


def test_the_plan_file_round_trip(tmp_path) -> None:
    check_round_trip(tmp_path, H100, "adam_kernel", "foreach")


def test_the_torchtitan_export_sets_it_and_megatrons_say_they_cannot() -> None:
    plan = _plan("torchtitan", zero=3, adam_kernel="foreach")
    assert (
        "[optimizer]" in export(plan, "torchtitan").text
        and 'implementation = "foreach"' in export(plan, "torchtitan").text
    )
    assert "[optimizer]" not in export(_plan("torchtitan", zero=3), "torchtitan").text
    for target in ("megatron", "deepspeed"):
        assert any("runs its FusedAdam" in n for n in export(plan, target).notes), target


def test_refusals_are_one_line() -> None:
    assert ADAM_KERNEL_RUNTIMES == ("torchtitan",)
    for runtime in ("megatron-core", "megatron-deepspeed", "exatrain"):
        with pytest.raises(UserError, match=f"torchtitan's switch .*; {runtime} "):
            _plan(runtime, zero=1, adam_kernel="foreach")
    with pytest.raises(UserError, match="must be one of fused, foreach, got 'sgd'"):
        _plan("torchtitan", zero=3, adam_kernel="sgd")


def test_the_cli_refuses_with_exit_2(capsys) -> None:
    refused_by_planner(
        capsys,
        "--adam-kernel is torchtitan's switch",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "8",
        "--global-batch",
        "16",
        "--runtime",
        "megatron-core",
        "--adam-kernel",
        "foreach",
    )


def test_a_saved_plan_keeps_it_and_the_trainer_refuses_it(tmp_path, capsys) -> None:
    saved = saved_plan(
        capsys,
        tmp_path / "p.json",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "8",
        "--zero",
        "3",
        "--runtime",
        "torchtitan",
        "--adam-kernel",
        "foreach",
    )
    assert saved["adam_kernel"] == "foreach"
    trainer_refuses("--adam-kernel foreach is torchtitan's switch", zero=3, runtime="torchtitan", adam_kernel="foreach")
