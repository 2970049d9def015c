"""Mixture-of-experts models in the trainer: the layer against independent implementations, the
balancing loss and its gradient, the plan's ep field, refused layouts, and expert-parallel parity.

Parity (CPU, gloo, float32, seed 0, moe-tiny): every layout's per-step losses and gradient norms
over STEPS steps, and every parameter's first-step gradient gathered to its full tensor, equal the
single-process run's within 1e-5 relative. The gradients are read back from the step-1 checkpoint,
which assembles every shard into its whole tensor: AdamW's first moment after one step is exactly
(1 - beta1) times the (clipped) gradient, and the logged norm undoes the clipping. Each world size
runs its cases in one launch, shared with the other trainer tests (conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tests.helpers.trainer_runs import Run, max_rel_diff

from exatrain.accounting.params import stage_params, total_params
from exatrain.catalog import get_model
from exatrain.errors import PlanError, UserError
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.trainer.checkpoint import files as ckpt_files
from exatrain.trainer.checkpoint.storage import read_full
from exatrain.trainer.config import TrainConfig
from exatrain.trainer.model import Block, MoEBlock, Transformer
from exatrain.trainer.moe import MoE, balancing_loss, grouped_linear, top_k
from exatrain.trainer.parallel.pipeline import split_stages

RTOL = 1e-5
STEPS = 6
BETA1 = 0.9  # TrainConfig's default
GRAD_CLIP = 1.0  # TrainConfig's default


def assert_close(mine: torch.Tensor, theirs: torch.Tensor) -> None:
    """float32 agreement: within 1e-5 of the reference's own scale."""
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5 * float(theirs.detach().abs().max()))


def moe_spec(**changes):
    return get_model("moe-tiny").replace(**changes)


def init_moe(spec, seed: int = 0) -> MoE:
    torch.manual_seed(seed)
    moe = MoE(spec)
    with torch.no_grad():
        for name, p in moe.named_parameters():
            if name == "router.bias":
                p.copy_(torch.randn_like(p) * 0.05)
            else:
                p.normal_(0.0, 0.2)
    return moe


# ---- the layer on one device ------------------------------------------------------------------


def test_layer_equals_transformers_mixtral_block() -> None:
    """softmax router, top-2 renormalised, no shared experts: Mixtral's sparse MoE block, weights copied."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    spec = moe_spec(shared_experts=0)
    ours = init_moe(spec)
    cfg = MixtralConfig(
        hidden_size=spec.hidden,
        intermediate_size=spec.expert_width,
        num_local_experts=spec.experts,
        num_experts_per_tok=spec.top_k,
        hidden_act="silu",
        router_jitter_noise=0.0,
    )
    ref = MixtralSparseMoeBlock(cfg)
    with torch.no_grad():
        ref.gate.weight.copy_(ours.router.weight)
        ref.experts.gate_up_proj.copy_(torch.cat([ours.experts.w1, ours.experts.w3], dim=1))
        ref.experts.down_proj.copy_(ours.experts.w2)
    x = torch.randn(3, 16, spec.hidden)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ours, y_ref = ours.eval()(x1), ref(x2)
    assert_close(y_ours, y_ref)
    g = torch.randn_like(y_ref)
    y_ours.backward(g)
    y_ref.backward(g)
    for mine, theirs in (
        (x1.grad, x2.grad),
        (ours.router.weight.grad, ref.gate.weight.grad),
        (ours.experts.w2.grad, ref.experts.down_proj.grad),
        (torch.cat([ours.experts.w1.grad, ours.experts.w3.grad], dim=1), ref.experts.gate_up_proj.grad),
    ):
        assert_close(mine, theirs)


def naive_moe(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token, expert by expert, from the definitions in trainer/moe.py's docstring."""
    spec_k = moe.k
    w_r = moe.router.weight
    out = []
    for t in x.reshape(-1, x.shape[-1]):
        logits = w_r @ t
        if moe.router.kind == "sigmoid":
            s = torch.sigmoid(logits)
            sel = s + (moe.router.bias if moe.router.bias is not None else 0)
        else:
            s = torch.softmax(logits, dim=0)
            sel = s
        chosen = sorted(range(len(sel)), key=lambda e: (-float(sel[e]), e))[:spec_k]
        weights = torch.stack([s[e] for e in chosen])
        weights = weights / weights.sum()
        y = torch.zeros_like(t)
        for w, e in zip(weights, chosen):
            inner = F.silu(moe.experts.w1[e] @ t) * (moe.experts.w3[e] @ t)
            y = y + w * (moe.experts.w2[e] @ inner)
        if moe.shared is not None:
            y = y + moe.shared(t)
        out.append(y)
    return torch.stack(out).view_as(x)


