"""One GPU, under 8 minutes: bench -> calibration -> single-GPU training runs -> predicted vs measured.

    python benchmarks/gpu_suite.py [--out DIR] [--steps 8] [--budget-s 450] [--dry-run]

1. ``exatrain bench --device cuda --out DIR/calib.json`` (GEMM/attention/bandwidth of this GPU; no
   collectives with one GPU);
2. for each plan below (gpt-1.3b, gpt-2.7b, a 1B Llama, gpt-1.3b with full recompute): the planner's
   estimate with that calibration (``exatrain estimate --calibration ... --trace --out``: the step
   time, the planner's reference memory, the traced memory of the trainer's own model), then
   ``exatrain train --plan ... --device cuda --steps N --metrics-file DIR/runs.jsonl``;
3. predicted vs measured step time and peak memory (``torch.cuda.max_memory_allocated``, which the
   trainer records) per run, the trainer memory model's prediction beside them; all written to
   DIR/gpu_suite.json (DIR: --out, else $OUT, else ./gpu_suite_out);
4. with the time left (at least 30 s), ``benchmarks/expert_gemm_speed.py`` with the same calibration: routed
   experts' GEMMs at 16 to 4,096 rows per expert, per-expert launches and one grouped call, beside the cost
   model's price (DIR/expert_gemm_speed.json; a few seconds).

Import-safe: nothing here imports torch until main() runs on the GPU machine (tests build the plans
and the command lines on a CPU with --dry-run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SuiteRun:
    name: str
    model: tuple[str, ...]  # model flags
    layout: tuple[str, ...]  # layout flags (one GPU: tp = pp = dp = 1)


RUNS = (
    SuiteRun("gpt-1.3b b8", ("--model", "gpt-1.3b"), ("--micro-batch", "4", "--global-batch", "8")),
    SuiteRun("gpt-2.7b b4", ("--model", "gpt-2.7b"), ("--micro-batch", "2", "--global-batch", "4")),
    SuiteRun(
        "llama-1b b8",
        (
            "--arch",
            "llama",
            "--layers",
            "16",
            "--hidden",
            "2048",
            "--heads",
            "16",
            "--kv-heads",
            "4",
            "--ffn-hidden",
            "5632",
            "--seq-len",
            "2048",
            "--vocab",
            "32000",
        ),
        ("--micro-batch", "4", "--global-batch", "8"),
    ),
    SuiteRun(
        "gpt-1.3b b16 full recompute",
        ("--model", "gpt-1.3b"),
        ("--micro-batch", "16", "--global-batch", "16", "--recompute", "full"),
    ),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="results folder (default $OUT, else ./gpu_suite_out)")
    ap.add_argument("--steps", type=int, default=8, help="training steps per run (first 2 not measured)")
    ap.add_argument("--budget-s", type=float, default=450.0, help="stop starting runs after this many seconds")
    ap.add_argument("--cluster", default="dgx-h200", help="catalog cluster of this GPU (default dgx-h200)")
    ap.add_argument("--no-bench", action="store_true", help="use the catalog's priors instead of a bench")
    ap.add_argument("--dry-run", action="store_true", help="print the commands; run nothing (no GPU needed)")
    args = ap.parse_args(argv)
    if args.steps < 3:
        ap.error("--steps must be at least 3 (two warm-up steps are not measured)")
    return args


def out_dir(args: argparse.Namespace) -> Path:
    return Path(args.out or os.environ.get("OUT") or "gpu_suite_out")


def plans(cluster: str = "dgx-h200"):
    """The suite's plans, resolved and validated by the API from the same flags the commands pass
    (no torch)."""
    from exatrain.api import make_plan, resolve_model

    out = []
    for run in RUNS:
        kw = _flags(run.model + run.layout)
        model = resolve_model(kw.pop("model", None), **{k: kw.pop(k) for k in list(kw) if k in _MODEL_KEYS})
        out.append((run, make_plan(model, cluster, gpus=1, **kw)))
    return out


_MODEL_KEYS = ("arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "seq_len", "vocab")


def _flags(words: tuple[str, ...]) -> dict:
    """('--micro-batch', '4', ...) -> {'micro_batch': 4, ...}: the API's keyword names are the flags'."""
    kw = {}
    for flag, value in zip(words[::2], words[1::2]):
        kw[flag[2:].replace("-", "_")] = int(value) if value.isdigit() else value
    return kw


def commands(args: argparse.Namespace) -> list[list[str]]:
    d = out_dir(args)
    exe = [sys.executable, "-m", "exatrain"]
    cal = [] if args.no_bench else ["--calibration", str(d / "calib.json")]
    cmds = [] if args.no_bench else [[*exe, "bench", "--device", "cuda", "--out", str(d / "calib.json")]]
    for i, run in enumerate(RUNS, 1):
        plan = str(d / f"plan{i}.json")
        cmds.append(
            [
                *exe,
                "estimate",
                *run.model,
                *run.layout,
                "--cluster",
                args.cluster,
                "--gpus",
                "1",
                *cal,
                "--trace",
                "--json",
                "--out",
                plan,
            ]
        )
        cmds.append(
            [
                *exe,
                "train",
                "--plan",
                plan,
                "--device",
                "cuda",
                "--steps",
                str(args.steps),
                "--metrics-file",
                str(d / "runs.jsonl"),
                "--quiet",
            ]
        )
    return cmds


def expert_gemm_command(args: argparse.Namespace) -> list[str]:
    """Step 4: the routed experts' GEMMs beside their price (benchmarks/expert_gemm_speed.py), in DIR."""
    d = out_dir(args)
    cal = [] if args.no_bench else ["--calibration", str(d / "calib.json")]
    return [
        sys.executable,
        str(Path(__file__).with_name("expert_gemm_speed.py")),
        "--out",
        str(d),
        "--cluster",
        args.cluster,
        *cal,
    ]


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=max(10.0, timeout))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    d = out_dir(args)
    if args.dry_run:
        for cmd in [*commands(args), expert_gemm_command(args)]:
            print(" ".join(cmd))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu_suite: no CUDA device here (use --dry-run to see the commands)", file=sys.stderr)
        return 2
    d.mkdir(parents=True, exist_ok=True)
    (d / "runs.jsonl").unlink(missing_ok=True)
    t_start = time.perf_counter()
    log: list[dict] = []
    results: dict = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cluster": args.cluster,
        "steps": args.steps,
        "runs": [],
        "log": log,
    }
    cmds = commands(args)
    if not args.no_bench:
        bench, cmds = cmds[0], cmds[1:]
        t0 = time.perf_counter()
        out = _run(bench, args.budget_s)
        log.append(
            {"cmd": " ".join(bench), "rc": out.returncode, "s": time.perf_counter() - t0, "stderr": out.stderr[-1500:]}
        )
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            _write(d, results)
            return 1
        results["calibration"] = json.loads((d / "calib.json").read_text())["devices"]
    from exatrain.records import read_run_records
    from exatrain.accounting.trainer_memory import trainer_memory_by_stage

    for i, run in enumerate(RUNS):
        left = args.budget_s - (time.perf_counter() - t_start)
        row: dict = {"run": run.name}
        results["runs"].append(row)
        if left < 30:
            row["skipped"] = f"time budget: {left:.0f} s left"
            continue
        est_cmd, train_cmd = cmds[2 * i], cmds[2 * i + 1]
        t0 = time.perf_counter()
        est = _run(est_cmd, left)
        log.append(
            {
                "cmd": " ".join(est_cmd),
                "rc": est.returncode,
                "s": time.perf_counter() - t0,
                "stderr": est.stderr[-1500:],
            }
        )
        if est.returncode != 0:
            row["error"] = est.stderr.strip().splitlines()[-1:] or ["estimate failed"]
            continue
        e = json.loads(est.stdout)
        row.update(
            predicted_step_s=e["time_s"]["step"],
            predicted_memory_bytes=e["memory_bytes"]["total"],
            traced_memory_bytes=(e.get("traced_memory_bytes") or {}).get("total"),
        )
        before = len(read_run_records(d / "runs.jsonl")) if (d / "runs.jsonl").exists() else 0
        t0 = time.perf_counter()
        tr = _run(train_cmd, args.budget_s - (time.perf_counter() - t_start))
        log.append(
            {
                "cmd": " ".join(train_cmd),
                "rc": tr.returncode,
                "s": time.perf_counter() - t0,
                "stderr": tr.stderr[-1500:],
            }
        )
        records = read_run_records(d / "runs.jsonl") if (d / "runs.jsonl").exists() else []
        if tr.returncode != 0 or len(records) <= before:
            row["error"] = (tr.stderr.strip().splitlines() or ["train failed"])[-1]
            continue
        rec = records[-1]
        m = rec.measured
        model_mem = max(s.total for s in trainer_memory_by_stage(rec.plan, on_cpu=False))
        row.update(
            measured_step_s=m.step_time_s,
            measured_memory_bytes=m.peak_memory_bytes,
            trainer_model_memory_bytes=model_mem,
            mfu=m.mfu,
            step_error=row["predicted_step_s"] / m.step_time_s - 1,
            memory_error_trainer_model=model_mem / m.peak_memory_bytes - 1,
            memory_error_planner=row["predicted_memory_bytes"] / m.peak_memory_bytes - 1,
            memory_error_traced=(
                None if not row.get("traced_memory_bytes") else row["traced_memory_bytes"] / m.peak_memory_bytes - 1
            ),
        )
        _write(d, results)
    done = [r for r in results["runs"] if "step_error" in r]
    if done:
        results["median_step_error"] = statistics.median(abs(r["step_error"]) for r in done)
        results["median_memory_error_trainer_model"] = statistics.median(
            abs(r["memory_error_trainer_model"]) for r in done
        )
    left = args.budget_s - (time.perf_counter() - t_start)
    if left >= 30:
        cmd = expert_gemm_command(args)
        t0 = time.perf_counter()
        try:
            eg = _run(cmd, min(left, 120.0))
            log.append(
                {"cmd": " ".join(cmd), "rc": eg.returncode, "s": time.perf_counter() - t0, "stderr": eg.stderr[-1500:]}
            )
            results["expert_gemms"] = eg.stdout[-6000:]
        except subprocess.TimeoutExpired:
            log.append({"cmd": " ".join(cmd), "rc": None, "s": time.perf_counter() - t0, "stderr": "timed out"})
    else:
        results["expert_gemms"] = f"skipped: time budget, {left:.0f} s left"
    results["seconds"] = time.perf_counter() - t_start
    _write(d, results)
    GiB = 2**30
    for r in results["runs"]:
        if "step_error" in r:
            print(
                f"{r['run']:30s} step {r['predicted_step_s']:.3f} s pred / {r['measured_step_s']:.3f} s meas "
                f"({r['step_error']:+.1%}); memory {r['measured_memory_bytes'] / GiB:.1f} GiB measured, "
                f"trainer model {r['trainer_model_memory_bytes'] / GiB:.1f} "
                f"({r['memory_error_trainer_model']:+.1%}), "
                f"planner {r['predicted_memory_bytes'] / GiB:.1f} GiB"
            )
        else:
            print(f"{r['run']:30s} {r.get('skipped') or r.get('error')}")
    print(results.get("expert_gemms", ""))
    print(f"-> {d / 'gpu_suite.json'} ({results['seconds']:.0f} s)")
    return 0


def _write(d: Path, results: dict) -> None:
    (d / "gpu_suite.json").write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    sys.exit(main())
