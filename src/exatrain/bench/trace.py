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
2. ZeRO-0/1 data parallelism is applied in the accounting sense: DDP is left out, its gradient
   buckets added as DDP sizes them (``_with_ddp_buckets``), and ZeRO-1 is the trainer's
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
tp 8 traces in a few seconds). Needs no accelerator; the autocast rules applied are the CPU's, except
for an accelerator plan's norms, which run in fp32 as CUDA autocast runs them (bench/gpu_rules.py:
also what the trace cannot run here). The attention kernel is the one the plan names: with flash
attention, SDPA's fused kernel (the CPU's keeps what a GPU's flash kernel keeps: q, k, v, the output,
an fp32 log-sum-exp per head, no s x s scores); without it, SDPA's math kernel.

The fast trace (``fast_trace``, what ``trace_plan`` and ``estimate --trace`` run; ``trace_stage`` and
``--trace full`` trace every micro-batch): stages that build the same modules (``stage_shape``: the
embedding, the head, each layer's kind) differ only in their op order, i.e. in how many micro-batches
they hold in flight. One rank per shape is traced over a short order (``covering_order``: a few
micro-batches per chunk, in which every op type of its stages' full orders occurs), recording the
memory before, at the peak of, and after each op. An op's effect depends on its type (``op_types``:
kind, chunk, the chunk's previous op, whether its gradients exist), not on how many other
micro-batches are held; so each stage's peak is its own full order replayed from those effects
(``_replay``), the in-flight count of every rank (``accounting.inflight``) included. Where the traced
ops of one type differ, the shape's stages are traced in full instead. Tests hold the replayed peaks
equal to the full trace's, to the byte, on every layout of the trace matrices.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import nn

from exatrain.plan import Plan
from exatrain.bench.trace_ops import (  # re-exported: the op orders and the replay live there
    Op,
    ReplayError,
    ShapeProbe,
    _categories,
    _ensure_fake_world,
    _mesh,
    _peak_tracker_class,
    _PipelineFsdp,
    _Profile,
    _propagation_untracked,
    _Recorder,
    _replay,
    covering_order,
    fsdp_under_pipeline,
    op_types,
    schedule_orders,
    shape_probes,
    stage_shape,
)

__all__ = [
    "FastTrace",
    "ShapeProbe",
    "TracedMemory",
    "covering_order",
    "fast_trace",
    "op_types",
    "schedule_orders",
    "shape_probes",
    "stage_shape",
    "trace_plan",
    "trace_stage",
]


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


def trace_plan(
    plan: Plan,
    *,
    accelerator: bool = False,
    steps: int = 1,
    full: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[TracedMemory]:
    """The traced peak of one rank of every pipeline stage of ``plan``, in stage order.

    ``accelerator`` picks the optimizer implementation the trainer gets on a GPU (AdamW's foreach
    path, whose temporaries span all parameters); on the CPU torch runs the per-tensor loop.
    By default one rank per distinct stage shape is traced, over a short op order, and every stage's
    peak is replayed from it (``fast_trace``); ``full`` (or ``steps`` > 1) traces every stage with
    every micro-batch of the step. ``progress`` hears which rank is traced and with how many ops."""
    if full or steps != 1:
        out = []
        for r in range(plan.pp):
            if progress is not None:
                progress(f"tracing stage {r + 1} of {plan.pp} (all {plan.num_microbatches} micro-batches)")
            out.append(trace_stage(plan, r, accelerator=accelerator, steps=steps))
        return out
    return fast_trace(plan, accelerator=accelerator, progress=progress).stages


def trace_stage(plan: Plan, pp_rank: int, *, accelerator: bool = False, steps: int = 1) -> TracedMemory:
    """Trace ``steps`` optimizer steps of the rank (pp_rank, dp 0, cp 0, tp 0); the peak over them."""
    return _with_ddp_buckets(plan, _trace_rank(plan, pp_rank, accelerator=accelerator, steps=steps)[0])


def _with_ddp_buckets(plan: Plan, traced: TracedMemory) -> TracedMemory:
    """``traced`` with DDP's buckets added to other, where the trainer wraps the stage in DDP: the trace
    leaves DDP out (its reducer works in C++ over a real group), and its reducer keeps one bucket copy
    of every gradient, in the gradients' dtype (float32), from the first step on (gradient_as_bucket_view
    is off in parallel/data.py ``apply_ddp``). DDP runs only without a pipeline and without experts, so
    the rank's gradients are its parameters: float32 bytes of each, as many as the traced weights."""
    import dataclasses

    from exatrain.trainer.parallel.build import data_parallel_kind, execution_plan

    if data_parallel_kind(execution_plan(plan)) != "ddp":
        return traced
    return dataclasses.replace(traced, other=traced.other + traced.weights)


def _trace_rank(
    plan: Plan, pp_rank: int, *, accelerator: bool = False, steps: int = 1, order: list[Op] | None = None
) -> tuple[TracedMemory, "_Recorder | None"]:
    """Trace the rank (pp_rank, dp 0, cp 0, tp 0) over ``steps`` steps of its own op order, or (one
    step) over ``order`` ((kind, chunk, micro-batch) ops on its chunks), recording every op's memory."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from exatrain.bench.gpu_rules import cuda_norm_rules
    from exatrain.trainer.parallel.build import execution_plan, local_params_needed
    from exatrain.trainer.parallel.data import localize_dtensor_params

    plan = execution_plan(plan)
    _ensure_fake_world()
    mesh = _mesh(plan, pp_rank)
    chunks = _build(plan, mesh, pp_rank)
    if order is None:
        order = schedule_orders(plan, plan.num_microbatches)[pp_rank]
    norms = cuda_norm_rules() if accelerator else contextlib.nullcontext()  # a GPU plan's norms (gpu_rules.py)
    with FakeTensorMode(allow_non_fake_inputs=True), _balanced_routing(plan), norms:
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
        recorder = _Recorder(tracker) if steps == 1 else None
        run = _StepRunner(plan, chunks, tracker, order, recorder)
        with _propagation_untracked(tracker_cls), tracker:
            for _ in range(steps):
                optimizer.zero_grad(set_to_none=True)
                run.step()
                _settle_and_clip(params)
                optimizer.step()
            if recorder is not None:
                recorder.close()
        peak = tracker.get_tracker_snapshot("peak")
    return _traced(pp_rank, _categories(peak)), recorder


# ---- the fake world -------------------------------------------------------------------------------
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
    expert = (lambda mod: apply_expert_parallel(mod, mesh, plan, aux_loss_coef=0.01)) if plan.model.is_moe else None
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

        return ZeroRedundancyOptimizer(
            params, optimizer_class=torch.optim.AdamW, process_group=mesh.grad_mesh.get_group(), **kw
        )
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
    """Forward and backward of one step's micro-batches, in the order given: kind F forward, B whole
    backward, I input-gradient pass, W weight-gradient pass; without a pipeline, FB (forward and
    backward of one micro-batch, as trainer.train.Stepper runs it)."""

    def __init__(
        self,
        plan: Plan,
        chunks: list[tuple[int, nn.Module]],
        tracker: Any,
        order: list[Op],
        recorder: "_Recorder | None" = None,
    ) -> None:
        self.plan, self.chunks, self.tracker = plan, dict(chunks), tracker
        self.held = [i for i, _ in chunks]  # chunk k -> its virtual stage
        self.order, self.recorder = order, recorder
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

    def _op(self) -> contextlib.AbstractContextManager:
        return self.recorder.op() if self.recorder is not None else contextlib.nullcontext()

    def step(self) -> None:
        n = self.plan.num_microbatches
        if self.plan.pp == 1:  # trainer.train.Stepper without a pipeline: autocast per micro-batch
            module = self.chunks[0]
            for i, _ in enumerate(self.order):
                if hasattr(module, "set_requires_gradient_sync"):  # FSDP: as trainer.train._grad_sync
                    module.set_requires_gradient_sync(i == len(self.order) - 1)
                with self._op(), self.amp(), self.loss_ctx():
                    x = self._ids()
                    loss = self._loss(self._forward(0, x), x)
                    (loss / n).backward()
                    del loss, x
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
        saved: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        pending_w: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor | None]] = {}
        fsdp = _PipelineFsdp(self.plan, self.chunks, self.held, self.order)
        for i, (kind, k, mb) in enumerate(self.order):
            with self._op():
                fsdp.before(i)
                self._run_op(kind, self.held[k], mb, saved, pending_w)
                fsdp.after(i)

    def _run_op(self, kind: str, index: int, mb: int, saved: dict, pending_w: dict) -> None:
        from torch.distributed.tensor import DTensor

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
            return
        if kind == "W":
            out, grad = pending_w.pop(key)
            out.backward(grad)
            del out, grad
            return
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


@dataclass(frozen=True)
class FastTrace:
    """``fast_trace``'s answer: every stage's traced peak, the shapes traced, and the stages traced in
    full because their shape's ops could not be replayed."""

    stages: list[TracedMemory]
    probes: list[ShapeProbe]
    traced_in_full: tuple[int, ...]


def fast_trace(plan: Plan, *, accelerator: bool = False, progress: Callable[[str], None] | None = None) -> FastTrace:
    """``trace_plan`` by stage shape: one rank of each distinct shape is traced over its short order
    (``shape_probes``), every op's memory recorded; each stage of that shape then gets the peak of its
    own full order replayed from those ops (``_replay``). Where the traced ops of one type differ, or
    a replay cannot account for the traced step, that shape's stages are traced in full instead."""
    from exatrain.trainer.parallel.build import execution_plan

    plan = execution_plan(plan)
    full = schedule_orders(plan, plan.num_microbatches)
    probes = shape_probes(plan, full)
    fsdp = fsdp_under_pipeline(plan)
    out: dict[int, TracedMemory] = {}
    in_full: list[int] = []
    for i, probe in enumerate(probes, 1):
        if progress is not None:
            n = probe.microbatches
            progress(
                f"tracing stage {probe.rank + 1} of {plan.pp} (shape {i} of {len(probes)}, for "
                f"stage{_ranks_text(probe.members)}): {len(probe.order)} ops, {n} micro-batch"
                f"{'es' if n != 1 else ''} (the step has {plan.num_microbatches})"
            )
        traced, recorder = _trace_rank(plan, probe.rank, accelerator=accelerator, order=list(probe.order))
        try:
            assert recorder is not None
            if fsdp and len(plan.stages_of_rank(probe.rank)) > 3:
                raise ReplayError("FSDP gathers at most 3 of a rank's stages ahead: its gathers follow the whole order")
            types = op_types(list(probe.order), fsdp)
            profile = _Profile.of(recorder, types)
            if _traced(probe.rank, _replay(profile, types)) != traced:
                raise ReplayError("the replay of the traced order misses its traced peak")
            for r in probe.members:
                out[r] = _with_ddp_buckets(plan, _traced(r, _replay(profile, op_types(full[r], fsdp))))
        except ReplayError as exc:
            for r in probe.members:
                if progress is not None:
                    progress(f"tracing stage {r + 1} of {plan.pp} in full ({exc})")
                out[r] = trace_stage(plan, r, accelerator=accelerator)
                in_full.append(r)
    return FastTrace(stages=[out[r] for r in range(plan.pp)], probes=probes, traced_in_full=tuple(sorted(in_full)))


def _ranks_text(ranks: tuple[int, ...]) -> str:
    """' 3' or 's 2-15' (1-based stage numbers, runs collapsed)."""
    runs, start = [], ranks[0]
    for a, b in zip(ranks, [*ranks[1:], None]):
        if b != a + 1:
            runs.append(f"{start + 1}" if start == a else f"{start + 1}-{a + 1}")
            start = b
    return ("s " if len(ranks) > 1 else " ") + ", ".join(runs)


def _traced(pp_rank: int, snap: dict[str, int]) -> TracedMemory:
    """A peak snapshot (``_categories``) in the plan's categories."""
    return TracedMemory(
        pp_rank=pp_rank,
        weights=float(snap.get("Parameter", 0)),
        gradients=float(snap.get("Gradient", 0)),
        optimizer=float(snap.get("Optstate", 0)),
        activations=float(snap.get("Activation", 0) + snap.get("Temp", 0)),
        other=float(snap.get("Buffer", 0) + snap.get("Other", 0)),
    )
