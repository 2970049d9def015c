"""The largest count a user may give: ranks, degrees, batch sizes, model dimensions, steps.

Counts enter numpy's int64 arrays (the rules and the search) and products of them; a value beyond
int64 would be an OverflowError deep in the planner, and one just under it would wrap silently. So
every count is checked where it enters, by the CLI's parsers and by the API's calls (``check_counts``),
against one bound far above any machine or model: 10^9 (a billion ranks, a billion-token sequence).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from exatrain.errors import UserError

MAX_COUNT = 10**9

# The API's keyword arguments that are counts (a sequence of counts for scaling's gpus and stage_layers).
COUNT_ARGS = (
    "gpus",
    "tp",
    "pp",
    "dp",
    "micro_batch",
    "global_batch",
    "interleave",
    "stage_layers",
    "ep",
    "cp",
    "recompute_layers",
    "recompute_every",
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "ffn_hidden",
    "seq_len",
    "vocab",
    "steps",
    "warmup",
    "save_every",
    "keep_last",
    "seed",
    "trials",
    "candidates",
    "seed_trials",
    "top",
    "nodes",
    "shard_tokens",
    "train_tokenizer",
    "step",
)


def flag_of(name: str) -> str:
    """micro_batch -> --micro-batch."""
    return "--" + name.replace("_", "-")


def beyond(value: Any) -> bool:
    """An integer (not a bool) above MAX_COUNT."""
    return isinstance(value, int) and not isinstance(value, bool) and value > MAX_COUNT


def too_large(flag: str, value: Any) -> UserError:
    return UserError(f"{flag} must be a positive integer of at most {MAX_COUNT:,}, got {value}")


def check_counts(values: Mapping[str, Any]) -> None:
    """A one-line UserError for the first count among ``values`` (a call's keyword arguments, by the
    names of COUNT_ARGS) beyond MAX_COUNT; other problems of a count (zero, a negative, a string) are
    the checks' downstream, which name them."""
    for name in COUNT_ARGS:
        value = values.get(name)
        items = value if isinstance(value, (list, tuple)) else (value,)
        for item in items:
            if beyond(item):
                raise too_large(flag_of(name), item)


def check_finite(flag: str, value: Any) -> float:
    """``value`` as a finite float, else a one-line UserError: a NaN or an infinity is never a setting
    (a NaN also passes every range check written as a comparison that fails, e.g. ``x < 0``)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    if isinstance(value, bool) or not math.isfinite(x):
        raise UserError(f"{flag} must be a finite number, got {value!r}")
    return x


__all__ = ["COUNT_ARGS", "MAX_COUNT", "beyond", "check_counts", "check_finite", "flag_of", "too_large"]
