"""Predicted vs measured step time of the single-H200 training runs of the 2026-11-30 anchor.

    python benchmarks/anchor_train_error.py [--json OUT]

Rows: ``benchmarks/data/h200_anchor_train.jsonl``, the ``train`` records of the project's one H200 session
(torch 2.11, cu130; copied from the shared reference file). Each is one GPU, one micro-batch per step, no
parallelism, bf16 autocast, fused AdamW: GPT-2 style models (LayerNorm, GELU MLP of 4h, learned positions,
SDPA attention, no dropout), run as a plain PyTorch loop (``nanogpt_eager``), the same loop under
``torch.compile`` (``nanogpt_compile*``), and Hugging Face's GPT-2 with SDPA (``hf_gpt2_sdpa``).

Each run is planned as exatrain's own trainer runs it (``runtime`` exatrain, its default overlaps) on
``dgx-h200`` with the shipped H200 prior, through ``api.estimate``. Nothing is fitted to these runs: the
H200 prior's GEMM and attention rates come from the same session's GEMM and SDPA micro-benchmarks, not from
its training steps. The planner has no eager / compiled setting, so one prediction stands for both loops
(the compiled one fuses element-wise kernels the eager one runs apart); the Hugging Face row shows what a
slower implementation of the same model costs, which no profile describes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from exatrain import api
from exatrain.catalog.models import ModelSpec
from exatrain.errors import UserError

DATA = Path(__file__).resolve().parent / "data" / "h200_anchor_train.jsonl"


def load(path: Path = DATA) -> list[dict]:
    """The ``train`` records of the anchor file (one JSON object per line)."""
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{n}: not JSON ({exc.msg})") from None
        if rec.get("kind") == "train":
            rows.append(rec)
    return rows


def predict(rec: dict) -> float:
    """Predicted seconds per step of one anchor run (module doc)."""
    model = ModelSpec(
        name=rec["label"],
        arch="gpt",
        layers=int(rec["L"]),
        hidden=int(rec["h"]),
        heads=int(rec["heads"]),
        kv_heads=int(rec["heads"]),
        ffn_hidden=4 * int(rec["h"]),
        seq_len=int(rec["s"]),
        vocab=int(rec["V"]),
    )
    b = int(rec["B"])
    plan = api.estimate(
        model=model,
        cluster="dgx-h200",
        gpus=1,
        micro_batch=b,
        global_batch=b,
        zero=0,
        recompute="none",
        dtype="bfloat16",
        flash_attention=True,
        runtime="exatrain",
    )
    return plan.estimate.time_s.step


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write every row as JSON here")
    args = ap.parse_args(argv)
    try:
        rows = load()
        out = []
        print(f"{'run':<24} {'L':>3} {'h':>5} {'B':>3} {'measured s':>11} {'predicted s':>12} {'error':>7}")
        for rec in rows:
            pred = predict(rec)
            err = pred / rec["sec_per_step"] - 1
            out.append(
                {
                    "label": rec["label"],
                    "layers": rec["L"],
                    "hidden": rec["h"],
                    "batch": rec["B"],
                    "measured_s": rec["sec_per_step"],
                    "predicted_s": pred,
                    "error": err,
                }
            )
            print(
                f"{rec['label']:<24} {rec['L']:>3} {rec['h']:>5} {rec['B']:>3} {rec['sec_per_step']:>11.4f} "
                f"{pred:>12.4f} {100 * err:>+6.1f}%"
            )
        loops = [abs(r["error"]) for r in out if r["label"].startswith("nanogpt")]
        print(
            f"plain PyTorch loop (eager and compiled), n={len(loops)}: median |error| "
            f"{100 * statistics.median(loops):.1f}%, max {100 * max(loops):.1f}%"
        )
        if args.json:
            args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    except UserError as exc:
        print(f"anchor_train_error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
