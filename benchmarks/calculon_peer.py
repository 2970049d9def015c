"""A peer beside exatrain's figures: Calculon (github.com/calculon-ai/calculon, Apache-2.0), pinned, with its shipped
system files and nothing tuned, prices every held published run it can express; its |error| is printed beside
exatrain's out-of-sample one, per engine and hardware.

Rows: the runs benchmarks/prediction_error.py prices (benchmarks/data/published_runs_by_engine.csv, each with a plan
and a measured step time). exatrain's prediction is prediction_error's own out-of-sample one (``price``,
``out_of_sample``, ``blocking_out_of_sample``: leave one source out). Calculon runs as its README says,
``PYTHONPATH=CHECKOUT PYTHON CHECKOUT/bin/calculon llm MODEL.json EXECUTION.json SYSTEM.json OUT.json``, one run a
row, and its step time is ``total_time`` of OUT.json (one batch: forward, backward, optimizer, recompute, bubble and
the exposed TP/PP/DP communication of the transformer blocks). Calculon is never imported here, nor a dependency:
``--python`` names an interpreter that has its requirements (pandas, psutil), e.g.
``python3 -m venv V && V/bin/pip install pandas psutil``.

The pin: commit ``PIN_COMMIT``, whose files hash to the git tree ``PIN_TREE``; the checkout's tracked files (a git
checkout or an unpacked archive; ``.git``, ``__pycache__`` and what its own .gitignore names left aside) are hashed
as git hashes a tree and the result printed as pinned or not. Calculon runs with PYTHONDONTWRITEBYTECODE=1, so it
leaves the checkout as it found it.

Translation (``translate``), from the exatrain Plan prediction_error builds for the row:
  model (Calculon's ``Llm.Application``): hidden, feedforward = ffn_hidden (4 x hidden for GPT), seq_size = seq_len,
    attn_heads = heads, attn_size = the head width, num_blocks = layers. Calculon's model is the transformer blocks
    alone (no embedding, logits or loss: it has no vocabulary) with a two-matrix GeLU MLP, biases and LayerNorm;
    dropout is not priced.
  execution (``Llm.Execution``): num_procs = tp x pp x dp; tensor_par, pipeline_par, data_par; batch_size =
    global batch, microbatch_size = micro-batch; datatype "float16" for fp16 and bf16 (the shipped files list one
    16-bit rate, which is bf16's on A100 and H100); activation_recompute full -> "full", selective (attention core
    only, Korthikanti et al. 2022) -> "attn_only", none -> "none"; pipeline_interleaving = the interleaved
    schedule's virtual stages, else 1; optimizer_sharding = ZeRO-1/2 (Megatron's distributed optimizer) with
    dp > 1; tensor_par_comm_type "rs_ag" with sequence parallelism, else "ar"; seq_par_ag_redo with sequence
    parallelism unless recompute is full (Megatron gathers the input again in the backward; Calculon's own
    validation files for Korthikanti et al. 2022 do the same); data_par_overlap where the run overlaps its gradient
    reduction (as prediction_error reads the run: stated, or its engine's default) and dp > 1;
    tensor_par_overlap "ring" where it overlaps its TP communication, else "none"; fused_activation only for a
    compiled run (Calculon's fused GeLU runs inside the matmul before it; Megatron's bias-GeLU kernel does not);
    attention_type "multihead" ("multiquery" for one KV head); no offload; training.
  networks: tier 0 of the system file (the NVLink domain, its ``size`` GPUs) carries tp, then dp, then pp (Megatron's
    rank order) while the product of those placed there fits it; the rest run on tier 1 (InfiniBand), as the
    shipped example places pp and dp. A dimension of 1 goes on tier 1, as in the shipped example and validation.
  system: A100 80 GB -> systems/a100_80g.json (the file Calculon's own step-time validation uses), H100 SXM 80 GB
    (700 W) -> systems/h100_80g_nvl8.json; every other device has no shipped file.
Not expressible (the row is counted under its first reason, ``refusal``): MoE, context parallelism, a SwiGLU MLP
(arch llama), grouped-query attention, multi-head latent attention, QK-norm, sliding windows; a device without a
shipped system file (MI250X, H200, B200, the 500 W H100); ZeRO-3 / FSDP weight sharding; flash attention
(Calculon prices attention with its scores in memory); synchronous launches (CUDA_LAUNCH_BLOCKING=1); recompute of
some layers or modules beyond the attention core; offload; schedules other than 1F1B and interleaved 1F1B; FP8 on
a file without an FP8 rate; an uneven layer split. A run Calculon itself rejects (its ERROR line: a network tier
too small, memory over capacity) is counted with Calculon's words. ``--lenient`` also prices, in a second table,
the runs whose only obstacle is flash attention or synchronous launches (``LENIENT``): what a Calculon user gets who
leaves those out, since neither changes the model or layout Calculon reads.

Calculon's step-time validation (``calculon llm-validation``, seqsel_tab5) is Table 5 of Korthikanti et al. 2022,
eight of that source's ten runs held here: the source is in-sample for the peer (its rows marked "c", and each
cell's medians without it printed).

    python benchmarks/calculon_peer.py --calculon CHECKOUT --python PYTHON [--engine E] [--family F] [--jobs N]
        [--lenient]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import prediction_error as pe  # noqa: E402

from exatrain.errors import UserError  # noqa: E402
from exatrain.planner.cost.overlap import overlap_priced, overlap_rules  # noqa: E402

PIN_URL = "https://github.com/calculon-ai/calculon"
PIN_COMMIT = "caa4b11f8fe1fee3ba57adaacb7590d7deabd053"
PIN_TREE = "cf8581657fa45307e704b125b05b8cb65ec2a075"  # git rev-parse caa4b11^{tree}
SYSTEM_FILES = {"a100-80gb": "a100_80g.json", "h100-sxm": "h100_80g_nvl8.json"}
CALCULON_VALIDATED_ON = (pe.KORTHIKANTI,)  # llm-validation's seqsel_tab5: Korthikanti et al. 2022 Table 5
MIN_BOTH = 3  # runs both price for a cell to name who is ahead
# What a run has that no Calculon input states but that leaves its model and layout as Calculon reads them: with
# --lenient such runs are also priced, as Calculon prices them without it, in a table of their own.
FLASH = "flash attention (Calculon keeps the attention scores)"
BLOCKING = "synchronous launches (CUDA_LAUNCH_BLOCKING=1)"
LENIENT = (FLASH, BLOCKING)


class NotExpressible(Exception):
    """A run Calculon's inputs cannot state; the message is the reason counted."""