@pytest.mark.parametrize("router, bias", [("softmax", False), ("sigmoid", True)])
def test_layer_equals_a_token_by_token_reference(router: str, bias: bool) -> None:
    moe = init_moe(moe_spec(router=router, router_bias=bias, top_k=2, shared_experts=1)).eval()
    x = torch.randn(2, 8, moe.router.weight.shape[1])
    with torch.no_grad():
        assert_close(moe(x), naive_moe(moe, x))


def test_grouped_gemm_equals_one_gemm_per_expert() -> None:
    x = torch.randn(11, 8)
    w = torch.randn(3, 5, 8)
    counts = [4, 0, 7]  # an expert without tokens in the middle
    expected = torch.cat([x[:4] @ w[0].T, x[4:4] @ w[1].T, x[4:] @ w[2].T])
    assert_close(grouped_linear(x, w, counts), expected)


def test_top_k_breaks_ties_towards_the_lower_expert() -> None:
    scores = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.1, 0.3, 0.3, 0.3], [0.5, 0.2, 0.5, 0.2]])
    assert top_k(scores, 2).tolist() == [[0, 1], [1, 2], [0, 2]]
    moe = init_moe(moe_spec(shared_experts=0))
    with torch.no_grad():
        moe.router.weight.zero_()  # every score equal: experts 0 and 1 for every token, every run
    _, idx, gates = moe.router(torch.randn(5, moe.router.weight.shape[1]))
    assert idx.tolist() == [[0, 1]] * 5 and torch.equal(gates, torch.full((5, 2), 0.5))


def test_balancing_loss_is_switch_eq4_with_top_k_copies() -> None:
    uniform = torch.full((8, 4), 0.25)
    idx = torch.tensor([[0, 1], [2, 3]] * 4)
    aux, loads = balancing_loss(uniform, idx, 4)
    assert loads.tolist() == [4, 4, 4, 4] and aux.item() == pytest.approx(1.0)
    probs = torch.softmax(torch.randn(8, 4), dim=-1)
    idx = torch.tensor([[0, 1]] * 8)  # everything on experts 0 and 1
    aux, _ = balancing_loss(probs, idx, 4)
    # N * sum_i f_i P_i with f = (1/2, 1/2, 0, 0)
    assert aux.item() == pytest.approx(4 * 0.5 * (probs[:, 0].mean() + probs[:, 1].mean()).item(), rel=1e-6)


def test_balancing_loss_gradient_is_that_of_the_objective() -> None:
    """The injected gradient equals autograd's of (task loss + coef * scale * aux), and each backward
    records one (aux, loads) pair."""
    spec = moe_spec()
    a, b = init_moe(spec), init_moe(spec)
    a.aux_coef, a.aux_scale = 0.01, 0.25
    x = torch.randn(2, 8, spec.hidden)
    target = torch.randn(2, 8, spec.hidden)
    ((a(x) - target) ** 2).mean().backward()
    b.eval()  # no injection; the objective written out
    probs, idx, _ = b.router(x.reshape(-1, spec.hidden))
    aux, _ = balancing_loss(probs, idx, spec.experts)
    (((b(x) - target) ** 2).mean() + 0.01 * 0.25 * aux).backward()
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert_close(pa.grad, pb.grad)
    assert len(a.records) == 1 and a.records[0][0].item() == pytest.approx(aux.item())
    assert int(a.records[0][1].sum()) == 2 * 8 * spec.top_k


def test_full_recompute_records_each_backward_once() -> None:
    spec = moe_spec()
    block = MoEBlock(spec)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.1)
    block.recompute = True
    from exatrain.trainer.model import rope_table

    block(torch.randn(2, 8, spec.hidden, requires_grad=True), rope_table(spec)).sum().backward()
    assert len(block.mlp.records) == 1


