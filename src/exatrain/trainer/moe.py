"""The mixture-of-experts feed-forward layer, written for one device (expert parallelism plugs in).

One MoE layer (Fedus et al. 2022, "Switch Transformers", Sec. 2; Mixtral, Jiang et al. 2024, Sec. 2):

* **router**: logits = x W_r^T in float32 (Megatron-Core's ``--moe-router-dtype fp32``), then
  - ``softmax``: p = softmax(logits) over all experts; the top_k largest p are chosen and their
    weights renormalised to sum to 1 (Mixtral's gate, Jiang et al. 2024 Eq. 1-2 and transformers'
    MixtralSparseMoeBlock; Qwen3-MoE's ``norm_topk_prob``);
  - ``sigmoid``: s = sigmoid(logits); the top_k of s + b are chosen, b being the per-expert
    balancing bias (a non-trained parameter, ``router_bias``), and the chosen s (without b) are
    normalised to sum to 1 (DeepSeek-V3 report, arXiv 2412.19437, Sec. 2.1.2, Eq. 13-16);
* **top-k with deterministic ties**: the k largest scores by a *stable* descending sort, so among
  equal scores the lower expert index wins (``torch.topk`` leaves the order of ties unspecified);
* **routed experts**: SwiGLU FFNs (Shazeer 2020) of width ``expert_width``, their weights stacked
  as [experts, out, in] tensors (expert e's slice is an ``nn.Linear`` weight). The token copies are
  sorted by expert (a stable sort: within an expert, in token order) and each expert's contiguous
  rows are multiplied by its matrices in one grouped GEMM (``torch.nn.functional.grouped_mm``
  where the device and dtype have it, else one GEMM per expert over its slice);
* **dropless**: every token reaches its top_k experts, whatever their load (no capacity factor;
  Gale et al. 2023, "MegaBlocks", Sec. 3);
* **shared experts**: ``shared_experts`` always-on experts of the same width, computed as one SwiGLU
  MLP of width shared_experts * expert_width (the sum of n SwiGLU MLPs is one n-times wider SwiGLU:
  DeepSeekMoE, Dai et al. 2024, Sec. 3.2; Megatron-Core's shared_expert_intermediate_size);
* **combine**: y = sum over the k chosen experts of weight * expert(x), plus the shared experts.

The auxiliary load-balancing loss (Switch Transformer, Fedus et al. 2022 Eq. 4-6):
aux = N * sum_i f_i * P_i over the N routed experts, f_i the fraction of the micro-batch's T*k token
copies routed to expert i and P_i the mean router probability of expert i over its T tokens (the
sigmoid router's normalised scores, DeepSeek-V3 Eq. 18-19). aux = 1 when the load is uniform. It is
computed per MoE layer over the tokens of one micro-batch, and ``coef`` * aux enters the training
objective of every MoE layer. Its gradient is injected in the backward pass at the layer's output
(Megatron-Core's MoEAuxLossAutoScaler, megatron/core/transformer/moe/moe_utils.py), so it reaches the
router from whichever pipeline stage holds the layer, while the reported loss stays the language-model
loss; each layer records its aux value and expert loads as the backward passes (once per micro-batch,
also under activation recomputation) for the step's log and for the bias update.

Expert parallelism (``parallel/expert.py`` sets ``ep_group``): rank r of the ep group holds experts
[r*N/ep, (r+1)*N/ep). The router runs on the tokens the rank holds; the per-(rank, expert) counts are
exchanged first (an all-to-all of N integers), then the sorted token copies are dispatched with
``all_to_all_single`` (uneven splits), the local experts run on what they received (regrouped by
expert), and a second all-to-all returns the outputs to the ranks the tokens came from (Megatron-Core's
all-to-all token dispatcher, megatron/core/transformer/moe/token_dispatcher.py). The backward of each
all-to-all is the all-to-all with the splits swapped.

Shapes: T = tokens (b*s), h = hidden, f = expert width, N = experts, k = top_k, E = local experts.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from exatrain.catalog.models import ModelSpec


def local(t: torch.Tensor) -> torch.Tensor:
    """The rank's own values of a parameter: a DTensor's local shard (tensor or expert parallel), a
    plain tensor as it is. MoE layers compute on plain tensors; DTensor's ``to_local`` carries the
    gradient back to the parameter with its own placements."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices [T, k] of the k largest scores of each row, largest first; equal scores in ascending
    expert order (a stable descending sort), so ties are resolved the same way on every run."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]