@dataclass(frozen=True)
class CalculonInput:
    """What Calculon's ``llm`` command reads for one run: the model and execution JSON, and which shipped system
    file under systems/."""

    model: dict
    execution: dict
    system: str


@dataclass
class PeerRow:
    """One held run: Calculon's step time or why there is none, beside exatrain's out-of-sample one."""

    row: pe.Row
    calculon_s: float | None = None
    reason: str = ""  # why Calculon has no step time for it

    @property
    def calculon_error(self) -> float | None:
        return None if self.calculon_s is None else self.calculon_s / self.row.measured_s - 1

    @property
    def exatrain_error(self) -> float | None:
        r = self.row
        return None if r.oos_s is None else r.oos_s / r.measured_s - 1


def refusal(row: pe.Row, allow: tuple[str, ...] = ()) -> str | None:
    """Why Calculon cannot express ``row``'s run (its first reason not in ``allow``), or None."""
    p, device = row.plan, row.cluster.device.name
    m = p.model
    checks = (
        (m.is_moe, "MoE"),
        (p.cp > 1, "context parallelism"),
        (m.arch != "gpt", f"{m.arch}'s SwiGLU MLP (Calculon's MLP is two matrices and a GeLU)"),
        (m.kv_heads not in (0, 1, m.heads), "grouped-query attention"),
        (m.mla or m.qk_norm or m.sliding_window or m.attention_sinks, "attention beyond multi-head (MLA, QK-norm...)"),
        (device not in SYSTEM_FILES, f"no shipped system file for {device}"),
        (p.zero_stage >= 3, "ZeRO-3 / FSDP weight sharding"),
        (p.flash_attention, FLASH),
        (p.launch_blocking, BLOCKING),
        (p.offload != "none", f"offload of {p.offload}"),
        (p.schedule not in ("1f1b", "interleaved"), f"the {p.schedule} schedule"),
        (bool(p.stage_layers), "an uneven layer split"),
        (bool(p.recompute_every or p.recompute_layers), "full recompute of some layers only"),
        (set(p.recompute_modules) - {"core_attn"} != set(), "recompute of modules beyond the attention core"),
        (p.dtype == "float32", "float32 training"),
    )
    return next((why for bad, why in checks if bad and why not in allow), None)


