"""How well does the cost model rank what tune measures? Spearman's rank correlation of the predicted and the
measured step times over a tune study's trials, from `exatrain tune --json` output.

Each trial trains the same global batch, so a step time ranks as the inverse of its tokens/s: the correlation
of step times is that of tokens/s. Trials that finished ("ok") are counted, and apart with the pruned ones too
(stopped after warm-up, their tokens/s measured over the steps they ran). Also printed: where the seed trials
(the cost model's best predicted layouts, run first) landed among the measured.

    exatrain tune --model gpt-tiny --gpus 4 --global-batch 8 --trials 12 --steps 6 --json > tune.json
    python benchmarks/tune_rank_correlation.py tune.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties given their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rho: Pearson's correlation of the ranks (Spearman 1904)."""
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tune_json", type=Path, help="`exatrain tune --json` output")
    args = ap.parse_args()
    trials = json.loads(args.tune_json.read_text())["trials"]
    measured = [t for t in trials if t["measured_tokens_per_s"] and t["predicted_tokens_per_s"]]
    for label, keep in (("finished (ok)", ("ok",)), ("ok + pruned", ("ok", "pruned"))):
        ts = [t for t in measured if t["status"] in keep]
        # step time = tokens per step / tokens/s: the same global batch in every trial
        pred = [1.0 / t["predicted_tokens_per_s"] for t in ts]
        meas = [1.0 / t["measured_tokens_per_s"] for t in ts]
        print(f"{label}: {len(ts)} trials, Spearman rho of predicted vs measured step time {spearman(pred, meas):+.2f}")
    ok = sorted((t for t in measured if t["status"] == "ok"), key=lambda t: -t["measured_tokens_per_s"])
    for t in sorted(measured, key=lambda t: t["number"]):
        if t["source"] == "seed":
            where = f"measured {ok.index(t) + 1} of {len(ok)} finished" if t in ok else f"{t['status']}"
            print(
                f"seed trial {t['number']}: predicted {t['predicted_tokens_per_s']:,.0f} tokens/s, measured "
                f"{t['measured_tokens_per_s']:,.0f} ({where})"
            )


if __name__ == "__main__":
    main()
