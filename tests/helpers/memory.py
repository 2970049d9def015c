"""``accounting.memory.rank_memory`` with its run (``Resolved``) and its rank's counts (``RankCounts``) spelled
as plain keywords, as the tests that count one rank by hand write them."""

from __future__ import annotations

from exatrain.accounting import memory
from exatrain.accounting.engines import Resolved
from exatrain.accounting.memory import RankCounts

_RUN = ("dtype", "flash", "engine", "cross_entropy", "cp_comm", "recompute_modules", "distribute_saved_activations")
_RANK = (
    "params_here",
    "layers_here",
    "inflight_mb",
    "is_last",
    "is_first",
    "expert_params_here",
    "moe_layers_here",
    "pp_grad_share",
    "recomputed_here",
)


def rank_memory(m, *, fp8=None, capacity_factor=1.0, **kw):
    """The five byte counts of one rank (``accounting.memory.rank_memory``): ``fp8`` an Fp8Recipe,
    ``capacity_factor`` the routing load, the rest the run's, the rank's and the layout's keywords."""
    run = Resolved(fp8_recipe=fp8, moe_load=capacity_factor, **{k: kw.pop(k) for k in _RUN if k in kw})
    rank = RankCounts(**{k: kw.pop(k) for k in _RANK if k in kw})
    return memory.rank_memory(m, run, rank=rank, **kw)