def _networks(tp: int, pp: int, dp: int, node: int) -> tuple[int, int, int]:
    """(tensor_par_net, pipeline_par_net, data_par_net): tier 0 carries tp, then dp, then pp while their product fits
    ``node`` GPUs; a dimension of 1 goes on tier 1."""
    placed, nets = 1, {}
    for name, n in (("tp", tp), ("dp", dp), ("pp", pp)):
        inside = n > 1 and placed * n <= node
        nets[name] = 0 if inside else 1
        placed *= n if inside else 1
    return nets["tp"], nets["pp"], nets["dp"]


def translate(row: pe.Row, node: int = 8, fp8: bool = False, allow: tuple[str, ...] = ()) -> CalculonInput:
    """``row``'s run as Calculon's model and execution (the mapping in the module docstring); ``node``: the GPUs of
    the system file's tier 0; ``fp8``: the file has an FP8 rate; ``allow``: reasons (``LENIENT``) not to refuse on.
    NotExpressible where it cannot be stated."""
    why = refusal(row, allow)
    if why is None and row.plan.fp8 and not fp8:
        why = "FP8 (its system file has no FP8 rate)"
    if why:
        raise NotExpressible(why)
    p, m = row.plan, row.plan.model
    rules = overlap_rules(row.runtime, overlap_priced(row.overlap))
    tp_net, pp_net, dp_net = _networks(p.tp, p.pp, p.dp, node)
    model = {
        "hidden": m.hidden,
        "feedforward": m.ffn_hidden,
        "seq_size": m.seq_len,
        "attn_heads": m.heads,
        "attn_size": m.head_dim,
        "num_blocks": m.layers,
    }
    execution = {
        "num_procs": p.tp * p.pp * p.dp,
        "tensor_par": p.tp,
        "pipeline_par": p.pp,
        "data_par": p.dp,
        "tensor_par_net": tp_net,
        "pipeline_par_net": pp_net,
        "data_par_net": dp_net,
        "batch_size": p.global_batch,
        "microbatch_size": p.micro_batch,
        "datatype": "float8" if p.fp8 else "float16",
        "fused_activation": p.elementwise == "fused",
        "attention_type": "multiquery" if m.kv_heads == 1 else "multihead",
        "activation_recompute": {"full": "full", "selective": "attn_only"}.get(p.recompute, "none"),
        "pipeline_interleaving": p.interleave if p.schedule == "interleaved" else 1,
        "optimizer_sharding": p.zero_stage in (1, 2) and p.dp > 1,
        "tensor_par_comm_type": "rs_ag" if p.sequence_parallel else "ar",
        "tensor_par_overlap": "ring" if rules.tp and p.sequence_parallel and p.tp > 1 else "none",
        "seq_par_ag_redo": p.sequence_parallel and p.recompute != "full",
        "data_par_overlap": rules.dp_grad_reduce and p.dp > 1,
        "weight_offload": False,
        "activations_offload": False,
        "optimizer_offload": False,
        "training": True,
    }
    return CalculonInput(model, execution, SYSTEM_FILES[row.cluster.device.name])


# ---- the pinned checkout ----------------------------------------------------------------------------------------


def _ignored(name: str, patterns: list[str]) -> bool:
    return name in (".git", "__pycache__") or any(fnmatch.fnmatch(name, pat) for pat in patterns)


