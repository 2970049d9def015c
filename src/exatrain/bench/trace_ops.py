"""The trace's instruments and op orders (``bench.trace``): the peak-tracking MemTracker and the untracked
sharding propagation, every pipeline rank's op order under the plan's schedule, the recorder of each op's memory
and its replay over another order (``fast_trace``), and the shape probes and covering orders the fast trace uses."""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

from exatrain.plan import Plan

Op = tuple[str, int, int]  # (kind, chunk: the rank's k-th held stage, micro-batch)


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
    return Mesh(
        mesh=mesh,
        rank=0,
        pp_rank=pp_rank,
        dp_rank=0,
        tp_rank=0,
        device=torch.device("cpu"),
        embed_group=None,
        ep=plan.ep,
        flat_dp=flat_dp,
        cp=plan.cp,
        cp_rank=0,
        flat_dp_cp=flat_dp_cp,
    )


def _peak_tracker_class() -> type:
    from torch.distributed._tools.mem_tracker import MemTracker

    class PeakTracker(MemTracker):
        """MemTracker keeping only the whole-rank peak (its per-module peaks are not needed here and
        cost a pass over every module at every op), and blind to DTensor's sharding propagation:
        DTensor runs each op once more on fake tensors of the global shape to learn the output's
        metadata, in the active fake mode when there is one (ours), where MemTracker would count
        those global-shape tensors as allocations of this rank."""

        propagating = 0
        # The peak since the window was last opened (``_Recorder``: one op of the step), as
        # ``_categories`` gives it; None while no window is open.
        window: dict[str, int] | None = None
        windowed = True  # False once the fallback below ran: no window was kept

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if type(self).propagating:
                return func(*args, **(kwargs or {}))
            return super().__torch_dispatch__(func, types, args, kwargs)

        def _update_peak_stats(self, peak_state: Any) -> None:
            try:
                snaps, peaks, peak_snaps = self._curr_mem_snap, self._peak_mem, self._peak_mem_snap
            except AttributeError:  # another MemTracker layout: do what it does
                self.windowed = False
                return super()._update_peak_stats(peak_state)
            total = 0
            for dev, dev_snap in snaps.items():
                total += dev_snap["Total"]
                if peaks.get(dev, 0) < dev_snap["Total"]:
                    peaks[dev] = dev_snap["Total"]
                    peak_snaps[dev] = dict(dev_snap)
            if self.window is not None and total > self.window[TOTAL]:
                self.window = _categories(snaps)

        def current(self) -> dict[str, int]:
            return _categories(self._curr_mem_snap)

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