def test_model_layers_and_parameter_counts() -> None:
    spec = get_model("moe-tiny")  # 1 dense layer, then 3 MoE layers
    with torch.device("meta"):
        model = Transformer(spec)
    assert [type(b) for b in model.layers.values()] == [Block, MoEBlock, MoEBlock, MoEBlock]
    for name in ("moe-tiny", "mixtral-8x7b"):
        with torch.device("meta"):
            m = Transformer(get_model(name))
        assert sum(p.numel() for p in m.parameters()) == total_params(get_model(name))
    biased = moe_spec(router="sigmoid", router_bias=True, moe_every=2, dense_layers=0)
    with torch.device("meta"):
        m = Transformer(biased)
    assert [type(b) for b in m.layers.values()] == [Block, MoEBlock, Block, MoEBlock]
    assert sum(p.numel() for p in m.parameters()) == total_params(biased)
    assert not m.layers["1"].mlp.router.bias.requires_grad  # moved by the balancing rule, not the optimizer
    plan = Plan(model=spec, dims=ParallelDims(pp=2), shape=TrainShape(1, 4)).validate()
    counts = tuple(sum(p.numel() for _, s in split_stages(model, plan, r) for p in s.parameters()) for r in range(2))
    assert counts == stage_params(plan)


# ---- the plan and the refused layouts --------------------------------------------------------


def test_plan_ep_is_serialised_only_when_used() -> None:
    spec = get_model("moe-tiny")
    plain = Plan(model=spec, dims=ParallelDims(dp=2), shape=TrainShape(1, 4)).validate()
    assert "ep" not in plain.to_dict()
    ep = Plan(model=spec, dims=ParallelDims(dp=4, ep=2), shape=TrainShape(1, 4)).validate()
    assert ep.to_dict()["ep"] == 2 and ep.gpus == 4
    assert Plan.from_dict(ep.to_dict()).dims == ParallelDims(dp=4, ep=2)
    assert Plan.from_dict(plain.to_dict()).dims.ep == 1


@pytest.mark.parametrize(
    "model, dp, ep, words",
    [
        ("moe-tiny", 4, 3, "not divisible by ep 3"),  # 4 experts
        ("moe-tiny", 2, 4, "dp 2 is not divisible by ep 4"),
        ("gpt-tiny", 2, 2, "needs a mixture-of-experts model"),
        ("moe-tiny", 2, 0, "--ep must be a positive integer"),
    ],
)
def test_plan_refuses_impossible_ep(model: str, dp: int, ep: int, words: str) -> None:
    with pytest.raises(PlanError, match=words):
        Plan(model=get_model(model), dims=ParallelDims(dp=dp, ep=ep), shape=TrainShape(1, 4 * dp)).validate()


@pytest.mark.parametrize(
    "plan_kw, train_kw, words",
    [
        (dict(dp=2, ep=2, zero_stage=1), {}, "runs with --zero 0 only"),
        (dict(dp=2, ep=2, zero_stage=3), {}, "runs with --zero 0 only"),
        (dict(pp=2, schedule="zero_bubble", interleave=2), {}, "zero_bubble schedule does not run mixture-of-experts"),
        (dict(), dict(compile=True), "--compile does not run mixture-of-experts"),
        (dict(), dict(moe_aux_loss_coef=-1.0), "must be >= 0"),
    ],
)
def test_trainer_refuses_unsupported_moe_layouts_in_one_line(plan_kw: dict, train_kw: dict, words: str) -> None:
    dims = {k: plan_kw.pop(k) for k in ("dp", "ep", "pp") if k in plan_kw}
    plan = Plan(model=get_model("moe-tiny"), dims=ParallelDims(**dims), shape=TrainShape(1, 8), **plan_kw).validate()
    with pytest.raises(UserError, match=words) as info:
        TrainConfig(plan=plan, **train_kw).check()
    assert "\n" not in str(info.value)


def test_trainer_refuses_the_attention_variants_it_does_not_build() -> None:
    plan = Plan(model=get_model("qwen3-30b-a3b"), shape=TrainShape(1, 1)).validate()
    with pytest.raises(UserError, match="does not build kv_channels, qk_norm, latent or sliding-window attention"):
        TrainConfig(plan=plan).check()


# ---- expert-parallel parity ------------------------------------------------------------------