def tree_hash(path: Path, patterns: list[str] | None = None) -> str:
    """The git tree hash of the files under ``path`` (as ``git write-tree`` gives for them committed), leaving aside
    ``.git``, ``__pycache__`` and names matching ``patterns`` (default: ``path``'s .gitignore lines)."""
    if patterns is None:
        ignore = path / ".gitignore"
        lines = ignore.read_text(encoding="utf-8").splitlines() if ignore.is_file() else []
        patterns = [ln.strip().rstrip("/") for ln in lines if ln.strip() and not ln.startswith("#")]
    entries = []
    for child in path.iterdir():
        if _ignored(child.name, patterns):
            continue
        if child.is_dir() and not child.is_symlink():
            sub = tree_hash(child, patterns)
            if sub:
                entries.append((child.name + "/", b"40000 " + child.name.encode() + b"\0" + bytes.fromhex(sub)))
            continue
        data = os.readlink(child).encode() if child.is_symlink() else child.read_bytes()
        mode = b"120000" if child.is_symlink() else b"100755" if os.access(child, os.X_OK) else b"100644"
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).digest()
        entries.append((child.name, mode + b" " + child.name.encode() + b"\0" + blob))
    if not entries:
        return ""
    body = b"".join(e for _, e in sorted(entries))
    return hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()


def pin_status(checkout: Path) -> tuple[bool, str]:
    """(the checkout's files are the pinned commit's, a line saying which)."""
    tree = tree_hash(checkout)
    if tree == PIN_TREE:
        return True, f"Calculon {PIN_URL} at {PIN_COMMIT[:12]} (pinned; its files hash to tree {PIN_TREE[:12]})"
    at = ""
    if shutil.which("git") and (checkout / ".git").exists():
        head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
        at = f" (HEAD {head.stdout.strip()[:12]})" if head.returncode == 0 else ""
    return False, (
        f"WARNING: {checkout}{at} is NOT the pinned Calculon {PIN_COMMIT[:12]}: its files hash to tree "
        f"{tree[:12]}, the pin's to {PIN_TREE[:12]}; the figures below are not the pinned peer's"
    )


# ---- running Calculon -------------------------------------------------------------------------------------------


def run_calculon(python: str, checkout: Path, inp: CalculonInput) -> tuple[float | None, str]:
    """(Calculon's step time for ``inp``, "") or (None, what Calculon said: its ERROR line, else its last line)."""
    with tempfile.TemporaryDirectory(prefix="calculon-peer-") as tmp:
        files = {}
        for name, data in (("model", inp.model), ("execution", inp.execution)):
            files[name] = Path(tmp) / f"{name}.json"
            files[name].write_text(json.dumps(data), encoding="utf-8")
        out = Path(tmp) / "out.json"
        cmd = [python, str(checkout / "bin" / "calculon"), "llm", str(files["model"]), str(files["execution"])]
        cmd += [str(checkout / "systems" / inp.system), str(out)]
        env = dict(os.environ, PYTHONPATH=str(checkout), PYTHONDONTWRITEBYTECODE="1")
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp, timeout=300)
        if done.returncode == 0 and out.is_file():
            return float(json.loads(out.read_text(encoding="utf-8"))["total_time"]), ""
        lines = [ln.strip() for ln in (done.stdout + "\n" + done.stderr).splitlines() if ln.strip()]
        said = next((ln for ln in lines if ln.startswith("ERROR:")), lines[-1] if lines else f"exit {done.returncode}")
        return None, f"Calculon: {said.removeprefix('ERROR:').strip()}"