class Router(nn.Module):
    """The gate: scores, chosen experts and their combine weights (module doc)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.kind, self.k = spec.router, spec.top_k
        self.weight = nn.Parameter(torch.empty(spec.experts, spec.hidden))  # [N, h]
        # DeepSeek-V3's balancing bias: changes which experts are chosen, not their weights; adjusted
        # between steps from the measured loads (parallel/expert.py), never by the optimizer.
        self.bias = nn.Parameter(torch.empty(spec.experts), requires_grad=False) if spec.router_bias else None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, h] -> (probabilities for the balancing loss [T, N], chosen experts [T, k] int64,
        combine weights [T, k]), all float32."""
        with torch.autocast(x.device.type, enabled=False):
            logits = F.linear(x.float(), local(self.weight).float())  # [T, N]
        if self.kind == "sigmoid":
            scores = torch.sigmoid(logits)
            select = scores if self.bias is None else scores + local(self.bias).float()
            idx = top_k(select.detach(), self.k)
            gates = scores.gather(1, idx)
            probs = scores / scores.sum(dim=-1, keepdim=True)
        else:
            probs = torch.softmax(logits, dim=-1)
            idx = top_k(probs.detach(), self.k)
            gates = probs.gather(1, idx)
        return probs, idx, gates / gates.sum(dim=-1, keepdim=True)


def grouped_ok(x: torch.Tensor) -> bool:
    """Whether ``grouped_mm`` runs here: on the CPU (float32, bfloat16), and on CUDA GPUs of compute
    capability >= 8.0 in bfloat16 (its documented requirement); elsewhere one GEMM per expert."""
    if not hasattr(F, "grouped_mm"):
        return False
    if x.device.type == "cpu":
        return x.dtype in (torch.float32, torch.bfloat16)
    if x.device.type == "cuda" and torch.version.hip is None:
        return x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device)[0] >= 8
    return False


