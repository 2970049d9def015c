"""The load balancing of MoE training tested by its effect, through the trainer's own path (a Trainer on one
gloo rank in this process, moe-tiny): the parity tests compare every layout with a single-process run that
carries the same bug, so they cannot see a wrong balancing coefficient or bias update; these can.

* the router's gradient is that of the documented objective, language-model loss + coef * aux of every MoE
  layer (coef = 0.01, Switch Transformer's alpha, per layer), written out here without the trainer's
  injected gradient; the aux term moves that gradient far beyond the comparison's tolerance;
* after one step, an expert every token was sent to (its balancing bias raised far above the others) has
  its bias lowered by the update rate, and each other expert's moves by the rate towards the mean load
  (DeepSeek-V3's auxiliary-loss-free balancing, arXiv 2412.19437, Sec. 2.1.2);
* in a bfloat16 run (autocast), the router's probabilities and combine weights are float32 and equal the float32
  computation from the router's input, which a bfloat16 router's are not: the softmax router, and DeepSeek-V3's
  sigmoid router with its balancing bias.

Seen to fail with each bug injected (and reverted): the trainer's balancing coefficient at 0 and divided by
the number of MoE layers (parallel/expert.py apply_expert_parallel: the first test); the bias update's sign
inverted (finish_moe_step: the second); the router's logits computed under autocast, in bfloat16
(moe.Router.forward: the third, both routers); the sigmoid router's logits alone rounded to bfloat16
(``torch.sigmoid(logits.bfloat16().float())`` in moe.Router.forward: the third's sigmoid case).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from exatrain.catalog import get_model
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.trainer.config import TrainConfig
from exatrain.trainer.moe import MoE, balancing_loss, moe_layers
from exatrain.trainer.sampler import local_batch
from exatrain.trainer.train import Trainer, lm_loss

SWITCH_ALPHA = 0.01  # Fedus et al. 2022, Sec. 2.2: the coefficient of every MoE layer's balancing loss


def trainer(dtype: str = "float32", **model) -> Trainer:
    """A one-rank Trainer of moe-tiny (two micro-batches of 2 sequences), the trainer's defaults."""
    spec = get_model("moe-tiny").replace(**model) if model else get_model("moe-tiny")
    plan = Plan(model=spec, dims=ParallelDims(), shape=TrainShape(2, 4), dtype=dtype, cluster="local-cpu").validate()
    return Trainer(TrainConfig(plan=plan, steps=1, quiet=True).check())


def batch(t: Trainer) -> tuple[torch.Tensor, torch.Tensor]:
    return local_batch(t.source, t.order, 0, 0, t.plan.model.seq_len)


def router_grads(module: torch.nn.Module) -> list[torch.Tensor]:
    return [m.router.weight.grad.detach().clone() for m in moe_layers(module)]


def written_out(t: Trainer, inputs: torch.Tensor, targets: torch.Tensor, coef: float) -> list[torch.Tensor]:
    """The router gradients of sum over micro-batches of (lm loss + coef * sum of the layers' aux) / micro-batches,
    by plain autograd: the layers in eval mode inject nothing, each aux computed from its router's output."""
    module = t.pm.modules[0]
    layers = moe_layers(module)
    routed: list[tuple[torch.Tensor, torch.Tensor]] = []
    hooks = [m.router.register_forward_hook(lambda mod, args, out: routed.append((out[0], out[1]))) for m in layers]
    module.eval()
    module.zero_grad(set_to_none=True)
    n, mb = t.plan.num_microbatches, t.plan.micro_batch
    try:
        for x, y in zip(inputs.split(mb), targets.split(mb)):
            routed.clear()
            loss = lm_loss(module(x), y)
            aux = sum(balancing_loss(probs, idx, m.num_experts)[0] for m, (probs, idx) in zip(layers, routed))
            ((loss + coef * aux) / n).backward()
    finally:
        for h in hooks:
            h.remove()
        module.train()
    return router_grads(module)