def price_with_calculon(
    rows: list[pe.Row], python: str, checkout: Path, jobs: int, allow: tuple[str, ...] = ()
) -> list[PeerRow]:
    """Every held run with a plan and a measured step: translated (``allow``: as ``translate``) and run through
    Calculon where it can be."""
    peers, todo = [], []
    for r in rows:
        if r.plan is None or not r.measured_s:
            continue
        peer = PeerRow(r, reason=refusal(r, allow) or "")
        peers.append(peer)
        if peer.reason:
            continue
        path = checkout / "systems" / SYSTEM_FILES[r.cluster.device.name]
        if not path.is_file():
            peer.reason = f"the checkout has no systems/{path.name}"
            continue
        system = json.loads(path.read_text(encoding="utf-8"))
        try:
            inp = translate(r, node=system["networks"][0]["size"], fp8="float8" in system["matrix"], allow=allow)
        except NotExpressible as exc:
            peer.reason = str(exc)
            continue
        todo.append((peer, inp))
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        results = pool.map(lambda pi: run_calculon(python, checkout, pi[1]), todo)
        for (peer, _), (step, said) in zip(todo, results):
            peer.calculon_s, peer.reason = step, said
    return peers


# ---- the table --------------------------------------------------------------------------------------------------


def _median(errs: list[float]) -> float | None:
    return float(np.median(np.abs(errs))) if errs else None


def cells(peers: list[PeerRow]) -> list[dict]:
    """Per (engine, hardware family): runs held, priced by each, priced by both, and each one's median |error| over
    the runs both price; who is ahead where both price ``MIN_BOTH`` or more."""
    groups: dict[tuple[str, str], list[PeerRow]] = {}
    for p in peers:
        groups.setdefault((p.row.engine, p.row.family), []).append(p)
    out = []
    for (engine, family), ps in sorted(groups.items()):
        both = [p for p in ps if p.calculon_error is not None and p.exatrain_error is not None]
        own = [p for p in both if p.row.source not in CALCULON_VALIDATED_ON]
        c, x = _median([p.calculon_error for p in both]), _median([p.exatrain_error for p in both])
        ahead = "—" if len(both) < MIN_BOTH else "exatrain" if x < c else "Calculon" if c < x else "tie"
        out.append(
            {
                "engine": engine,
                "family": family,
                "runs": len(ps),
                "calculon": sum(p.calculon_s is not None for p in ps),
                "exatrain": sum(p.exatrain_error is not None for p in ps),
                "both": len(both),
                "calculon_median": c,
                "exatrain_median": x,
                "calculon_signed": float(np.median([p.calculon_error for p in both])) if both else None,
                "exatrain_signed": float(np.median([p.exatrain_error for p in both])) if both else None,
                "calculon_median_unseen": _median([p.calculon_error for p in own]),
                "exatrain_median_unseen": _median([p.exatrain_error for p in own]),
                "unseen": len(own),
                "ahead": ahead,
            }
        )
    return out


def _pct(v: float | None, signed: bool = False) -> str:
    return "—" if v is None else f"{v:+.1%}" if signed else f"{v:.1%}"


