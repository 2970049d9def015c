"""Exact parameter counts, for the whole model and for one rank of each pipeline stage.

The counts follow the two architectures of ``exatrain.catalog.models`` tensor by tensor, so they
equal ``sum(p.numel())`` of the trainer's model. For the GPT family with ffn_hidden = 4h they reduce
to Narayanan et al. 2021 Eq. 2: 12*L*h^2*(1 + 13/(12h)) + (V + s)*h (plus the final LayerNorm's 2h).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from exatrain.catalog.models import ModelSpec
from exatrain.plan import Plan


@dataclass(frozen=True)
class LayerParams:
    """One transformer layer's parameters, split by how tensor parallelism treats them."""

    sharded: int  # column/row-parallel weights and column-parallel biases: divided by tp
    replicated: int  # norms and row-parallel output biases: every tp rank holds them whole

    def per_rank(self, tp: int) -> int:
        return self.sharded // tp + self.replicated


def layer_params(m: ModelSpec) -> LayerParams:
    """Parameters of one transformer layer (Megatron-style TP sharding, Shoeybi et al. 2019 Sec. 3)."""
    h, f, kvh = m.hidden, m.ffn_hidden, m.kv_hidden
    attn_w = h * (h + 2 * kvh) + h * h  # fused QKV (column-parallel) + output projection (row-parallel)
    mlp_w = (3 if m.gated_mlp else 2) * h * f  # SwiGLU: gate, up, down; GELU MLP: fc1, fc2
    if m.has_bias:
        sharded_bias = (h + 2 * kvh) + f  # QKV and fc1 biases are split with their columns
        replicated_bias = h + h  # proj and fc2 biases are added after the all-reduce
        norms = 2 * (2 * h)  # two LayerNorms, weight + bias
    else:
        sharded_bias = replicated_bias = 0
        norms = 2 * h  # two RMSNorms, weight only
    return LayerParams(sharded=attn_w + mlp_w + sharded_bias, replicated=replicated_bias + norms)


def embedding_params(m: ModelSpec) -> int:
    """Token embedding (vocab-parallel over tp) — without the position table."""
    return m.vocab * m.hidden


def position_params(m: ModelSpec) -> int:
    """Learned position table (GPT); rotary embeddings have none."""
    return m.seq_len * m.hidden if m.learned_positions else 0


def final_norm_params(m: ModelSpec) -> int:
    return 2 * m.hidden if m.has_bias else m.hidden


def head_params(m: ModelSpec) -> int:
    """Separate output head; zero when tied to the token embedding."""
    return 0 if m.tied_embeddings else m.vocab * m.hidden


def total_params(m: ModelSpec) -> int:
    """Unique parameters of the whole model (a tied head counted once)."""
    lp = layer_params(m)
    return (m.layers * (lp.sharded + lp.replicated) + embedding_params(m) + position_params(m)
            + final_norm_params(m) + head_params(m))


def stage_params(plan: Plan) -> tuple[int, ...]:
    """Parameters held by one rank of each pipeline stage (pp entries), after TP sharding.

    Rank 0 of the pipeline holds the embeddings; the last holds the final norm and the head. With
    a tied head and pp > 1 the last stage keeps its own copy of the word embedding (kept equal by
    an all-reduce of its gradient, as Megatron-LM does), so it is counted on both ends.
    """
    return _stage_params(plan.model, plan.tp, plan.pp, plan.interleave, plan.layers_per_stage())


@lru_cache(maxsize=4096)
def _stage_params(m: ModelSpec, tp: int, pp: int, interleave: int, layers: tuple[int, ...]) -> tuple[int, ...]:
    ranks = np.arange(pp)
    on_rank = [sum(layers[v] for v in range(rank, pp * interleave, pp)) for rank in range(pp)]
    return tuple(int(x) for x in rank_params(m, tp, pp, np.array(on_rank), ranks))


def rank_params(m: ModelSpec, tp, pp, layers_on_rank, pp_rank):
    """``stage_params`` on numpy arrays (one entry per candidate and rank): the parameters one rank
    of pipeline rank ``pp_rank`` holds when it runs ``layers_on_rank`` transformer layers."""
    tp = np.asarray(tp, dtype=np.int64)
    pp = np.asarray(pp, dtype=np.int64)
    pp_rank = np.asarray(pp_rank, dtype=np.int64)
    lp = layer_params(m)
    n = np.asarray(layers_on_rank, dtype=np.int64) * (lp.sharded // tp + lp.replicated)
    n = n + np.where(pp_rank == 0, embedding_params(m) // tp + position_params(m), 0)
    if m.tied_embeddings:  # the last stage's own copy of the word embedding (pp > 1)
        head = np.where(pp > 1, embedding_params(m) // tp, 0)
    else:
        head = head_params(m) // tp
    return n + np.where(pp_rank == pp - 1, final_norm_params(m) + head, 0)
