"""benchmarks/calculon_peer.py: a held run becomes Calculon's model and execution field for field, a run Calculon
cannot express is refused with its reason, the checkout's pin is git's tree hash, and bad arguments exit 2 — all
without Calculon installed (a stand-in ``bin/calculon`` plays it where a run is needed).

Broken on purpose and seen to fail here: tp and pp swapped in ``translate`` (the 530B run's exact fields), dp put on
the NVLink tier before tp in ``_networks``, the ZeRO-3 check dropped from ``refusal`` (the llm-foundry reason), an
executable file hashed as 100644 in ``tree_hash`` (git's tree), and "ahead" named from fewer than three runs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import benchmarks

KORTHIKANTI = "https://arxiv.org/abs/2205.05198"


@pytest.fixture(scope="module")
def cp():
    return benchmarks.load("calculon_peer")


@pytest.fixture(scope="module")
def rows(cp):
    return cp.pe.load_rows()


def _row(rows, start: str, source: str | None = None):
    return next(r for r in rows if r.name.startswith(start) and (source is None or r.source == source))


def test_korthikanti_530b_translates_field_for_field(cp, rows):
    """MT-NLG 530B with sequence parallelism and selective recompute on 280 A100s (Korthikanti et al. 2022 Table 5):
    the fields Calculon's own validation input for this run holds (validation/seqsel/tab5/turing-530B_seqsel.json)."""
    inp = cp.translate(_row(rows, "GPT 530B (MT-NLG) - sequence parallel + selective", KORTHIKANTI))
    assert inp.system == "a100_80g.json"
    assert inp.model == {
        "hidden": 20480,
        "feedforward": 81920,
        "seq_size": 2048,
        "attn_heads": 128,
        "attn_size": 160,
        "num_blocks": 105,
    }
    assert inp.execution == {
        "num_procs": 280,
        "tensor_par": 8,
        "pipeline_par": 35,
        "data_par": 1,
        "tensor_par_net": 0,
        "pipeline_par_net": 1,
        "data_par_net": 1,
        "batch_size": 280,
        "microbatch_size": 1,
        "datatype": "float16",
        "fused_activation": False,
        "attention_type": "multihead",
        "activation_recompute": "attn_only",
        "pipeline_interleaving": 3,
        "optimizer_sharding": False,
        "tensor_par_comm_type": "rs_ag",
        "tensor_par_overlap": "none",
        "seq_par_ag_redo": True,
        "data_par_overlap": False,
        "weight_offload": False,
        "activations_offload": False,
        "optimizer_offload": False,
        "training": True,
    }


def test_narayanan_data_parallel_overlap_and_full_recompute(cp, rows):
    """GPT 18.4B, tp 8 and dp 32 without a pipeline, torch DDP overlapping its all-reduce; GPT 1.7B at dp 32 alone."""
    e = cp.translate(_row(rows, "GPT 18.4B (Narayanan")).execution
    assert (e["tensor_par"], e["pipeline_par"], e["data_par"], e["num_procs"]) == (8, 1, 32, 256)
    assert (e["tensor_par_net"], e["pipeline_par_net"], e["data_par_net"]) == (0, 1, 1)
    assert (e["activation_recompute"], e["tensor_par_comm_type"], e["seq_par_ag_redo"]) == ("full", "ar", False)
    assert e["data_par_overlap"] is True and e["optimizer_sharding"] is False
    assert (e["batch_size"], e["microbatch_size"], e["pipeline_interleaving"]) == (1024, 8, 1)
    small = cp.translate(_row(rows, "GPT 1.7B (Narayanan")).execution
    assert (small["tensor_par"], small["data_par"], small["tensor_par_net"], small["data_par_net"]) == (1, 32, 1, 1)


def test_networks_place_tp_then_dp_then_pp_inside_the_node(cp):
    assert cp._networks(2, 4, 2, 8) == (0, 1, 0)  # tp 2 x dp 2 in the node, pp across nodes
    assert cp._networks(8, 2, 4, 8) == (0, 1, 1)
    assert cp._networks(1, 8, 1, 8) == (1, 0, 1)  # one node's pipeline on NVLink; a dimension of 1 on tier 1
    assert cp._networks(4, 4, 4, 8) == (0, 1, 1)


def test_runs_it_cannot_express_are_refused_with_their_reason(cp, rows):
    foundry = next(r for r in rows if r.engine == "llm-foundry" and r.plan is not None)
    llama = next(r for r in rows if r.engine == "torchtitan" and r.family == "A100" and r.plan is not None)
    blocking = _row(rows, "BLOOM 176B")  # tp 4, pp 12, dp 8, ZeRO-1, CUDA_LAUNCH_BLOCKING=1
    mi250x = next(r for r in rows if r.family == "MI250X" and r.plan is not None)
    assert cp.refusal(foundry) == "ZeRO-3 / FSDP weight sharding"
    assert cp.refusal(llama) == "llama's SwiGLU MLP (Calculon's MLP is two matrices and a GeLU)"
    assert cp.refusal(blocking) == "synchronous launches (CUDA_LAUNCH_BLOCKING=1)"
    assert cp.refusal(mi250x) == "no shipped system file for mi250x-gcd"
    with pytest.raises(cp.NotExpressible, match=r"^ZeRO-3 / FSDP weight sharding$"):
        cp.translate(foundry)
    assert cp.refusal(_row(rows, "GPT 22B - full recompute baseline")) is None
    # --lenient: a run whose only obstacle is its synchronous launches is priced without them
    assert cp.refusal(blocking, allow=cp.LENIENT) is None
    e = cp.translate(blocking, allow=cp.LENIENT).execution
    assert (e["tensor_par"], e["pipeline_par"], e["data_par"], e["optimizer_sharding"]) == (4, 12, 8, True)
    assert cp.refusal(foundry, allow=cp.LENIENT) == "ZeRO-3 / FSDP weight sharding"


