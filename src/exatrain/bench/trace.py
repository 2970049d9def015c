"""Per-rank peak memory of one training step, traced from the project's own model without allocating it.

For one rank of each pipeline stage of a plan (data- and tensor-parallel rank 0), under a fake
process group (collectives do nothing; the plan's mesh is laid over its ranks with this process at
the stage's coordinates) and ``FakeTensorMode`` (tensors carry shapes and dtypes, no storage):

1. the model is built on the meta device and given the trainer's own parallelism by the trainer's
   own code (``execution_plan``, ``split_stages``, then ``shard_stage`` of parallel/build.py:
   tensor/sequence parallelism as DTensors over the fake tp group, the routed experts of MoE layers
   over the (ep, tp) mesh with ``apply_expert_parallel``, the context shard of cp > 1 with
   ``context_shard``, activation checkpointing and the attention kernel, FSDP2 for ZeRO-2/3) on the
   trainer's own ``Mesh`` (parallel/mesh.py: (pp, dp, tp), (pp, dp, cp, tp), or (pp, edp, ep, tp)
   with dp flattened, as ``build_mesh`` lays them out); then it is materialised as fake tensors (tied weights
   kept tied, as ``trainer.init`` does) and, where the trainer does (``local_params_needed``: tensor
   parallelism with ZeRO-0/1 over dp > 1), its DTensor parameters are stored as local shards;
2. ZeRO-0/1 data parallelism is applied in the accounting sense: DDP is left out (its gradient
   buckets are a runtime cost of DDP, not of the layout), and ZeRO-1 is the trainer's
   ``ZeroRedundancyOptimizer``, which keeps only this rank's share of the Adam states;
3. after one untraced optimizer step (Adam's states exist from the second step on), one step runs
   as ``trainer.train`` runs it: the micro-batches in the order the plan's schedule gives this rank
   (forward + backward per micro-batch without a pipeline; with one, torch's own order — warm-up
   forwards, one-forward-one-backward, cool-down, taken from ``pipeline_order`` for the
   interleaved schedules), bf16 autocast, the vocabulary-parallel loss, the gradient norm and
   clipping, AdamW (foreach on accelerators, per tensor on the CPU, as torch defaults);
4. ``torch.distributed._tools.MemTracker`` follows every tensor's storage and reports the peak and
   its make-up (parameters, gradients, optimizer states, activations and temporaries, other).

Two corrections to the tracker: DTensor runs every op once more on fake tensors of the *global*
shape to learn its output's metadata, inside the active fake mode, where MemTracker would count
them as this rank's allocations — those calls pass untracked; and MemTracker's module hooks keep a
root module's inputs alive, so a stage releases each received activation after its backward.

Context parallelism: a rank's micro-batch is its s/cp tokens of each sequence (the trainer's
``shard_batch``), its attention all-gathers the keys and values of the whole sequence over the (fake)
cp group and masks them by global position, exactly as in a run; on the fake group the gather's
backward takes the reduce-scatter path (gloo runs an all-reduce and a slice instead: a transient of
one layer's gathered K/V gradient; forcing that path leaves the peaks of the tests' cp layouts unchanged).

Mixture of experts: the trainer's MoE layers are dropless (no capacity factor, so no static dispatch
buffers): how many token copies go to each expert and rank is read from the routing itself, which a
fake tensor does not have. ``torch.bincount`` (its length depends on the largest index) and
``.tolist()`` of the counts fail under FakeTensorMode; the trace answers those two reads as a
perfectly balanced router would (``_balanced_routing``: T*k copies split evenly over the N experts
and the ep ranks), and runs everything else of the layer — router, sort, gathers, the all-to-all
buffers over the ep group, the grouped GEMMs, the combine — as the trainer does. The traced peak
is that of a balanced step; an imbalanced step holds more routed rows on the busiest rank.

What a pipeline stage receives is a fresh tensor per micro-batch and the gradient it receives is
made at its backward: torch.distributed.pipelining's receive buffers (one per micro-batch and
direction, kept across steps) are a runtime overhead and are not traced (see the README).

Works for 175B-size layers on a laptop: nothing is allocated (a stage of three 175B-size layers at
tp 8 traces in a few seconds). Needs no accelerator; the autocast rules applied are the CPU's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

from exatrain.plan import Plan

__all__ = ["TracedMemory", "trace_plan", "trace_stage"]


@dataclass(frozen=True)
class TracedMemory:
    """Bytes one rank holds at its traced peak, by MemTracker's categories folded into the plan's:
    weights = parameters (the fp32 master copy; a 16-bit copy made by autocast or gathered by FSDP
    is created in the forward and counts as activations here), gradients, optimizer states,
    activations (activations + temporaries), other (buffers)."""

    pp_rank: int
    weights: float
    gradients: float
    optimizer: float
    activations: float
    other: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.other

    def to_dict(self) -> dict[str, float]:
        d = {k: getattr(self, k) for k in ("weights", "gradients", "optimizer", "activations", "other")}
        d["total"] = self.total
        return d


def trace_plan(plan: Plan, *, accelerator: bool = False, steps: int = 1) -> list[TracedMemory]:
    """The traced peak of one rank of every pipeline stage of ``plan``, in stage order.

    ``accelerator`` picks the optimizer implementation the trainer gets on a GPU (AdamW's foreach
    path, whose temporaries span all parameters); on the CPU torch runs the per-tensor loop."""
    return [trace_stage(plan, r, accelerator=accelerator, steps=steps) for r in range(plan.pp)]


def trace_stage(plan: Plan, pp_rank: int, *, accelerator: bool = False, steps: int = 1) -> TracedMemory:
    """Trace ``steps`` optimizer steps of the rank (pp_rank, dp 0, cp 0, tp 0); the peak over them."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from exatrain.trainer.parallel.build import execution_plan, local_params_needed
    from exatrain.trainer.parallel.data import localize_dtensor_params

    plan = execution_plan(plan)
    _ensure_fake_world()
    mesh = _mesh(plan, pp_rank)
    chunks = _build(plan, mesh, pp_rank)
    with FakeTensorMode(allow_non_fake_inputs=True), _balanced_routing(plan):
        modules = [m for _, m in chunks]
        for module in modules:
            _materialize(module)
            if local_params_needed(plan):  # as parallelize does: plain shards for DDP / ZeroRedundancyOptimizer
                localize_dtensor_params(module)
        params = _unique_params(modules)
        optimizer = _optimizer(plan, params, mesh, foreach=accelerator)
        _warm_optimizer(optimizer, params)  # Adam's states exist from the second step on
        tracker_cls = _peak_tracker_class()
        tracker = tracker_cls()
        tracker.track_external(*modules, optimizer, *([optimizer.optim] if hasattr(optimizer, "optim") else []))
        run = _StepRunner(plan, chunks, mesh, tracker)
        with _propagation_untracked(tracker_cls), tracker:
            for _ in range(steps):
                optimizer.zero_grad(set_to_none=True)
                run.step()
                _settle_and_clip(params)
                optimizer.step()
        peak = tracker.get_tracker_snapshot("peak")
    return _fold(pp_rank, peak)