def test_the_router_gradient_is_that_of_the_loss_with_every_layers_balancing_term(one_rank: None) -> None:
    t = trainer()
    assert t.config.moe_aux_loss_coef == SWITCH_ALPHA
    inputs, targets = batch(t)
    module = t.pm.modules[0]
    module.zero_grad(set_to_none=True)
    t.stepper(inputs, targets)  # the trainer's forward and backward: the balancing gradient injected per layer
    ran = router_grads(module)
    want = written_out(t, inputs, targets, SWITCH_ALPHA)
    without = written_out(t, inputs, targets, 0.0)
    assert len(ran) == get_model("moe-tiny").moe_layers == 3
    for layer, (g, w, w0) in enumerate(zip(ran, want, without)):
        scale = float(w.abs().max())
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6 * scale, msg=f"MoE layer {layer}")
        # the balancing term's share is far above the tolerance: a coefficient of 0 or 0.01/3 shows
        assert float((w - w0).abs().max()) > 100 * 1e-6 * scale


def test_an_overloaded_experts_bias_goes_down_the_others_towards_the_mean(one_rank: None) -> None:
    t = trainer(router="sigmoid", router_bias=True)
    rate = t.config.moe_bias_update_rate
    layers = moe_layers(t.pm.modules[0])
    loads: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(layers))}
    for i, m in enumerate(layers):
        with torch.no_grad():
            m.router.bias.zero_()
            m.router.bias[0] = 10.0  # every token's first choice: expert 0 carries a copy of each token
        m.record = (lambda i, m: lambda aux, load: (loads[i].append(load.clone()), MoE.record(m, aux, load)))(i, m)
    before = [m.router.bias.detach().clone() for m in layers]
    t.step(0)
    for i, m in enumerate(layers):
        total = sum(loads[i]).double()
        tokens = t.plan.global_batch * t.plan.model.seq_len
        assert int(total[0]) == tokens and int(total.sum()) == tokens * t.plan.model.top_k  # overloaded: 2x the mean
        moved = (m.router.bias.detach() - before[i]).double()
        # (float32 biases: a move of 1e-3 at 10.0 is exact to its 1e-6 spacing)
        assert moved[0] == pytest.approx(-rate, rel=1e-3), moved  # the overloaded expert's bias went down
        assert torch.allclose(moved, rate * torch.sign(total.mean() - total), atol=1e-3 * rate), (moved, total)


def _route(kind: str, logits: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The balancing probabilities and the combine weights of the experts ``idx`` from the router's logits, written
    out (moe.Router: softmax, or DeepSeek-V3's sigmoid scores normalised over all experts and over the chosen)."""
    if kind == "sigmoid":
        scores = torch.sigmoid(logits)
        probs = scores / scores.sum(dim=-1, keepdim=True)
    else:
        probs = scores = torch.softmax(logits, dim=-1)
    gates = scores.gather(1, idx)
    return probs, gates / gates.sum(dim=-1, keepdim=True)


@pytest.mark.parametrize("kind", ["softmax", "sigmoid"])
def test_a_bfloat16_run_routes_in_float32(one_rank: None, kind: str) -> None:
    t = trainer("bfloat16", router=kind, router_bias=kind == "sigmoid")
    seen: list[tuple[torch.Tensor, ...]] = []
    hooks = [
        m.router.register_forward_hook(
            lambda mod, args, out: seen.append(
                (args[0].detach(), mod.weight.detach().clone(), out[0].detach(), out[1].detach(), out[2].detach())
            )
        )
        for m in moe_layers(t.pm.modules[0])
    ]
    try:
        t.step(0)
    finally:
        for h in hooks:
            h.remove()
    assert len(seen) == 3 * t.plan.num_microbatches  # every MoE layer, every micro-batch
    assert all(x.dtype == torch.bfloat16 for x, *_ in seen)  # the run is bfloat16 up to the router
    for x, w, probs, idx, gates in seen:
        assert probs.dtype == gates.dtype == torch.float32
        want_probs, want_gates = _route(kind, F.linear(x.float(), w.float()), idx)
        torch.testing.assert_close(probs, want_probs, rtol=0, atol=1e-6)
        torch.testing.assert_close(gates, want_gates, rtol=0, atol=1e-6)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            rounded = F.linear(x, w).float()
        bf16_probs, bf16_gates = _route(kind, rounded, idx)
        # what a router on bfloat16 logits would have given differs beyond the tolerance
        assert max(float((bf16_probs - want_probs).abs().max()), float((bf16_gates - want_gates).abs().max())) > 1e-5