def schedule_orders(plan: Plan, num_microbatches: int) -> list[list[Op]]:
    """Every pipeline rank's compute ops, in execution order, for ``num_microbatches`` micro-batches of
    the plan's schedule: GPipe and 1F1B as torch's ScheduleGPipe / Schedule1F1B run them (1F1B: rank
    r's min(m, p - r) warm-up forwards, then backward/forward pairs, then the cool-down), the
    interleaved schedules as torch computes them (``pipeline_order``). Without a pipeline: one FB op
    per micro-batch. Raises ValueError where torch refuses the micro-batch count."""
    p, m = plan.pp, num_microbatches
    if p == 1:
        return [[("FB", 0, j) for j in range(m)]]
    if plan.schedule == "gpipe":
        return [[("F", 0, j) for j in range(m)] + [("B", 0, j) for j in range(m)] for _ in range(p)]
    if plan.schedule == "1f1b":
        orders = []
        for r in range(p):
            warm = min(m, p - r)
            ops = [("F", 0, j) for j in range(warm)]
            f = warm
            for b in range(m):
                ops.append(("B", 0, b))
                if f < m:
                    ops.append(("F", 0, f))
                    f += 1
            orders.append(ops)
        return orders
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble

    _ensure_fake_world()
    group = _mesh(plan, 0).pp_group
    stub = [
        PipelineStage(nn.Identity(), k, plan.virtual_stages, torch.device("cpu"), group=group)
        for k in plan.stages_of_rank(0)
    ]
    cls = ScheduleInterleaved1F1B if plan.schedule == "interleaved" else ScheduleInterleavedZeroBubble
    sched = cls(stub, m, loss_fn=lambda a, b: a)
    orders = []
    for r in range(p):
        ops = []
        for action in sched.pipeline_order[r]:
            if action is None:
                continue
            kind = str(getattr(action.computation_type, "value", action.computation_type))
            if kind in ("F", "B", "I", "W"):
                ops.append((kind, int(action.stage_index) // p, int(action.microbatch_index)))
        orders.append(ops)
    return orders


def op_types(order: list[Op], reduce_at_end: bool = False) -> list[tuple]:
    """What an op's effect on the rank's memory depends on besides its chunk's shape: (kind, chunk,
    the kind of the chunk's previous op (FSDP keeps a chunk's parameters gathered from a forward to
    its backward under ZeRO-2), whether the chunk already has gradients (the first backward allocates
    them; later ones accumulate into them)); with ``reduce_at_end`` (FSDP under a pipeline, which
    reduce-scatters after a stage's last backward: ``fsdp_under_pipeline``), whether it is the chunk's
    last op. The stored activations of the other micro-batches in flight are state, carried by the
    replay (``_replay``)."""
    prev: dict[int, str] = {}
    graded: set[int] = set()
    last = {k: i for i, (_, k, _) in enumerate(order)}
    out = []
    for i, (kind, k, _) in enumerate(order):
        out.append((kind, k, prev.get(k), k in graded) + ((last[k] == i,) if reduce_at_end else ()))
        prev[k] = kind
        if kind in ("B", "W", "FB"):
            graded.add(k)
    return out


def fsdp_under_pipeline(plan: Plan) -> bool:
    """FSDP2 (ZeRO-2/3 over dp x cp > 1) under a pipeline: its stages reduce once a step, after their last
    backward (torch pipelining's ``perform_reduce_grad``; bench/trace.py ``_PipelineFsdp``)."""
    return plan.pp > 1 and plan.zero_stage >= 2 and plan.dp * plan.cp > 1


class _PipelineFsdp:
    """What torch.distributed.pipelining does to a stage under FSDP2 (ZeRO-2/3 with dp > 1), as the trainer's
    schedules run it: every backward runs with gradient sync off and without resharding after it
    (``backward_maybe_with_nosync``), so each layer accumulates its whole gradient in fp32 and keeps its
    gathered weights until its next forward; after the stage's last backward of the step it reduce-scatters
    and reshards (``perform_reduce_grad``). The multi-stage schedules (``_PipelineScheduleRuntime``) also
    gather whole stages ahead of their compute (``_add_unshard_reshard``'s UNSHARD and RESHARD actions)."""

    def __init__(self, plan: Plan, chunks: dict[int, nn.Module], held: list[int], order: list[Op]) -> None:
        from torch.distributed.fsdp import FSDPModule

        self.chunks = {i: m for i, m in chunks.items() if isinstance(m, FSDPModule)}
        self.before_ops: dict[int, list[tuple[str, int]]] = {}
        self.last: dict[int, int] = {}  # op position -> the stage whose last backward it is
        if not self.chunks:
            return
        for i, (kind, k, _) in enumerate(order):
            if kind in ("B", "W"):
                self.last = {j: s for j, s in self.last.items() if s != held[k]} | {i: held[k]}
        if plan.schedule in ("gpipe", "1f1b"):  # PipelineScheduleSingle: no UNSHARD / RESHARD actions
            return
        from torch.distributed.pipelining.schedules import _Action, _add_unshard_reshard, _ComputationType

        actions = [_Action(held[k], _ComputationType.from_str(kind), mb) for kind, k, mb in order]
        pos, pending = 0, []
        for action in _add_unshard_reshard(actions):
            kind = str(getattr(action.computation_type, "value", action.computation_type))
            if kind in ("UNSHARD", "RESHARD"):
                pending.append((kind, action.stage_index))
                continue
            self.before_ops[pos], pending, pos = pending, [], pos + 1
        self.tail = pending  # the RESHARDs after the last compute action

    def _all(self, stage: int, what: str) -> None:
        from torch.distributed.fsdp import FSDPModule

        for sub in self.chunks[stage].modules():
            if isinstance(sub, FSDPModule):
                getattr(sub, what)()

    def before(self, i: int) -> None:
        for kind, stage in self.before_ops.get(i, []):
            if stage in self.chunks:
                self._all(stage, "unshard" if kind == "UNSHARD" else "reshard")
        for module in self.chunks.values():
            module.set_is_last_backward(False)
            module.set_reshard_after_backward(False)
            module.set_requires_gradient_sync(False)

    def after(self, i: int) -> None:
        stage = self.last.get(i)
        if stage in self.chunks:
            from torch.distributed.pipelining.stage import _PipelineStageBase

            holder = type("Stage", (), {"submod": self.chunks[stage]})()
            _PipelineStageBase.perform_reduce_grad(holder, 1)  # type: ignore[arg-type]
        if i == len(self.before_ops) - 1 and self.before_ops:
            for kind, s in getattr(self, "tail", []):
                if s in self.chunks and kind == "RESHARD":
                    self._all(s, "reshard")


# ---- the fast trace: one rank per stage shape, replayed over every stage --------------------------
TOTAL = "Total"


def _categories(snap_by_device: dict) -> dict[str, int]:
    """A MemTracker snapshot ({device: {reference type: bytes, "Total": bytes}}), summed over devices."""
    out: dict[str, int] = {}
    for dev_snap in snap_by_device.values():
        for k, v in dev_snap.items():
            name = str(getattr(k, "value", k))
            out[name] = out.get(name, 0) + int(v)
    out.setdefault(TOTAL, 0)
    return out


def _plus(a: dict[str, int], b: dict[str, int], sign: int = 1) -> dict[str, int]:
    """a + sign * b by category; categories at zero are left out (the total is always there)."""
    out = {k: a.get(k, 0) + sign * b.get(k, 0) for k in set(a) | set(b)}
    return {k: v for k, v in out.items() if v or k == TOTAL}


class _Recorder:
    """The rank's memory around every op of a traced step: before it, at its own peak, after it;
    the peak before the first op (the step's start) and after the last (autocast's exit, the
    gradient norm, the optimizer step)."""

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker
        self.ops: list[tuple[dict[str, int], dict[str, int], dict[str, int]]] = []
        self.pre: dict[str, int] | None = None
        self.post: dict[str, int] | None = None

    @contextlib.contextmanager
    def op(self) -> Iterator[None]:
        if self.pre is None:
            self.pre = _categories(self.tracker.get_tracker_snapshot("peak"))
        before = self.tracker.current()
        self.tracker.window = dict(before)
        yield
        after = self.tracker.current()
        self.ops.append((before, self.tracker.window, after))
        self.tracker.window = dict(after)  # stays open to the step's end: the post phase

    def close(self) -> None:
        self.post, self.tracker.window = self.tracker.window, None

    @property
    def usable(self) -> bool:
        return bool(self.ops) and self.post is not None and self.tracker.windowed


class ReplayError(ValueError):
    """A traced order's ops do not behave alike where ``op_types`` says they should."""


@dataclass(frozen=True)
class _Profile:
    """Per op type, its memory change (after - before) and its rise to its own peak (peak - before);
    the step's start, pre-phase peak, end state and post-phase peak."""

    start: dict[str, int]
    pre: dict[str, int]
    end: dict[str, int]
    post: dict[str, int]
    effect: dict[tuple, tuple[dict[str, int], dict[str, int]]]

    @classmethod
    def of(cls, recorder: _Recorder, types: list[tuple]) -> "_Profile":
        if not recorder.usable or len(recorder.ops) != len(types):
            raise ReplayError("the trace recorded no per-op memory")
        effect: dict[tuple, tuple[dict[str, int], dict[str, int]]] = {}
        for t, (before, peak, after) in zip(types, recorder.ops):
            e = (_plus(after, before, -1), _plus(peak, before, -1))
            if effect.setdefault(t, e) != e:
                raise ReplayError(f"two ops of type {t} changed memory differently")
        assert recorder.pre is not None and recorder.post is not None
        return cls(
            start=recorder.ops[0][0], pre=recorder.pre, end=recorder.ops[-1][2], post=recorder.post, effect=effect
        )


def _replay(profile: _Profile, types: list[tuple]) -> dict[str, int]:
    """The peak (by category) of a step running ops of ``types`` in that order: the memory walks
    from the step's start by each op's change, each op peaks at its own rise above where it starts;
    the first time the largest total is reached is the peak, as MemTracker keeps it."""
    state, best = profile.start, profile.pre
    for t in types:
        if t not in profile.effect:
            raise ReplayError(f"op type {t} was not traced")
        change, rise = profile.effect[t]
        here = _plus(state, rise)
        if here[TOTAL] > best[TOTAL]:
            best = here
        state = _plus(state, change)
    # What the ops leave behind beyond the traced order's (the MoE layers' per-backward records of
    # their balancing loss and loads, kept to the step's end) is still held after the last op: the post
    # phase (autocast's exit, the gradient norm, the optimizer step) peaks that much higher.
    post = _plus(profile.post, _plus(state, profile.end, -1))
    if post[TOTAL] > best[TOTAL]:
        best = post
    return best


def stage_shape(plan: Plan, pp_rank: int) -> tuple:
    """What the rank's modules are: per held stage, whether it holds the embedding and the head, and
    each layer's kind (a MoE MLP or a dense one, windowed attention or not). Ranks of one shape build
    the same modules on the same mesh coordinates (dp, cp, tp 0), so their ops behave alike."""
    spec = plan.model
    counts = plan.layers_per_stage()
    starts = [0, *itertools.accumulate(counts)]
    last = plan.virtual_stages - 1
    return tuple(
        (
            v == 0,
            v == last,
            tuple((spec.layer_is_moe(i), spec.layer_is_windowed(i)) for i in range(starts[v], starts[v + 1])),
        )
        for v in plan.stages_of_rank(pp_rank)
    )


@dataclass(frozen=True)
class ShapeProbe:
    """One traced rank standing for every stage of its shape (``members``): ``order`` is the short op
    order traced, holding every op type (``op_types``) that the members' full orders hold."""

    rank: int
    members: tuple[int, ...]
    order: tuple[Op, ...]

    @property
    def microbatches(self) -> int:
        """Micro-batches the order runs through its fullest chunk."""
        return max(
            sum(1 for kind, c, _ in self.order if kind in ("F", "FB") and c == k) for k in {c for _, c, _ in self.order}
        )


def shape_probes(plan: Plan, full: list[list[Op]] | None = None) -> list[ShapeProbe]:
    """The distinct stage shapes of the plan (``stage_shape``), each with a short order to trace: per
    chunk, a walk through the op types its stages' full orders hold (``covering_order``), or, where
    none is found, the fewest micro-batches of the schedule whose order on some position holds them.
    ``full``: the plan's ``schedule_orders``, where already at hand."""
    from exatrain.trainer.parallel.build import execution_plan

    plan = execution_plan(plan)
    if full is None:
        full = schedule_orders(plan, plan.num_microbatches)
    groups: dict[tuple, list[int]] = {}
    for r in range(plan.pp):
        groups.setdefault(stage_shape(plan, r), []).append(r)
    probes = []
    for members in groups.values():
        need = set().union(*(op_types(full[r], fsdp_under_pipeline(plan)) for r in members))
        order = covering_order(need) or _schedule_probe(plan, members, need)
        if order is None:  # each stage its own full order
            probes += [ShapeProbe(rank=r, members=(r,), order=tuple(full[r])) for r in members]
        else:
            probes.append(ShapeProbe(rank=members[0], members=tuple(members), order=tuple(order)))
    return probes


def covering_order(need: set[tuple], cap: int = 3) -> list[Op] | None:
    """A shortest op order, chunk after chunk, in which every type of ``need`` occurs and no other:
    per chunk a breadth-first search over (previous kind, has gradients, forwards awaiting their
    backward, input-gradient passes awaiting their weight pass, the types run so far) for a walk that
    runs every type of the chunk and ends drained (every forward's backward run), holding at most
    ``cap`` micro-batches at once. None where no such walk exists."""
    order: list[Op] = []
    for k in sorted({t[1] for t in need}):
        mine = sorted((t for t in need if t[1] == k), key=str)
        bit = {t: 1 << i for i, t in enumerate(mine)}
        goal = (1 << len(mine)) - 1
        start = (None, False, 0, 0, 0)
        parent: dict[tuple, tuple[tuple, str] | None] = {start: None}
        frontier, end = [start], None
        while frontier and end is None:
            nxt = []
            for node in frontier:
                prev, graded, saved, pending, done = node
                for t in mine:
                    kind = t[0]
                    if t[2] != prev or t[3] != graded:
                        continue
                    s_, w_ = saved + (kind == "F") - (kind in ("B", "I")), pending + (kind == "I") - (kind == "W")
                    if not (0 <= s_ <= cap and 0 <= w_ <= cap):
                        continue
                    after = (kind, graded or kind in ("B", "W", "FB"), s_, w_, done | bit[t])
                    if len(t) > 4 and t[4] and not (after[4] == goal and not s_ and not w_):
                        continue  # a chunk's last op ends its walk
                    if after in parent:
                        continue
                    parent[after] = (node, kind)
                    if after[4] == goal and not s_ and not w_:
                        end = after
                        break
                    nxt.append(after)
                if end is not None:
                    break
            frontier = nxt
        if end is None:
            return None
        kinds: list[str] = []
        node = end
        while parent[node] is not None:
            node, kind = parent[node]  # type: ignore[misc]
            kinds.append(kind)
        order += _numbered(k, kinds[::-1])
    return order


def _numbered(k: int, kinds: list[str]) -> list[Op]:
    """Micro-batch numbers for a chunk's kinds: each forward a new one; backward and input-gradient
    passes take the oldest forward waiting, weight passes the oldest input-gradient pass waiting."""
    saved: list[int] = []
    pending: list[int] = []
    out, fresh = [], 0
    for kind in kinds:
        if kind in ("F", "FB"):
            mb, fresh = fresh, fresh + 1
            if kind == "F":
                saved.append(mb)
        elif kind in ("B", "I"):
            mb = saved.pop(0)
            if kind == "I":
                pending.append(mb)
        else:
            mb = pending.pop(0)
        out.append((kind, k, mb))
    return out


def _schedule_probe(plan: Plan, members: list[int], need: set[tuple]) -> list[Op] | None:
    """The order of the fewest micro-batches of the plan's schedule, on some pipeline position, that
    holds every type of ``need``; None if no order of fewer micro-batches than the step's does."""
    for n in range(1, plan.num_microbatches):
        try:
            got = schedule_orders(plan, n)
        except ValueError:  # torch refuses this many micro-batches for the schedule
            continue
        for r in [*members, *(q for q in range(plan.pp) if q not in members)]:
            if need <= set(op_types(got[r], fsdp_under_pipeline(plan))):
                return got[r]
    return None