# ---- the fake world -------------------------------------------------------------------------------
FAKE_WORLD = 1 << 16  # ranks of the fake process group; a plan's mesh uses the first plan.gpus of them


def _ensure_fake_world() -> None:
    """One fake process group per process, kept: its collectives do nothing, and DTensor caches
    meshes' groups, so tearing it down between traces would leave stale entries behind."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_backend() != "fake":
            raise RuntimeError("trace needs a process of its own: a real process group is initialised")
        return
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=FAKE_WORLD)


def _mesh(plan: Plan, pp_rank: int):
    """The trainer's ``Mesh`` of the plan (parallel/mesh.py ``build_mesh``: the same dimensions, names
    and flattened groups — (pp, dp, tp), (pp, dp, cp, tp) under context parallelism, (pp, edp, ep, tp)
    with dp = (edp, ep) flattened under expert parallelism) with this process (fake rank 0) at
    (pp_rank, dp 0, cp 0, tp 0): the ranks are rotated so that position holds rank 0."""
    from torch.distributed.device_mesh import DeviceMesh

    from exatrain.trainer.parallel.mesh import Mesh

    if plan.cp > 1:
        shape, names = (plan.pp, plan.dp, plan.cp, plan.tp), ("pp", "dp", "cp", "tp")
    elif plan.ep > 1:
        shape, names = (plan.pp, plan.dp // plan.ep, plan.ep, plan.tp), ("pp", "edp", "ep", "tp")
    else:
        shape, names = (plan.pp, plan.dp, plan.tp), ("pp", "dp", "tp")
    shift = pp_rank * (plan.gpus // plan.pp)
    ranks = ((torch.arange(plan.gpus) - shift) % plan.gpus).reshape(shape)
    mesh = DeviceMesh("cpu", ranks, mesh_dim_names=names)
    flat_dp = mesh["edp", "ep"]._flatten("dp") if plan.ep > 1 and plan.cp == 1 else None
    flat_dp_cp = mesh["dp", "cp"]._flatten("dp_cp") if plan.cp > 1 else None
    return Mesh(mesh=mesh, rank=0, pp_rank=pp_rank, dp_rank=0, tp_rank=0, device=torch.device("cpu"),
                embed_group=None, ep=plan.ep, flat_dp=flat_dp, cp=plan.cp, cp_rank=0, flat_dp_cp=flat_dp_cp)


def _build(plan: Plan, mesh: Any, pp_rank: int) -> list[tuple[int, nn.Module]]:
    """This rank's stages on meta, split and sharded by the trainer's own code (parallel/build.py
    ``parallelize``'s steps: ``split_stages`` then ``shard_stage``: TP/SP, the routed experts over
    the (ep, tp) mesh, the context shard, activation checkpointing, attention kernel, FSDP)."""
    from exatrain.trainer.model import Transformer
    from exatrain.trainer.parallel.build import shard_stage
    from exatrain.trainer.parallel.context import context_shard
    from exatrain.trainer.parallel.expert import apply_expert_parallel
    from exatrain.trainer.parallel.pipeline import split_stages

    with torch.device("meta"):
        whole = Transformer(plan.model)
    context = context_shard(mesh, plan.model.seq_len) if plan.cp > 1 else None
    expert = ((lambda mod: apply_expert_parallel(mod, mesh, plan, aux_loss_coef=0.01))
              if plan.model.is_moe else None)
    chunks = []
    for index, module in split_stages(whole, plan, pp_rank):
        shard_stage(module, plan, mesh.tp_mesh, mesh.grad_mesh, expert=expert, context=context)
        chunks.append((index, module))
    return chunks


def _materialize(module: nn.Module) -> None:
    """Fake storage for a meta-device module, keeping tied parameters tied (as trainer.init does)."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for sub in module.modules():
        for name, param in sub._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append((sub, name))
    module.to_empty(device="cpu")
    for group in holders.values():
        first = getattr(group[0][0], group[0][1])
        for sub, name in group[1:]:
            setattr(sub, name, first)
    for sub in module.modules():
        if hasattr(sub, "reset_buffers"):
            sub.reset_buffers()


