"""Single-GPU speed: `exatrain train` against a compiled nanoGPT-style loop on the same shapes.

    python benchmarks/gpu_speed.py [--out DIR] [--steps 12] [--micro-batch 8] [--budget-s 420]
    python benchmarks/gpu_speed.py --smoke          # the plumbing on a CPU: gpt-tiny, float32, eager

On one GPU, bf16 (no run starts after --budget-s; meant to fit 8 minutes, not yet run on a GPU):

1. **baseline** (in a process of its own, so none of its memory is held during the other runs): a plain
   single-file GPT training loop of the kind nanoGPT popularised — learned
   positions, pre-LayerNorm blocks with a fused QKV projection, SDPA causal attention, a GELU MLP, a
   tied head; the whole model under ``torch.compile``, fused AdamW, bf16 autocast, random tokens. It
   has exactly the parameters of exatrain's preset (checked), so both sides do the same FLOPs;
2. ``exatrain train`` on the same model and batch, eager and with ``--compile``;
3. ``exatrain train --compile`` on gpt-2.7b and on the largest catalog GPT that the trainer memory
   model predicts to fit one device (micro-batch 1, full recompute).

One table: tokens/s, MFU by the formula below, peak memory (``max_memory_allocated``) beside the
trainer memory model's prediction, and the ratio of tokens/s to the baseline. JSON to
DIR/gpu_speed.json (DIR: --out, else $OUT, else ./gpu_speed_out).

MFU = 72·B·s·L·h²·(1 + s/(6h) + V/(12hL)) / (step time · peak), B sequences per step (Narayanan et
al. 2021's model FLOPs without recomputation), peak the catalog's dense bf16 figure of the device.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

GiB = 2**30


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="results folder (default $OUT, else ./gpu_speed_out)")
    ap.add_argument("--model", default="gpt-1.3b", help="catalog GPT preset for the side-by-side (default gpt-1.3b)")
    ap.add_argument("--micro-batch", type=int, default=8, help="sequences per step, both sides (default 8)")
    ap.add_argument("--steps", type=int, default=12, help="steps per run; the first 3 are not measured")
    ap.add_argument("--cluster", default="dgx-h200", help="catalog cluster of this GPU (its device's peak)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no run after this many seconds")
    ap.add_argument("--smoke", action="store_true", help="CPU check of the plumbing: gpt-tiny, float32, eager")
    ap.add_argument("--baseline-only", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = ap.parse_args(argv)
    if args.steps < 4:
        ap.error("--steps must be at least 4 (three warm-up steps are not measured)")
    if args.smoke:
        args.model, args.micro_batch, args.steps, args.cluster = "gpt-tiny", 2, 4, "local-cpu"
    return args


def mfu(model, batch: int, step_s: float, peak_flops: float) -> float:
    """The issue-standard model-FLOPs utilisation of one step (see the module docstring)."""
    L, h, s, V = model.layers, model.hidden, model.seq_len, model.vocab
    flops = 72 * batch * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    return flops / (step_s * peak_flops)


def largest_fitting_gpt(cluster_name: str, exclude_tiny: bool = True):
    """The catalog GPT with the most parameters that the trainer memory model says fits one device
    of the cluster at micro-batch 1, bf16, full recompute (None when none does)."""
    from exatrain.catalog import get_cluster, model_presets
    from exatrain.plan import ParallelDims, Plan, TrainShape
    from exatrain.planner.estimate import estimate_plan

    cluster = get_cluster(cluster_name)
    best = None
    for m in sorted(model_presets().values(), key=lambda m: m.layers * m.hidden**2):
        if m.arch != "gpt" or (exclude_tiny and m.hidden < 1024):
            continue
        plan = Plan(
            model=m,
            dims=ParallelDims(1, 1, 1),
            shape=TrainShape(1, 1),
            recompute="full",
            dtype="bfloat16",
            cluster=cluster.name,
        ).validate(cluster)
        if estimate_plan(plan, cluster).trainer_fits:
            best = m
    return best


# ---- the baseline: one file, one device ---------------------------------------------------------
def baseline_model(m):
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(m.hidden), nn.LayerNorm(m.hidden)
            self.qkv, self.proj = nn.Linear(m.hidden, 3 * m.hidden), nn.Linear(m.hidden, m.hidden)
            self.fc, self.out = nn.Linear(m.hidden, m.ffn_hidden), nn.Linear(m.ffn_hidden, m.hidden)

        def forward(self, x):
            b, s, h = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, m.heads, h // m.heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(m.vocab, m.hidden), nn.Embedding(m.seq_len, m.hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(m.layers))
            self.ln = nn.LayerNorm(m.hidden)
            for p in self.parameters():
                if p.ndim >= 2:
                    nn.init.normal_(p, std=0.02)

        def forward(self, idx, targets):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            logits = F.linear(self.ln(x), self.tok.weight)  # tied head
            return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))

    return GPT()


def run_baseline(m, batch: int, steps: int, device: str, compile: bool) -> dict:
    import contextlib

    import torch

    torch.manual_seed(0)
    dev = torch.device(device)
    model = baseline_model(m).to(dev)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=dev.type == "cuda")
    fwd = torch.compile(model) if compile else model
    amp = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if dev.type == "cuda" else contextlib.nullcontext
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        idx = torch.randint(0, m.vocab, (batch, m.seq_len + 1), device=dev)
        sync()
        t0 = time.perf_counter()
        with amp():
            loss = fwd(idx[:, :-1], idx[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() if dev.type == "cuda" else None
    return {"params": params, "step_s": statistics.median(times[3:]), "peak_memory_bytes": peak}


# ---- exatrain's side: the real CLI in a subprocess -----------------------------------------------
def exatrain_cmd(
    model: str,
    batch: int,
    steps: int,
    cluster: str,
    device: str,
    dtype: str,
    compile: bool,
    metrics: Path,
    recompute: str = "none",
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "exatrain",
        "train",
        "--model",
        model,
        "--cluster",
        cluster,
        "--gpus",
        "1",
        "--device",
        device,
        "--dtype",
        dtype,
        "--micro-batch",
        str(batch),
        "--global-batch",
        str(batch),
        "--recompute",
        recompute,
        "--steps",
        str(steps),
        "--metrics-file",
        str(metrics),
        "--quiet",
        *(["--compile"] if compile else []),
    ]


def run_exatrain(cmd: list[str], metrics: Path, timeout: float) -> dict:
    from exatrain.records import read_run_records
    from exatrain.accounting.trainer_memory import trainer_memory_by_stage

    metrics.unlink(missing_ok=True)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=max(10.0, timeout))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if out.returncode != 0 or not metrics.exists():
        return {"error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]}
    rec = read_run_records(metrics)[-1]
    predicted = max(s.total for s in trainer_memory_by_stage(rec.plan, on_cpu=rec.device == "cpu"))
    return {
        "step_s": rec.measured.step_time_s,
        "peak_memory_bytes": rec.measured.peak_memory_bytes,
        "predicted_memory_bytes": predicted,
    }


def baseline_in_child(args: argparse.Namespace, d: Path, timeout: float) -> dict:
    """The baseline in a process of its own, so that none of its memory (weights, the caching
    allocator's blocks, compiled graphs) is held while exatrain's runs use the same device."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--baseline-only",
        "--out",
        str(d),
        "--model",
        args.model,
        "--micro-batch",
        str(args.micro_batch),
        "--steps",
        str(args.steps),
    ] + (["--smoke"] if args.smoke else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=max(10.0, timeout))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    path = d / "baseline.json"
    if out.returncode != 0 or not path.exists():
        return {"error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]}
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from exatrain.catalog import get_cluster, get_model

    d = Path(args.out or os.environ.get("OUT") or "gpu_speed_out")
    d.mkdir(parents=True, exist_ok=True)
    device, dtype = ("cpu", "float32") if args.smoke else ("cuda", "bfloat16")
    if args.baseline_only:
        (d / "baseline.json").unlink(missing_ok=True)
        got = run_baseline(get_model(args.model), args.micro_batch, args.steps, device, compile=not args.smoke)
        (d / "baseline.json").write_text(json.dumps(got))
        return 0
    if not args.smoke:
        import torch

        if not torch.cuda.is_available():
            print("gpu_speed: no CUDA device here (--smoke checks the plumbing on a CPU)", file=sys.stderr)
            return 2
    cluster = get_cluster(args.cluster)
    peak = cluster.device.peak_flops(dtype) or cluster.device.peak_flops("float32") or 1e12
    m = get_model(args.model)
    t_start = time.perf_counter()
    rows: list[dict] = []
    results = {
        "model": m.name,
        "micro_batch": args.micro_batch,
        "steps": args.steps,
        "device": device,
        "peak_flops": peak,
        "rows": rows,
    }

    def left() -> float:
        return args.budget_s - (time.perf_counter() - t_start)

    def add(name: str, model, batch: int, got: dict) -> None:
        row = {"run": name, "model": model.name, "batch": batch, **got}
        if "step_s" in got:
            row["tokens_per_s"] = batch * model.seq_len / got["step_s"]
            row["mfu"] = mfu(model, batch, got["step_s"], peak)
        rows.append(row)
        (d / "gpu_speed.json").write_text(json.dumps(results, indent=2))

    from exatrain.accounting.params import total_params

    base = baseline_in_child(args, d, left())
    if "error" in base:
        print(f"gpu_speed: baseline failed: {base['error']}", file=sys.stderr)
        return 1
    expected = total_params(m)
    if base["params"] != expected:
        print(
            f"gpu_speed: baseline has {base['params']:,} parameters, exatrain's {m.name} {expected:,}", file=sys.stderr
        )
        return 1
    add("baseline (compiled, nanoGPT-style)" if not args.smoke else "baseline (eager)", m, args.micro_batch, base)
    runs = [("exatrain eager", m, args.micro_batch, False, "none")]
    if not args.smoke:
        runs.append(("exatrain --compile", m, args.micro_batch, True, "none"))
        runs.append(("exatrain --compile", get_model("gpt-2.7b"), max(1, args.micro_batch // 2), True, "none"))
        big = largest_fitting_gpt(args.cluster)
        if big is not None:
            runs.append(("exatrain --compile, largest that fits", big, 1, True, "full"))
    for name, model, batch, comp, rec in runs:
        if left() < 45:
            rows.append({"run": name, "model": model.name, "skipped": f"time budget: {left():.0f} s left"})
            continue
        metrics = d / f"{model.name}-{'compile' if comp else 'eager'}.jsonl"
        cmd = exatrain_cmd(model.name, batch, args.steps, args.cluster, device, dtype, comp, metrics, rec)
        add(name, model, batch, run_exatrain(cmd, metrics, left()))
    results["seconds"] = time.perf_counter() - t_start
    (d / "gpu_speed.json").write_text(json.dumps(results, indent=2))
    print_table(rows, base)
    print(f"-> {d / 'gpu_speed.json'} ({results['seconds']:.0f} s)")
    return 0


def print_table(rows: list[dict], base: dict) -> None:
    print(
        f"{'run':40s} {'model':10s} {'B':>3s} {'tokens/s':>10s} {'MFU':>6s} {'peak GiB':>9s} "
        f"{'predicted':>9s} {'vs base':>8s}"
    )
    ref = next((r["tokens_per_s"] for r in rows if "tokens_per_s" in r), None)
    for r in rows:
        if "tokens_per_s" not in r:
            print(f"{r['run']:40s} {r['model']:10s} {r.get('skipped') or r.get('error')}")
            continue
        mem = "-" if r.get("peak_memory_bytes") is None else f"{r['peak_memory_bytes'] / GiB:.1f}"
        pred = "-" if r.get("predicted_memory_bytes") is None else f"{r['predicted_memory_bytes'] / GiB:.1f}"
        same = r["model"] == rows[0]["model"] and r["batch"] == rows[0]["batch"]
        ratio = f"{r['tokens_per_s'] / ref:.2f}x" if ref and same else "-"
        print(
            f"{r['run']:40s} {r['model']:10s} {r['batch']:3d} {r['tokens_per_s']:10,.0f} {r['mfu']:6.1%} "
            f"{mem:>9s} {pred:>9s} {ratio:>8s}"
        )


if __name__ == "__main__":
    sys.exit(main())