def markdown(table: list[dict]) -> str:
    head = (
        "| engine | hardware | runs | Calculon prices | exatrain prices | both | Calculon median | exatrain median "
        "| Calculon signed | exatrain signed | ahead | without Calculon's validation source: n, Calculon, exatrain |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for c in table:
        lines.append(
            f"| {c['engine']} | {c['family']} | {c['runs']} | {c['calculon']} | {c['exatrain']} | {c['both']} | "
            f"{_pct(c['calculon_median'])} | {_pct(c['exatrain_median'])} | {_pct(c['calculon_signed'], True)} | "
            f"{_pct(c['exatrain_signed'], True)} | {c['ahead']} | {c['unseen']}, "
            f"{_pct(c['calculon_median_unseen'])}, {_pct(c['exatrain_median_unseen'])} |"
        )
    return "\n".join(lines)


def reasons(peers: list[PeerRow]) -> str:
    """The runs Calculon does not price, counted by reason (Calculon's own memory refusals as one, whatever GiB)."""
    counts: dict[str, int] = {}
    for p in peers:
        if p.calculon_s is None:
            why = (
                re.sub(r"needs [\d.]+ GiB", "needs more GiB", p.reason)
                if p.reason.startswith("Calculon:")
                else p.reason
            )
            counts[why] = counts.get(why, 0) + 1
    return "\n".join(f"{n:4d}  {why}" for why, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def print_peers(peers: list[PeerRow]) -> None:
    """Each run Calculon prices with both errors, the others' reasons counted, and the table."""
    print(f"{'#':>3} {'run':52} {'engine':18} {'hw':9} {'measured s':>10} {'Calculon':>9} {'exatrain':>9}")
    for p in peers:
        if p.calculon_s is None:
            continue
        mark = "c" if p.row.source in CALCULON_VALIDATED_ON else " "
        print(
            f"{p.row.index:3d} {p.row.name[:52]:52} {p.row.engine:18} {p.row.family:9} {p.row.measured_s:10.3f} "
            f"{_pct(p.calculon_error, True):>8}{mark} {_pct(p.exatrain_error, True):>9}"
        )
    print("(c: a run of the source Calculon's own step-time validation compares with: in-sample for the peer)\n")
    print(f"held runs Calculon does not price ({sum(p.calculon_s is None for p in peers)} of {len(peers)}):")
    print(reasons(peers) + "\n")
    print(
        "median |error| over the runs both price (exatrain's out of sample, leave one source out; Calculon's "
        f"untuned, its shipped system files); ahead where both price {MIN_BOTH} or more:"
    )
    print(markdown(cells(peers)))


def _check_args(args: argparse.Namespace) -> None:
    """One UserError line for a checkout that is not Calculon's or an interpreter that cannot run it."""
    checkout = args.calculon
    if not (checkout / "bin" / "calculon").is_file() or not (checkout / "systems").is_dir():
        raise UserError(f"--calculon {checkout}: not a Calculon checkout (no bin/calculon and systems/); {PIN_URL}")
    if args.jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {args.jobs}")
    try:
        done = subprocess.run(
            [args.python, "-c", "import calculon"],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(checkout), PYTHONDONTWRITEBYTECODE="1"),
            timeout=120,
        )
    except OSError as exc:
        raise UserError(f"--python {args.python}: cannot run it ({exc.strerror})") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise UserError(f"--python {args.python} cannot import calculon from {checkout}: {last}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calculon", type=Path, required=True, help=f"a checkout of {PIN_URL} at {PIN_COMMIT[:12]}")
    ap.add_argument("--python", required=True, help="an interpreter with Calculon's requirements (pandas, psutil)")
    ap.add_argument("--csv", type=Path, default=pe.CSV_PATH)
    ap.add_argument("--engine", help="only this engine's rows in the table (every row is still predicted)")
    ap.add_argument("--family", help="only this hardware family's rows in the table")
    ap.add_argument("--jobs", type=int, default=2, help="Calculon runs at once (default 2)")
    ap.add_argument(
        "--lenient",
        action="store_true",
        help="also price the runs whose only obstacle is flash attention or synchronous launches, in a second table",
    )
    args = ap.parse_args(argv)
    try:
        _check_args(args)
        pinned, pin_line = pin_status(args.calculon)
        rows = pe.load_rows(args.csv)
        keep = [r for r in rows if args.engine in (None, r.engine) and args.family in (None, r.family)]
        if not keep:
            raise UserError(f"no published row matches --engine {args.engine} --family {args.family}")
        pe.price(rows)  # exatrain, out of sample, as prediction_error.py predicts it (every row: refits need them)
        pe.out_of_sample(rows)
        pe.blocking_out_of_sample(rows)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    checkout = args.calculon.resolve()
    peers = price_with_calculon(keep, args.python, checkout, args.jobs)
    print(pin_line + "\n")
    print_peers(peers)
    if args.lenient:
        soft = [p.row for p in peers if p.reason in LENIENT]
        extra = {p.row.index: p for p in price_with_calculon(soft, args.python, checkout, args.jobs, allow=LENIENT)}
        print(
            "\n--lenient: the runs above and those whose obstacle was only "
            + " or ".join(LENIENT)
            + ", priced as Calculon prices them without it:\n"
        )
        print_peers([extra.get(p.row.index, p) for p in peers])
    if not pinned:
        print("\n" + pin_line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