@contextlib.contextmanager
def _balanced_routing(plan: Plan) -> Iterator[None]:
    """Routing at a perfectly balanced load, for the data-dependent reads of trainer/moe.py.

    The trainer's MoE layers are dropless (every token copy reaches its expert: no capacity, so no
    static dispatch buffers): the sizes of what they dispatch are read from the routing itself
    (``torch.bincount`` of the chosen experts, whose length depends on the largest index, and
    ``.tolist()`` of the per-expert and per-rank counts). A fake tensor has no values, so both
    fail under FakeTensorMode (DynamicOutputShapeException, DataDependentOutputException). Here
    they are answered as if the router spread the T*k token copies of the layer's T tokens evenly:
    a count tensor of n entries holds T*k/n in each (N experts, ep ranks, an ep x N/ep block), the
    load the balancing loss drives towards. Everything else of the layer (the router, the sort, the
    gathers, the all-to-all buffers, the grouped GEMMs) runs as the trainer runs it, on those sizes.
    Only the fake tensors of the trace are answered so; real tensors keep torch's own functions."""
    if not plan.model.is_moe:
        yield
        return
    from torch._subclasses.fake_tensor import FakeTensor

    bincount, tolist = torch.bincount, FakeTensor.tolist
    copies = [0]  # T*k of the layer being run: the chosen-expert indices last counted

    def balanced_bincount(x, weights=None, minlength=0):  # type: ignore[no-untyped-def]
        if not isinstance(x, FakeTensor):
            return bincount(x, weights, minlength)
        copies[0] = x.numel()
        return torch.zeros(minlength, dtype=torch.int64, device=x.device)

    def balanced_tolist(self):  # type: ignore[no-untyped-def]
        if self.is_floating_point() or not copies[0]:
            return tolist(self)
        n = self.numel()
        if copies[0] % n:
            raise ValueError(f"balanced routing needs the {copies[0]} token copies to split evenly over {n}")
        return _nested(tuple(self.shape), copies[0] // n)

    torch.bincount, FakeTensor.tolist = balanced_bincount, balanced_tolist
    try:
        yield
    finally:
        torch.bincount, FakeTensor.tolist = bincount, tolist


def _nested(shape: tuple[int, ...], value: int) -> Any:
    """A nested list of ``shape`` filled with ``value`` (what ``tolist`` returns)."""
    if not shape:
        return value
    return [_nested(shape[1:], value) for _ in range(shape[0])]


def _warm_optimizer(optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> None:
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _peak_tracker_class() -> type:
    from torch.distributed._tools.mem_tracker import MemTracker

    class PeakTracker(MemTracker):
        """MemTracker keeping only the whole-rank peak (its per-module peaks are not needed here and
        cost a pass over every module at every op), and blind to DTensor's sharding propagation:
        DTensor runs each op once more on fake tensors of the global shape to learn the output's
        metadata, in the active fake mode when there is one (ours), where MemTracker would count
        those global-shape tensors as allocations of this rank."""

        propagating = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if type(self).propagating:
                return func(*args, **(kwargs or {}))
            return super().__torch_dispatch__(func, types, args, kwargs)

        def _update_peak_stats(self, peak_state: Any) -> None:
            try:
                snaps, peaks, peak_snaps = self._curr_mem_snap, self._peak_mem, self._peak_mem_snap
            except AttributeError:  # another MemTracker layout: do what it does
                return super()._update_peak_stats(peak_state)
            for dev, dev_snap in snaps.items():
                total = dev_snap["Total"]
                if peaks.get(dev, 0) < total:
                    peaks[dev] = total
                    peak_snaps[dev] = dict(dev_snap)

    return PeakTracker


@contextlib.contextmanager
def _propagation_untracked(tracker_cls: type) -> Iterator[None]:
    """Mark DTensor's metadata propagation (the methods that run an op on global-shape fake
    arguments) so the tracker lets it pass."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    patched = []
    for name in ("_propagate_tensor_meta_non_cached", "_propagate_tensor_meta"):
        orig = ShardingPropagator.__dict__.get(name)
        if orig is None:
            continue

        def wrapped(self, *a, __orig=orig, **k):  # type: ignore[no-untyped-def]
            tracker_cls.propagating += 1
            try:
                return __orig(self, *a, **k)
            finally:
                tracker_cls.propagating -= 1

        setattr(ShardingPropagator, name, wrapped)
        patched.append((name, orig))
    try:
        yield
    finally:
        for name, orig in patched:
            setattr(ShardingPropagator, name, orig)


def _unique_params(modules: list[nn.Module]) -> list[nn.Parameter]:
    seen: dict[int, nn.Parameter] = {}
    for m in modules:
        for p in m.parameters():
            seen.setdefault(id(p), p)
    return list(seen.values())


def _optimizer(plan: Plan, params: list[nn.Parameter], mesh: Any, *, foreach: bool) -> torch.optim.Optimizer:
    """AdamW as ``trainer.train.build_optimizer`` makes it (decay groups do not change memory);
    ZeRO-1 shards over the replicas' group (dp, times cp)."""
    kw: dict[str, Any] = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=foreach)
    if plan.zero_stage == 1 and plan.dp * plan.cp > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW,
                                       process_group=mesh.grad_mesh.get_group(), **kw)
    return torch.optim.AdamW(params, **kw)