# DeepSeek-V3's router on moe-tiny: sigmoid scores, a balancing bias moved after every step.
SIGMOID_BIAS = dict(router="sigmoid", router_bias=True)
# What Mixtral's format can hold: every layer MoE, no shared experts (hf_export.py).
MIXTRAL_LIKE = moe_spec(shared_experts=0, dense_layers=0, name="moe-tiny-mixtral-like")
# Cases by world size (one launch each); the reference of a case is "single" or "single-sigmoid-bias".
# With a checkpoint: saved after every step, for the first-step gradients (module doc).
BATCHES: dict[int, dict[str, tuple[dict, bool]]] = {
    1: {
        "single": (dict(), True),
        "single-sigmoid-bias": (dict(model=moe_spec(**SIGMOID_BIAS)), True),
        "mixtral-like": (dict(model=MIXTRAL_LIKE, steps=2), True),
    },  # for the Hugging Face export
    2: {
        "ep2": (dict(dp=2, ep=2), True),
        "dp2-ep1-ddp": (dict(dp=2), False),  # the experts replicated over dp: DDP as for a dense model
        "ep2-sigmoid-bias": (dict(model=moe_spec(**SIGMOID_BIAS), dp=2, ep=2), True),
    },
    4: {
        "ep2-tp2": (dict(dp=2, ep=2, tp=2), True),
        "ep2-pp2": (dict(dp=2, ep=2, pp=2), True),
        "dp4-ep2": (dict(dp=4, ep=2), True),  # two expert-data-parallel ranks per expert
        "ep2-tp2-sp": (dict(dp=2, ep=2, tp=2, sequence_parallel=True), False),
    },
}
CASES = {name: spec for batch in BATCHES.values() for name, spec in batch.items()}
PARITY = [name for world, batch in BATCHES.items() if world > 1 for name in batch]
WITH_GRADS = [name for name in PARITY if CASES[name][1]]


def reference_name(name: str) -> str:
    return "single-sigmoid-bias" if name.endswith("sigmoid-bias") else "single"


def launch_cases(out: Path) -> dict[int, dict[str, dict]]:
    """This module's cases by world size, for the trainer tests' shared launches (conftest.py)."""
    return {
        world: {
            name: {"model": "moe-tiny", "steps": STEPS, "train_kw": train_kw(out, name, save), **kw}
            for name, (kw, save) in batch.items()
        }
        for world, batch in BATCHES.items()
    }


def train_kw(out: Path, name: str, save: bool) -> dict:
    return dict(checkpoint_dir=str(out / f"ckpt-{name}"), save_every=1) if save else {}


@pytest.fixture(scope="module")
def runs(world1: dict, world2: dict, world4: dict, trainer_out: Path) -> dict[str, tuple[Run, Path | None]]:
    """Every case's run and checkpoint root (None when it saved none)."""
    found = {**world1["moe"], **world2["moe"], **world4["moe"]}
    return {
        name: (found[name], Path(train_kw(trainer_out / "moe", name, True)["checkpoint_dir"]) if save else None)
        for name, (_, save) in CASES.items()
    }


def first_step_grads(run: Run, checkpoint: Path) -> dict[str, torch.Tensor]:
    """Whole first-step gradients by parameter name, from the step-1 checkpoint (module doc)."""
    moments = read_full(ckpt_files.select(checkpoint, 1).path, prefix="optim.")
    norm = run.grad_norms[0]
    unclip = (norm + 1e-6) / GRAD_CLIP if norm > GRAD_CLIP else 1.0  # train.clip_grad_norm's coefficient
    return {
        k.removesuffix(".exp_avg"): v.double() / (1 - BETA1) * unclip
        for k, v in moments.items()
        if k.endswith(".exp_avg")
    }


def router_biases(checkpoint: Path) -> dict[str, torch.Tensor]:
    weights = read_full(ckpt_files.select(checkpoint, STEPS).path, prefix="model.")
    return {k: v for k, v in weights.items() if k.endswith("router.bias")}


@pytest.mark.slow
def test_single_device_moe_learns_and_logs_its_balancing_loss(runs) -> None:
    for name in ("single", "single-sigmoid-bias"):
        run, _ = runs[name]
        assert len(run.losses) == STEPS and run.losses[-1] < run.losses[0] - 0.3, run.losses
        aux = [s["aux_loss"] for s in run.steps]
        assert all(0.9 < a < 1.5 for a in aux), aux  # near 1: a near-uniform load after a small init


