"""Per-stage seconds of a micro-batch (``stage_times``), composed of named terms over numpy arrays of layouts
that share pp, the layer split, ep and cp: ``compute_term`` (the layers' forward, backward and weight-gradient
passes with recomputation, the framework's per-layer and per-op overheads, the embedding and the head),
``tp_term`` (the exposed TP collectives and what the runtime's overlap hid), ``ep_term`` (the expert
all-to-alls), ``cp_term`` (the context-parallel exchange) and ``p2p_s`` (one boundary transfer between pipeline
ranks). Their common inputs are read once (``StageInputs``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exatrain.accounting import comms
from exatrain.accounting.engines import Resolved
from exatrain.accounting.memory import COMPUTE_BYTES
from exatrain.catalog.hardware import ClusterSpec
from exatrain.catalog.models import ModelSpec
from exatrain.planner.cost import compute, network
from exatrain.planner.cost.coefficients import CostParams
from exatrain.planner.cost.context import cp_exposed_s
from exatrain.planner.cost.fp8 import fp8_speedup
from exatrain.planner.cost.layer import layer_times
from exatrain.planner.cost.moe import a2a_time_s, stage_kinds
from exatrain.planner.cost.overlap import OverlapRules, exposed
from exatrain.planner.cost.recompute import module_rerun_s
from exatrain.planner.cost.rerun import rerun_share
from exatrain.planner.cost.terms import CommTerm, PassSeconds
from exatrain.planner.cost.tp import tp_collectives_s, tp_overlap_exposed
from exatrain.planner.layouts import Layouts
from exatrain.settings import RECOMPUTE

_FULL, _SELECTIVE = RECOMPUTE.index("full"), RECOMPUTE.index("selective")


@dataclass(frozen=True, eq=False)
class StageTimes:
    """Per layout and virtual stage, per micro-batch (seconds, arrays (N, S)): compute and TP
    communication apart; ``p2p`` (N,) is one boundary transfer between ranks."""

    fwd: np.ndarray
    bwd: np.ndarray  # input-gradient pass incl. recomputation (whole backward minus ``wgrad``)
    wgrad: np.ndarray  # weight-gradient GEMMs (a separate op only under the split-backward schedules)
    tp_fwd: np.ndarray
    tp_bwd: np.ndarray
    p2p: np.ndarray
    tp_hidden: np.ndarray | None = None  # (N, S) TP seconds per micro-batch the runtime's overlap hides
    # exposed expert all-to-all and context-parallel ring (cost.moe, cost.context), (N, S); 0 without ep / cp
    ext_fwd: np.ndarray | float = 0.0
    ext_bwd: np.ndarray | float = 0.0
    ep_share: np.ndarray | float = 0.0  # the all-to-all's part of ext_fwd + ext_bwd

    @property
    def forward_s(self) -> np.ndarray:
        return self.fwd + self.tp_fwd + self.ext_fwd

    @property
    def backward_s(self) -> np.ndarray:
        return self.bwd + self.tp_bwd + self.ext_bwd


@dataclass(frozen=True, eq=False)
class StageInputs:
    """What every stage term reads, once: the layouts' degrees as (N, 1) columns, the stages' layer kinds and
    counts as (1, S) rows, the TP collectives' seconds on one rank's activations (``ag``, ``rs``, ``ar``;
    ``ag_f``: the forward's all-gather, FP8 where the runtime sends it so) and the share of each stage's layers a
    full recomputation reruns (``full``: that share where the layout recomputes fully, else 0)."""

    model: ModelSpec
    cluster: ClusterSpec
    coeffs: CostParams
    dev: compute.Device
    run: Resolved
    rules: OverlapRules | None
    pp: int
    ep: int
    cp: int
    tp: np.ndarray
    dp: np.ndarray
    b: np.ndarray
    bl: np.ndarray
    sp: np.ndarray
    rec: np.ndarray
    zero: np.ndarray
    n_dense: np.ndarray
    n_moe: np.ndarray
    L: np.ndarray
    speedup: float
    cp_calls: object
    ag: np.ndarray
    rs: np.ndarray
    ar: np.ndarray
    ag_f: np.ndarray
    share: np.ndarray | float
    full: np.ndarray

    @property
    def per_op(self) -> bool:
        """torchtitan's per-op selective recomputation (a dense model's): see ``recomputed``."""
        return self.run.selective == "per_op" and not self.model.is_moe


def stage_inputs(model, cluster, coeffs, dev, lay: Layouts, run: Resolved, stage_layers, rules) -> StageInputs:
    """``StageInputs`` of the layouts ``lay`` (sharing pp, ep, cp) over the layer split ``stage_layers``."""
    pp, ep, cp = int(lay.pp[0]), int(lay.ep[0]), int(lay.cp[0])
    dtype = run.dtype
    tp, dp, b = (np.asarray(x)[:, None] for x in (lay.tp, lay.dp, lay.micro_batch))
    rec = np.asarray(lay.recompute)[:, None]
    n_dense, n_moe = (x[None, :] for x in stage_kinds(model, stage_layers))
    bl = b / cp if cp > 1 else b  # a rank's share of each sequence, as micro-batch: s/cp tokens
    message = bl * model.seq_len * model.hidden * COMPUTE_BYTES[dtype]
    ag, rs, ar = tp_collectives_s(cluster, coeffs, tp, message, ("all_gather", "reduce_scatter", "all_reduce"))
    ag_f = (
        tp_collectives_s(cluster, coeffs, tp, message / COMPUTE_BYTES[dtype], ("all_gather",))[0]
        if run.fp8 and run.fp8_tp_gather
        else ag
    )
    share = rerun_share(stage_layers, pp, lay.recompute_layers, run.recompute_every)
    return StageInputs(
        model=model,
        cluster=cluster,
        coeffs=coeffs,
        dev=dev,
        run=run,
        rules=rules,
        pp=pp,
        ep=ep,
        cp=cp,
        tp=tp,
        dp=dp,
        b=b,
        bl=bl,
        sp=np.asarray(lay.sequence_parallel, dtype=bool)[:, None],
        rec=rec,
        zero=np.asarray(lay.zero_stage)[:, None],
        n_dense=n_dense,
        n_moe=n_moe,
        L=np.asarray(stage_layers, dtype=float)[None, :],
        speedup=fp8_speedup(cluster, dtype, coeffs) if run.fp8 else 1.0,
        cp_calls=None if run.cp_exchange is None else run.cp_exchange.kernel_calls(cp),
        ag=ag,
        rs=rs,
        ar=ar,
        ag_f=ag_f,
        share=share,
        full=np.where(rec == _FULL, share, 0.0),
    )


@dataclass(frozen=True, eq=False)
class StageWork:
    """A stage's layer sums per micro-batch ((N, S) seconds, ``layer_work``): forward, backward, attention core,
    forward weight GEMMs, the MoE layers' forward + backward, the GEMMs a per-op recomputation reruns, the TP
    seconds forward and backward a decomposing overlap leaves exposed, the modules a selective recomputation
    reruns; and the embedding's and the head's forward and backward."""

    fwd: np.ndarray
    bwd: np.ndarray
    attn: np.ndarray
    dense: np.ndarray
    moe_fb: np.ndarray
    per_op: np.ndarray
    tp_left_f: np.ndarray
    tp_left_b: np.ndarray
    modules: np.ndarray
    emb_f: np.ndarray
    emb_b: np.ndarray
    head_f: np.ndarray
    head_b: np.ndarray


def _pick(sequence_parallel, fn):
    """fn(sp) evaluated without and, where some layout uses it, with sequence parallelism."""
    off = fn(False)
    if not np.any(sequence_parallel):
        return off
    on = fn(True)
    return tuple(np.where(sequence_parallel, a, b) for a, b in zip(on, off))


def _one_layer(x: StageInputs, moe: bool, s: bool) -> tuple:
    """One layer's (dense or MoE) seconds per micro-batch, in ``StageWork``'s order (its first nine fields)."""
    m, run = x.model, x.run
    kw = dict(moe=moe, ep=x.ep, cp=x.cp, sequence_parallel=s, dev=x.dev, run=run, speedup=x.speedup)
    lt = layer_times(m, x.b, x.tp, cp_calls=x.cp_calls, **kw)
    left = (
        tp_overlap_exposed(x.ag, x.rs, x.tp, lt.tp_gemms_fwd, mlp=not moe or bool(m.shared_experts), ag_fwd=x.ag_f)
        if x.rules is not None and x.rules.tp and s
        else (0.0, 0.0)
    )
    rerun = (
        module_rerun_s(m, x.b, x.tp, attention_core_fwd=lt.attention_core_fwd, **kw) if run.recompute_modules else 0.0
    )
    moe_fb = (lt.fwd + lt.bwd) if moe else 0.0
    return (lt.fwd, lt.bwd, lt.attention_core_fwd, lt.dense_gemm_fwd, moe_fb, lt.per_op_gemm_fwd, *left, rerun)


def layer_work(x: StageInputs, s: bool) -> tuple:
    """``StageWork``'s fields without (``s`` False) or with sequence parallelism: the stage's layers summed by
    kind, then the embedding's and the head's seconds (``compute.embedding_times``, ``compute.head_times``)."""
    m, run = x.model, x.run
    kinds = ((False, x.n_dense), (True, x.n_moe)) if m.is_moe else ((False, x.n_dense),)
    sums = [0.0] * 9
    for moe, n in kinds:
        sums = [a + n * y for a, y in zip(sums, _one_layer(x, moe, s))]
    return (
        *sums,
        *compute.embedding_times(m, x.bl, x.tp, sequence_parallel=s, dtype=run.dtype, dev=x.dev),
        *compute.head_times(
            m,
            x.bl,
            x.tp,
            sequence_parallel=s,
            dtype=run.dtype,
            dev=x.dev,
            elementwise=run.elementwise,
            cross_entropy=run.cross_entropy,
        ),
    )


def recomputed(rec, fwd, attn, dense, *, per_op: bool = False, per_op_gemms=None):
    """Seconds the backward spends rerunning forward work, from the layers' forward ``fwd``, its
    attention core ``attn`` and dense GEMMs ``dense`` (same shapes): full recomputation reruns the
    whole forward; selective the attention core (Korthikanti et al. 2022, Sec. 5), or, under
    torchtitan's per-op policy (``per_op``: it saves the outputs of the attention kernel, the
    reduce-scatters and every second matmul, counted across calls: torchtitan/distributed/
    activation_checkpoint.py), the matmuls it does not save (``per_op_gemms``: ``compute.per_op_rerun_s``;
    None: half of the dense GEMMs) and all element-wise work (norms, rotary, activation, products,
    residual adds: ``fwd - attn - dense``), and not the attention."""
    if per_op:
        selective = (0.5 * dense if per_op_gemms is None else per_op_gemms) + (fwd - attn - dense)
    else:
        selective = attn
    return np.where(rec == _FULL, fwd, np.where(rec == _SELECTIVE, selective, 0.0))


def rerun_s(x: StageInputs, w: StageWork):
    """Seconds per micro-batch the backward spends rerunning forward work (``recomputed``): a full
    recomputation's in its share of the stage's layers, a selective one by module where the run names modules."""
    again = recomputed(x.rec, w.fwd, w.attn, w.dense, per_op=x.per_op, per_op_gemms=w.per_op)
    again = np.where(x.rec == _FULL, x.share * again, again)
    if x.run.recompute_modules:
        again = np.where(x.rec == _SELECTIVE, w.modules, again)
    return again


def compute_term(x: StageInputs, w: StageWork) -> PassSeconds:
    """The stage's compute per micro-batch: its layers' forward; their backward with what recomputation reruns
    (``rerun_s``) less the weight-gradient GEMMs, which take as long as the forward's dense GEMMs (``wgrad``); the
    framework's per-layer time (``compute.framework_layer_s``, a third in the forward) and per-op pipeline
    overhead; the embedding on the first stage, the head on the last."""
    fw = compute.framework_layer_s(x.dev, x.tp, x.dp, x.zero)
    pp_op = x.dev.params.pp_microbatch_overhead_s / 2 if x.pp > 1 else 0.0  # per F and per B op
    L = x.L
    fwd = w.fwd + L * fw / 3 + pp_op
    wgrad = w.dense + 0.0 * L
    bwd = w.bwd + rerun_s(x, w) + L * 2 * fw / 3 - wgrad + pp_op
    first, last = _ends(L.shape[1])
    fwd = fwd + first * w.emb_f + last * w.head_f
    bwd = bwd + first * w.emb_b + last * w.head_b
    return PassSeconds(fwd=fwd, bwd=bwd, wgrad=wgrad)


def _ends(S: int) -> tuple[np.ndarray, np.ndarray]:
    """(first stage, last stage) masks over S stages."""
    return np.arange(S) == 0, np.arange(S) == S - 1


def tp_layer_collectives(x: StageInputs) -> np.ndarray:
    """(N, S) TP collectives of each stage's layers per pass: 2 in each dense layer; a MoE layer under sequence
    parallelism only the attention's and the shared experts' (``accounting.comms``)."""
    moe_f = (1 + (1 if x.model.shared_experts else 0)) if x.model.is_moe else 2
    return 2 * x.n_dense + np.where(x.sp, moe_f, 2) * x.n_moe


def _module_pairs(x: StageInputs):
    """TP collective pairs inside the modules a selective recomputation reruns, again in the backward."""
    if not x.run.recompute_modules:
        return 0.0
    pairs_dense, pairs_moe = comms.module_rerun_tp_pairs(x.model, x.run.recompute_modules, x.sp)
    return (pairs_dense * x.n_dense + pairs_moe * x.n_moe) * (x.rec == _SELECTIVE)


def tp_term(x: StageInputs, w: StageWork) -> CommTerm:
    """The stage's TP collectives per micro-batch: each layer's forward ones (FP8 all-gathers where sent so),
    the backward's, a full recomputation's rerun forward's in its share of the layers, the per-op recomputation's
    gathers (torchtitan saves the reduce-scatters' outputs but not the all-gathers' nor, without SP, the
    all-reduces': torchtitan/distributed/activation_checkpoint.py _save_list), the rerun modules' pairs; the
    vocab-parallel embedding's all-reduce on the first stage and the head's input-gradient one on the last.
    Where the runtime overlaps TP (``tp_overlapped``) ``hidden`` holds what it hid."""
    tp_one = np.where(x.sp, x.ag + x.rs, x.ar)  # tp_collective_time_s, from the collectives already priced
    tp_one_f = np.where(x.sp, x.ag_f + x.rs, x.ar)  # the forward's (and a rerun forward's)
    n_tp_f = tp_layer_collectives(x)
    tp_f, tp_b = n_tp_f * tp_one_f, n_tp_f * (tp_one + x.full * tp_one_f)
    tp_again = n_tp_f * np.where(x.sp, x.ag_f, x.ar) * (x.per_op * (x.rec == _SELECTIVE))
    pairs = _module_pairs(x)
    tp_b = tp_b + tp_again + pairs * tp_one_f
    first, last = _ends(x.L.shape[1])
    tp_f = tp_f + first * tp_one
    tp_b = tp_b + last * tp_one
    tp_all = tp_f + tp_b
    if x.rules is not None and x.rules.tp:
        tp_f, tp_b = tp_overlapped(x, w, tp_f, tp_b, tp_one, n_tp_f, tp_again, pairs)
    return CommTerm(fwd=tp_f, bwd=tp_b, hidden=tp_all - tp_f - tp_b)


def tp_overlapped(x: StageInputs, w: StageWork, tp_f, tp_b, tp_one, n_tp_f, tp_again, pairs):
    """(forward, backward) TP seconds where the runtime overlaps TP (sequence parallel only, ``cost.overlap``):
    each layer collective decomposed beside the GEMMs next to it (``tp_overlap_exposed``), the recomputed
    forward's again under full recomputation; the embedding's and the head's collectives stay exposed. A runtime
    whose overlap covers the forward only (OverlapRules.tp_backward) leaves the backward's own exposed and hides
    the rerun forward's as the forward's (torchtitan's async TP: the compiled backward graph holds the rerun
    forward, and inductor's micro-pipeline pass runs on it as on the forward graph)."""
    sp, full = x.sp, x.full
    first, last = _ends(x.L.shape[1])
    tp_f = np.where(sp, w.tp_left_f + first * tp_one, tp_f)
    # a rerun module's pairs decomposed as the forward's are: their share of what the forward leaves exposed
    tp_again = tp_again + pairs * w.tp_left_f / np.maximum(n_tp_f, 1)
    if x.rules.tp_backward:
        tp_b = np.where(sp, w.tp_left_b + full * w.tp_left_f + last * tp_one + tp_again, tp_b)
    else:
        tp_b = np.where(sp, n_tp_f * tp_one + full * w.tp_left_f + last * tp_one + tp_again, tp_b)
    return tp_f, tp_b


def ep_term(x: StageInputs, w: StageWork) -> CommTerm:
    """The stage's expert all-to-alls per micro-batch (dispatch + combine, forward and backward, the forward's
    again where a full recomputation or the "moe" module's rerun repeats it; ``cost.moe.a2a_time_s``). Where the
    runtime overlaps them (``cost.overlap`` ``ep_a2a``) another micro-batch's MoE-layer compute hides them; what
    stays exposed is split between forward and backward in proportion."""
    m, run = x.model, x.run

    def one(s):
        kw = dict(dtype=run.dtype, dp=x.dp, dispatcher=run.moe_dispatcher, load=run.moe_load)
        return (a2a_time_s(m, x.cluster, x.coeffs, x.b, x.tp, ep=x.ep, cp=x.cp, sequence_parallel=s, **kw),)

    a2a = 2 * x.n_moe * _pick(x.sp, one)[0] if m.is_moe else 0.0 * x.L
    moe_rerun = x.full + ((x.rec == _SELECTIVE) & ("moe" in run.recompute_modules))
    a2a_f, a2a_b = a2a, a2a * (1 + moe_rerun)
    whole = a2a_f + a2a_b
    if x.rules is not None and x.rules.ep_a2a:
        left = exposed(whole, w.moe_fb) / np.where(whole > 0, whole, 1.0)
        a2a_f, a2a_b = a2a_f * left, a2a_b * left
    return CommTerm(fwd=a2a_f, bwd=a2a_b, hidden=whole - (a2a_f + a2a_b))


def cp_term(x: StageInputs, w: StageWork) -> CommTerm:
    """The stage's context-parallel exchange per micro-batch: what each layer's exchange leaves exposed beside
    its attention core (``cost.context.cp_exposed_s``), forward and backward, the forward's again in a full
    recomputation's share of the layers."""
    L = x.L
    cp_f, cp_b = cp_exposed_s(
        x.model,
        x.cluster,
        x.coeffs,
        x.b,
        x.tp,
        cp=x.cp,
        dtype=x.run.dtype,
        attn_fwd=w.attn / np.maximum(L, 1),
        attn_bwd=2.5 * w.attn / np.maximum(L, 1),
        exchange=x.run.cp_exchange,
    )
    return CommTerm(fwd=L * cp_f, bwd=L * (cp_b + x.full * cp_f))


def p2p_s(x: StageInputs) -> np.ndarray:
    """(N,) seconds of one boundary transfer between pipeline ranks (a send/recv of a rank's activations, split
    over tp under sequence parallelism, over the pipeline tier; 0 without a pipeline)."""
    if x.pp <= 1:
        return np.zeros(len(x.b))
    tp, sp = x.tp[:, 0], x.sp[:, 0]
    msg = x.bl[:, 0] * x.model.seq_len * x.model.hidden * COMPUTE_BYTES[x.run.dtype] / np.where(sp, tp, 1)
    bw, lat = network.tier_arrays(x.cluster, network.pp_span(tp * x.cp, x.dp[:, 0]), x.coeffs)
    return network.collective_time_s("send_recv", 2, msg, bw, lat, x.coeffs)


def stage_times(
    model: ModelSpec,
    cluster: ClusterSpec,
    coeffs: CostParams,
    dev: compute.Device,
    lay: Layouts,
    *,
    run: Resolved,
    stage_layers: np.ndarray,
    rules: OverlapRules | None = None,
) -> StageTimes:
    """Per-stage seconds of the layouts ``lay``, which share pp, the layer split ``stage_layers`` (S,), ep and cp
    (MoE layers, context parallelism and FP8 GEMMs: ``cost.layer``), as ``run`` says their runtime runs them
    (``accounting.engines.Resolved``: its recomputation, MoE dispatch and load, fusion, loss, FP8 gathers, expert
    GEMMs and cp exchange, each read by the term it shapes); ``rules``: the runtime's overlaps (None: exatrain's,
    which hides no TP communication). The sum of ``compute_term``, ``tp_term``, ``ep_term`` and ``cp_term`` per
    stage, with ``p2p_s``. A full recomputation covers the first ``lay.recompute_layers`` layers of each stage
    (Plan.recompute_layers; 0: all), or one in ``run.recompute_every`` of a rank's (``cost.rerun``)."""
    x = stage_inputs(model, cluster, coeffs, dev, lay, run, stage_layers, rules)
    w = StageWork(*_pick(x.sp, lambda s: layer_work(x, s)))
    c, tp, ep, cp = compute_term(x, w), tp_term(x, w), ep_term(x, w), cp_term(x, w)
    shape = (len(x.b), x.L.shape[1])

    def full(a):
        return np.broadcast_to(a, shape) + 0.0

    return StageTimes(
        *(full(a) for a in (c.fwd, c.bwd, c.wgrad, tp.fwd, tp.bwd)),
        p2p=p2p_s(x),
        tp_hidden=full(tp.hidden),
        ext_fwd=full(ep.fwd + cp.fwd),
        ext_bwd=full(ep.bwd + cp.bwd),
        ep_share=full(ep.fwd + ep.bwd),
    )


__all__ = [
    "StageInputs",
    "StageTimes",
    "StageWork",
    "compute_term",
    "cp_term",
    "ep_term",
    "p2p_s",
    "recomputed",
    "stage_inputs",
    "stage_times",
    "tp_term",
]