def grouped_linear(x: torch.Tensor, w: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Row group g of x (``counts[g]`` consecutive rows) times w[g]^T: x [R, in], w [G, out, in]
    -> [R, out]."""
    w = w.to(x.dtype)
    if grouped_ok(x):
        offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(device=x.device, dtype=torch.int32)
        return F.grouped_mm(x, w.transpose(1, 2), offs=offs)
    return torch.cat([F.linear(part, w[g]) for g, part in enumerate(x.split(counts))])


class Experts(nn.Module):
    """The routed experts' SwiGLU weights, stacked: w1 (gate) and w3 (up) [N, f, h], w2 (down) [N, h, f].
    Under expert parallelism each rank holds (and computes) a contiguous slice of the N."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        n, h, f = spec.experts, spec.hidden, spec.expert_width
        self.w1 = nn.Parameter(torch.empty(n, f, h))
        self.w3 = nn.Parameter(torch.empty(n, f, h))
        self.w2 = nn.Parameter(torch.empty(n, h, f))

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """x [R, h], its rows grouped by local expert (``counts`` rows each) -> [R, h]."""
        w1, w3, w2 = local(self.w1), local(self.w3), local(self.w2)
        inner = F.silu(grouped_linear(x, w1, counts)) * grouped_linear(x, w3, counts)  # [R, f]
        return grouped_linear(inner, w2, counts)


class SharedExperts(nn.Module):
    """shared_experts SwiGLU experts as one MLP of their summed width (module doc)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, f = spec.hidden, spec.shared_experts * spec.expert_width
        self.w1 = nn.Linear(h, f, bias=False)
        self.w3 = nn.Linear(h, f, bias=False)
        self.w2 = nn.Linear(f, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, h] -> [T, h]
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of rows with uneven splits; the backward sends the gradients back."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: dist.ProcessGroup
    ) -> torch.Tensor:
        ctx.splits, ctx.group = (in_splits, out_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        in_splits, out_splits = ctx.splits
        out = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return out, None, None, None


class AuxLossGrad(torch.autograd.Function):
    """Identity on the layer output y whose backward also starts the balancing loss's gradient:
    d(objective)/d(aux) = coef * scale (Megatron-Core's MoEAuxLossAutoScaler). ``scale`` is what the
    step applies to the language-model loss of one micro-batch (1/micro-batches when the loss is
    divided before its backward, 1 when the pipeline schedule divides the gradients afterwards).
    ``record`` receives (aux, expert loads) once per backward."""

    @staticmethod
    def forward(
        ctx: Any,
        y: torch.Tensor,
        aux: torch.Tensor,
        loads: torch.Tensor,
        coef: float,
        scale: float,
        record: Callable[[torch.Tensor, torch.Tensor], None],
    ) -> torch.Tensor:
        ctx.coef, ctx.scale, ctx.record = coef, scale, record
        ctx.save_for_backward(aux.detach(), loads)
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        aux, loads = ctx.saved_tensors
        ctx.record(aux, loads)
        aux_grad = None if ctx.coef == 0 else torch.full_like(aux, ctx.coef * ctx.scale)
        return grad, aux_grad, None, None, None, None


def balancing_loss(probs: torch.Tensor, idx: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(aux, loads): Switch Transformer's aux = N * sum_i f_i * P_i (Fedus et al. 2022 Eq. 4-6, f_i
    over the T*k token copies) and the token copies per expert [N] (int64)."""
    loads = torch.bincount(idx.reshape(-1), minlength=experts)
    f = loads.to(probs.dtype) / idx.numel()
    return experts * torch.sum(f * probs.mean(dim=0)), loads


class MoE(nn.Module):
    """Router, routed experts (dropless, top_k), optional shared experts: [b, s, h] -> [b, s, h].

    The fields after construction are set by the trainer: ``aux_coef`` and ``aux_scale`` (the
    balancing loss's weight and the step's per-micro-batch scale), ``ep_group`` (expert parallelism).
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.num_experts, self.k = spec.experts, spec.top_k
        self.router = Router(spec)
        self.experts = Experts(spec)
        self.shared = SharedExperts(spec) if spec.shared_experts else None
        self.aux_coef = 0.0  # no balancing loss unless the trainer sets one
        self.aux_scale = 1.0
        self.ep_group: dist.ProcessGroup | None = None
        self.ep = 1
        self.records: list[tuple[torch.Tensor, torch.Tensor]] = []  # (aux, loads) per backward

    def record(self, aux: torch.Tensor, loads: torch.Tensor) -> None:
        self.records.append((aux, loads))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])  # [T, h]
        probs, idx, gates = self.router(tokens)
        y = self.routed(tokens, idx, gates)
        if self.shared is not None:
            y = y + self.shared(tokens)
        y = y.view(shape)
        if self.training and torch.is_grad_enabled():
            aux, loads = balancing_loss(probs, idx, self.num_experts)
            y = AuxLossGrad.apply(y, aux, loads, self.aux_coef, self.aux_scale, self.record)
        return y

    def routed(self, x: torch.Tensor, idx: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        """sum_j gates[t, j] * expert_{idx[t, j]}(x[t]): x [T, h], idx and gates [T, k] -> [T, h]."""
        t, k = idx.shape
        flat = idx.reshape(-1)  # token copy c = t*k + j goes to expert flat[c]
        order = torch.argsort(flat, stable=True)  # copies sorted by expert, in token order within one
        counts = torch.bincount(flat, minlength=self.num_experts)  # [N]
        xs = x[order // k]  # [T*k, h]
        if self.ep_group is None:
            ys = self.experts(xs, counts.tolist())
        else:
            ys = self.exchange(xs, counts)
        y = ys[torch.argsort(order)].view(t, k, -1)  # back to copy order: [T, k, h]
        return (y * gates.to(y.dtype).unsqueeze(-1)).sum(dim=1)

    def exchange(self, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Dispatch the sorted copies to the ranks holding their experts, run the local experts,
        return the outputs in the same order: xs [T*k, h] -> [T*k, h]."""
        ep, group = self.ep, self.ep_group
        send = counts.view(ep, -1)  # [ep, E]: copies for each local expert of each rank
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send.contiguous(), group=group)  # recv[s, e]: from rank s to my expert e
        in_splits, out_splits = send.sum(dim=1).tolist(), recv.sum(dim=1).tolist()
        got = AllToAll.apply(xs, out_splits, in_splits, group)  # [R, h] by source rank, then expert
        sizes = recv.tolist()
        e_count = len(sizes[0])
        starts = [0, *accumulate(n for row in sizes for n in row)]  # of each (rank, expert) block
        # Regroup by local expert (then source rank): the order the grouped GEMM needs.
        by_expert = [
            torch.arange(starts[s * e_count + e], starts[s * e_count + e] + sizes[s][e])
            for e in range(e_count)
            for s in range(ep)
        ]
        perm = torch.cat(by_expert).to(xs.device)
        out = self.experts(got[perm], recv.sum(dim=0).tolist())
        back = out[torch.argsort(perm)]  # source-major order again
        return AllToAll.apply(back, in_splits, out_splits, group)


def moe_layers(module: nn.Module) -> list[MoE]:
    """The MoE layers inside ``module``, in model order."""
    return [m for m in module.modules() if isinstance(m, MoE)]


__all__ = [
    "AllToAll",
    "AuxLossGrad",
    "Experts",
    "MoE",
    "Router",
    "SharedExperts",
    "balancing_loss",
    "grouped_linear",
    "grouped_ok",
    "local",
    "moe_layers",
    "top_k",
]