def test_tree_hash_is_gits(cp, tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "repo"
    (root / "bin").mkdir(parents=True)
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "bin" / "tool").write_text("#!/bin/sh\necho hi\n")
    (root / "bin" / "tool").chmod(0o755)
    (root / "pkg" / "a.py").write_text("x = 1\n")
    (root / ".gitignore").write_text("*.py[cod]\n__pycache__\n")
    (root / "pkg" / "__pycache__" / "a.cpython-312.pyc").write_bytes(b"\0\1")
    (root / "pkg" / "b.pyc").write_bytes(b"\2")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "t"], check=True)
    tree = subprocess.run([*git, "rev-parse", "HEAD^{tree}"], check=True, capture_output=True, text=True)
    assert cp.tree_hash(root) == tree.stdout.strip()
    assert cp.pin_status(root)[0] is False


def _fake_checkout(root: Path) -> Path:
    """A stand-in for Calculon: ``bin/calculon llm M E S OUT`` writes a total_time of num_procs x num_blocks / 1000
    seconds, or prints Calculon's ERROR line where tp exceeds 8; its systems/ hold only the A100 file."""
    (root / "bin").mkdir(parents=True)
    (root / "calculon").mkdir()
    (root / "systems").mkdir()
    (root / "calculon" / "__init__.py").write_text("")
    (root / "systems" / "a100_80g.json").write_text(json.dumps({"matrix": {"float16": {}}, "networks": [{"size": 8}]}))
    (root / "bin" / "calculon").write_text(
        "import json, sys\n"
        "model, exe, system = (json.load(open(p)) for p in sys.argv[2:5])\n"
        "if exe['tensor_par'] > 8:\n"
        '    print("ERROR: Network tier0 isn\'t big enough")\n'
        "    sys.exit(255)\n"
        "json.dump({'total_time': exe['num_procs'] * model['num_blocks'] / 1000}, open(sys.argv[5], 'w'))\n"
    )
    return root


def test_a_stand_in_calculon_prices_what_translates_and_reports_its_errors(cp, rows, tmp_path):
    checkout = _fake_checkout(tmp_path / "calculon")
    gpt22 = _row(rows, "GPT 22B - full recompute baseline")
    foundry = next(r for r in rows if r.engine == "llm-foundry" and r.plan is not None)
    peers = cp.price_with_calculon([gpt22, foundry], sys.executable, checkout, jobs=1)
    assert [(p.calculon_s, p.reason) for p in peers] == [(8 * 48 / 1000, ""), (None, "ZeRO-3 / FSDP weight sharding")]
    assert peers[0].calculon_error == pytest.approx(0.384 / gpt22.measured_s - 1)
    wide = cp.CalculonInput(
        cp.translate(gpt22).model, {**cp.translate(gpt22).execution, "tensor_par": 16}, "a100_80g.json"
    )
    assert cp.run_calculon(sys.executable, checkout, wide) == (None, "Calculon: Network tier0 isn't big enough")


def _peer(cp, engine: str, calc: float, exa: float):
    row = cp.pe.Row(0, "src", engine, "A100", "dense", "r", 1.0, "s/iteration", oos_s=1 + exa)
    return cp.PeerRow(row, calculon_s=1 + calc)


def test_ahead_only_where_both_price_three_runs(cp):
    peers = [_peer(cp, "a", 0.10, 0.02), _peer(cp, "a", -0.2, 0.05), _peer(cp, "a", 0.05, -0.3)]
    peers += [_peer(cp, "b", 0.10, 0.01), _peer(cp, "b", 0.10, 0.01)]
    table = {c["engine"]: c for c in cp.cells(peers)}
    assert (table["a"]["both"], table["a"]["ahead"]) == (3, "exatrain")
    assert table["a"]["calculon_median"] == pytest.approx(0.10)
    assert table["a"]["exatrain_median"] == pytest.approx(0.05)
    assert (table["b"]["both"], table["b"]["ahead"]) == (2, "—")


def test_reasons_are_counted_with_calculons_memory_refusals_as_one(cp):
    peers = [_peer(cp, "a", 0.1, 0.1)]
    for why in ("Calculon: Mem tier1 needs 136.250 GiB but only has 80.000 GiB", "MoE", "MoE"):
        peers.append(cp.PeerRow(peers[0].row, reason=why))
    peers.append(cp.PeerRow(peers[0].row, reason="Calculon: Mem tier1 needs 152.1 GiB but only has 80.000 GiB"))
    assert cp.reasons(peers).splitlines() == [
        "   2  Calculon: Mem tier1 needs more GiB but only has 80.000 GiB",
        "   2  MoE",
    ]


def test_bad_arguments_exit_2_with_one_line(cp, tmp_path, capsys):
    assert cp.main(["--calculon", str(tmp_path / "nowhere"), "--python", sys.executable]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --calculon {tmp_path / 'nowhere'}: not a Calculon checkout")
    checkout = _fake_checkout(tmp_path / "calculon")
    assert cp.main(["--calculon", str(checkout), "--python", str(tmp_path / "no-python")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --python {tmp_path / 'no-python'}: cannot run it")
    args = ["--calculon", str(checkout), "--python", sys.executable, "--engine", "no-such-engine"]
    assert cp.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: no published row matches --engine no-such-engine --family None"]
    (checkout / "calculon" / "__init__.py").write_text("import not_a_module_here\n")
    assert cp.main(["--calculon", str(checkout), "--python", sys.executable]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot import calculon" in err[0] and "not_a_module_here" in err[0]