@pytest.mark.slow
def test_balancing_bias_moves_by_the_rate_each_step(runs) -> None:
    """sigmoid router: after STEPS steps every bias is a sum of STEPS moves of +-rate (or 0 for an
    expert exactly at the mean load), and not all are still 0."""
    biases = router_biases(runs["single-sigmoid-bias"][1])
    assert len(biases) == get_model("moe-tiny").moe_layers
    rate = TrainConfig.moe_bias_update_rate
    for name, b in biases.items():
        moves = b.double() / rate
        assert torch.allclose(moves, moves.round(), atol=1e-3) and moves.abs().max() <= STEPS + 1e-3, (name, b)
    assert any(b.abs().max() > 0 for b in biases.values())


@pytest.mark.slow
def test_first_step_gradients_are_recovered_exactly(runs) -> None:
    """The checkpoint route loses nothing: the recovered gradients' global norm is the logged one."""
    run, root = runs["single"]
    grads = first_step_grads(run, root)
    norm = sum(float(g.pow(2).sum()) for g in grads.values()) ** 0.5
    assert norm == pytest.approx(run.grad_norms[0], rel=1e-6)
    assert any(".mlp.experts.w1" in k for k in grads) and any(".mlp.router.weight" in k for k in grads)


@pytest.mark.slow
@pytest.mark.parametrize("name", PARITY)
def test_losses_and_gradient_norms_equal_the_single_device_run(name: str, runs) -> None:
    (run, _), (ref, _) = runs[name], runs[reference_name(name)]
    assert len(run.losses) == STEPS
    aux, ref_aux = [s["aux_loss"] for s in run.steps], [s["aux_loss"] for s in ref.steps]
    diffs = [
        max_rel_diff(run.losses, ref.losses),
        max_rel_diff(run.grad_norms, ref.grad_norms),
        max_rel_diff(aux, ref_aux),
    ]
    print(
        f"{name}: max relative difference over {STEPS} steps: loss {diffs[0]:.1e}, grad norm {diffs[1]:.1e}, "
        f"balancing loss {diffs[2]:.1e}"
    )
    assert diffs[0] <= RTOL, (run.losses, ref.losses)
    assert diffs[1] <= RTOL, (run.grad_norms, ref.grad_norms)
    assert diffs[2] <= RTOL, (aux, ref_aux)


@pytest.mark.slow
@pytest.mark.parametrize("name", WITH_GRADS)
def test_first_step_gradients_equal_the_single_device_run(name: str, runs) -> None:
    """Each parameter's whole gradient: max |g - g_ref| within RTOL of max |g_ref| (its own scale)."""
    (run, root), (ref, ref_root) = runs[name], runs[reference_name(name)]
    grads, expected = first_step_grads(run, root), first_step_grads(ref, ref_root)
    assert grads.keys() == expected.keys()
    errors = {key: float((grads[key] - g).abs().max() / g.abs().max()) for key, g in expected.items()}
    worst = max(errors, key=errors.get)
    print(f"{name}: first-step gradients of {len(errors)} parameters, worst {errors[worst]:.1e} ({worst})")
    assert errors[worst] <= RTOL, (worst, errors[worst])
    if name.endswith("sigmoid-bias"):  # the bias moves agree too (loads summed over the dp ranks)
        mine, theirs = router_biases(root), router_biases(ref_root)
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


@pytest.mark.slow
def test_export_in_mixtral_format_loads_in_transformers_with_the_same_logits(runs, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from exatrain.trainer.hf_export import export_hf

    root = runs["mixtral-like"][1]
    export_hf(root, tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "MixtralForCausalLM"
    net = Transformer(MIXTRAL_LIKE)
    net.load_state_dict(read_full(ckpt_files.select(root).path, prefix="model."), strict=True)
    tokens = torch.randint(0, MIXTRAL_LIKE.vocab, (2, MIXTRAL_LIKE.seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs, ours = hf(tokens).logits, net.eval()(tokens)
    assert (theirs - ours).abs().max().item() <= 1e-5 * ours.abs().max().item()


@pytest.mark.slow
def test_export_refuses_what_mixtral_cannot_hold(runs, tmp_path: Path) -> None:
    from exatrain.trainer.hf_export import export_hf

    out = tmp_path / "hf"
    with pytest.raises(UserError, match="cannot be exported in Mixtral's format: it has 1 shared expert"):
        export_hf(runs["single"][1], out)
    assert not out.exists()  # nothing half-written