def _settle_and_clip(params: list[nn.Parameter]) -> None:
    """``settle_grads`` + ``clip_grad_norm`` of the trainer, minus reading the norm back (a fake
    tensor has no value): the same temporaries (torch's foreach norms, one scalar per gradient), the same in-place
    scale."""
    from torch.distributed.tensor import DTensor

    locals_ = []
    for p in params:
        g = p.grad
        if g is None:
            continue
        if isinstance(g, DTensor) and isinstance(p, DTensor) and tuple(g.placements) != tuple(p.placements):
            p.grad = g = g.redistribute(p.device_mesh, p.placements)
        locals_.append((g.to_local() if isinstance(g, DTensor) else g).detach())
    if not locals_:
        return
    total = torch.nn.utils.get_total_norm(locals_, 2.0).double()
    coef = (1.0 / (total + 1e-6)).clamp(max=1.0)
    for p in params:
        g = p.grad
        if g is not None:
            (g.to_local() if isinstance(g, DTensor) else g).mul_(coef.to(g.dtype))


# ---- one step of one rank -------------------------------------------------------------------------
class _StepRunner:
    """Forward and backward of one step's micro-batches, in this rank's schedule order."""

    def __init__(self, plan: Plan, chunks: list[tuple[int, nn.Module]], mesh: Any, tracker: Any) -> None:
        self.plan, self.chunks, self.mesh, self.tracker = plan, dict(chunks), mesh, tracker
        self.last = plan.virtual_stages - 1
        m = plan.model
        self.tokens = (plan.micro_batch, m.seq_len // plan.cp)  # a cp rank's share of each sequence
        bf16 = plan.dtype == "bfloat16"
        self.amp = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
        if plan.tp > 1:
            from torch.distributed.tensor.parallel import loss_parallel

            self.loss_ctx = loss_parallel
        else:
            self.loss_ctx = contextlib.nullcontext
        self.order = _rank_order(plan, [i for i, _ in chunks], mesh) if plan.pp > 1 else None

    def _forward(self, index: int, x: torch.Tensor) -> torch.Tensor:
        module = self.chunks[index]
        # MemTracker keeps per-module statistics for one call of a root module; a stage runs once
        # per micro-batch, and only the peak is wanted, so its root entry is restarted each call.
        self.tracker.memory_tracking.pop(module, None)
        return module(x)

    def _ids(self) -> torch.Tensor:
        return torch.randint(0, self.plan.model.vocab, self.tokens)

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        from exatrain.trainer.train import lm_loss

        return lm_loss(logits, targets)

    def step(self) -> None:
        n = self.plan.num_microbatches
        if self.order is None:  # trainer.train.Stepper without a pipeline: autocast per micro-batch
            for _ in range(n):
                with self.amp(), self.loss_ctx():
                    x = self._ids()
                    loss = self._loss(self._forward(0, x), x)
                    (loss / n).backward()
            return
        with self.amp(), self.loss_ctx():  # the whole schedule runs inside one autocast region
            self._pipeline_step()

    def _stage_input(self) -> torch.Tensor:
        """What a non-first stage receives: the residual stream as a plain tensor (the layers hand
        each other local tensors), bf16 under autocast (the model casts the embedding's output);
        [b, s/cp, h], and [b, s/(cp tp), h] with sequence parallelism."""
        m, p = self.plan.model, self.plan
        s = m.seq_len // p.cp // (p.tp if p.sequence_parallel else 1)
        dtype = torch.bfloat16 if p.dtype == "bfloat16" else torch.float32
        return torch.empty(p.micro_batch, s, m.hidden, dtype=dtype).requires_grad_(True)

    def _pipeline_step(self) -> None:
        from torch.distributed.tensor import DTensor

        saved: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        pending_w: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor | None]] = {}
        for kind, index, mb in self.order:
            key = (index, mb)
            if kind == "F":
                if index == 0:
                    x = self._ids()
                else:
                    x = self._stage_input()
                out = self._forward(index, x)
                if index == self.last:
                    out = self._loss(out, self._ids())
                saved[key] = (out, x)
                continue
            if kind == "W":
                out, grad = pending_w.pop(key)
                out.backward(grad)
                continue
            out, x = saved.pop(key)
            grad = None
            if index != self.last:  # the gradient received from the next stage
                local = out.to_local() if isinstance(out, DTensor) else out
                grad = torch.empty_like(local)
                if isinstance(out, DTensor):
                    grad = DTensor.from_local(grad, out.device_mesh, out.placements, run_check=False)
            if kind == "B":
                out.backward(grad)
            else:  # zero bubble's input-gradient pass: the graph stays for the weight pass
                if x.requires_grad:
                    torch.autograd.backward(out, grad, inputs=[x], retain_graph=True)
                pending_w[key] = (out, grad)
            x.grad = None  # the input gradient is sent to the previous stage
            if x.is_floating_point():
                # The received activation is dead now; MemTracker's module hooks keep a reference
                # to a root module's inputs, so release its storage explicitly (resize_ is tracked).
                x.untyped_storage().resize_(0)
            del out, x, grad


def _rank_order(plan: Plan, held: list[int], mesh: Any) -> list[tuple[str, int, int]]:
    """(kind, virtual stage, micro-batch) of every compute op of this rank, in execution order:
    kind F forward, B whole backward, I input-gradient pass, W weight-gradient pass."""
    p, m = plan.pp, plan.num_microbatches
    r = held[0] % p
    if plan.schedule == "gpipe":
        return [("F", r, j) for j in range(m)] + [("B", r, j) for j in range(m)]
    if plan.schedule == "1f1b":
        # torch Schedule1F1B: min(m, p - r) warm-up forwards, then backward/forward pairs, cool-down.
        warm = min(m, p - r)
        ops = [("F", r, j) for j in range(warm)]
        f = warm
        for b in range(m):
            ops.append(("B", r, b))
            if f < m:
                ops.append(("F", r, f))
                f += 1
        return ops
    # Interleaved schedules: torch computes the per-rank order when the schedule is built.
    from torch.distributed.pipelining import (PipelineStage, ScheduleInterleaved1F1B,
                                              ScheduleInterleavedZeroBubble)

    stub = [PipelineStage(nn.Identity(), k, plan.virtual_stages, torch.device("cpu"), group=mesh.pp_group)
            for k in held]
    cls = ScheduleInterleaved1F1B if plan.schedule == "interleaved" else ScheduleInterleavedZeroBubble
    sched = cls(stub, m, loss_fn=lambda a, b: a)
    ops = []
    for action in sched.pipeline_order[r]:
        if action is None:
            continue
        kind = str(getattr(action.computation_type, "value", action.computation_type))
        if kind in ("F", "B", "I", "W"):
            ops.append((kind, int(action.stage_index), int(action.microbatch_index)))
    return ops


def _fold(pp_rank: int, peak: dict) -> TracedMemory:
    """MemTracker's peak snapshot (one device) in the plan's categories."""
    snap: dict[str, int] = {}
    for dev_snap in peak.values():
        for k, v in dev_snap.items():
            snap[str(getattr(k, "value", k))] = snap.get(str(getattr(k, "value", k)), 0) + int(v)
    return TracedMemory(
        pp_rank=pp_rank,
        weights=float(snap.get("Parameter", 0)),
        gradients=float(snap.get("Gradient", 0)),
        optimizer=float(snap.get("Optstate", 0)),
        activations=float(snap.get("Activation", 0) + snap.get("Temp", 0)),
        other=float(snap.get("Buffer", 0) + snap.get("Other", 0)),
    )
