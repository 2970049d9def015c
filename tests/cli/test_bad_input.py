"""Bad input to every command: exactly one line on stderr, exit status 2, no traceback, nothing written.

The matrix: every command that reads or writes a path, or takes a number, against a missing file,
a directory where a file is expected, a file where a directory is, an unwritable location,
malformed JSON, an empty file, JSON of the wrong types, and out-of-range numbers: integers beyond
exatrain.limits.MAX_COUNT (which would overflow the planner's int64 arrays), a NaN or an infinity where a
setting is a number, a SLURM time with a field beyond its range, a plan whose global batch a changed
layout cannot split, a dataset shard whose bytes changed since `prepare`. Every case fails before any
work starts (no rank, no benchmark, no tokenizing), so the matrix runs in seconds. The API refuses the
same values with a UserError (API_CASES). (`models` and `hardware` read and write no path and take no
number: only --json.)

Checked to fail with the fix taken out: the CLI's integer parsers without their bound (6 cases: the
API's line instead of the parser's), and limits.check_counts too (17 cases, 3 of them an OverflowError
traceback); TrainConfig.check without its finiteness check (the API's NaN and infinite train cases
run); check_dataset_for without check_shards (the changed-shard case reaches the launcher); launch's
time_limit without its field ranges (99:99, 1-24:00 and 1:60:00 are rendered); the advice of each ADVICE line
as it was ("choose a smaller model (e.g. --model gpt-tiny)", "try more devices", "lower pp or interleave", argparse's
"expected one argument" for -3T, "128," read as 128, a plan without a version trained, "--tp" for a plan file's key).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from exatrain.catalog import get_model
from exatrain.cli import main
from exatrain.plan import Measured, ParallelDims, Plan, RunRecord, TrainShape
from exatrain.records import append_run_record


def _unwritable() -> Path | None:
    """A directory this process cannot write in. Under root, permissions do not stop a write, so a
    read-only kernel directory (/proc/sys) stands in where there is one."""
    if os.geteuid() != 0:
        return None  # made per test with chmod (below)
    ro = Path("/proc/sys")
    return ro if ro.is_dir() and not os.access(ro, os.W_OK) else None


@pytest.fixture
def w(tmp_path: Path) -> dict[str, str]:
    """The world the cases point into: good inputs and each kind of bad one."""
    plan = Plan(
        model=get_model("gpt-tiny"),
        dims=ParallelDims(1, 1, 2),
        shape=TrainShape(1, 2),
        cluster="local-cpu",
        dtype="float32",
    ).validate()
    plan.save(tmp_path / "plan.json")
    wrong = plan.to_dict()
    wrong["tp"] = "two"
    (tmp_path / "wrong.json").write_text(json.dumps(wrong))
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "file.txt").write_text("a file\n")
    (tmp_path / "dir").mkdir()
    (tmp_path / "ds" / "ds_config.json").mkdir(parents=True)  # where deepspeed's second file would go
    append_run_record(tmp_path / "runs.jsonl", RunRecord(plan=plan, measured=Measured(5, 0.1, 320.0), device="cpu"))
    (tmp_path / "wrong_runs.jsonl").write_text(
        json.dumps(
            {
                "kind": "run_record",
                "plan": plan.to_dict(),
                "measured": {"steps": "five", "step_time_s": 0.1, "tokens_per_s": 1.0},
            }
        )
        + "\n"
    )
    (tmp_path / "wrong_cal.json").write_text(
        json.dumps({"kind": "exatrain-calibration", "devices": {"cpu": {"gemm_eff": "fast"}}})
    )
    (tmp_path / "wrong_model.json").write_text(
        json.dumps({"arch": "gpt", "layers": "many", "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 128})
    )
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "manifest.json").write_text("{not json")
    unversioned = plan.to_dict()
    del unversioned["version"]
    (tmp_path / "unversioned.json").write_text(json.dumps(unversioned))
    huge = plan.to_dict()
    huge["global_batch"] = 10**20  # beyond int64
    (tmp_path / "huge.json").write_text(json.dumps(huge))
    _changed_shard_dataset(tmp_path / "changed")
    ro = _unwritable()
    if ro is None and os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
    return {"tmp": str(tmp_path), "ro": str(ro) if ro else ""}


def _changed_shard_dataset(root: Path) -> None:
    """A byte-tokenized dataset whose second shard was overwritten after `prepare` with bytes of the same
    size and ids inside the vocabulary: only its sha256 tells."""
    import numpy as np

    from exatrain.data import tokenizer as tk
    from exatrain.data.prepare import Document, prepare

    root.mkdir()
    (root / "a.txt").write_text("".join(chr(97 + i % 26) for i in range(2000)), encoding="utf-8")
    prepare(
        [Document("a.txt", root / "a.txt")],
        root / "data",
        tokenizer_json=tk.byte_tokenizer_json(),
        separator=tk.byte_separator(),
        shard_tokens=600,
        quiet=True,
    )
    shard = root / "data" / "shard-00001.bin"
    ids = np.fromfile(shard, dtype="<u2")
    ids[:10] = ids[:10][::-1] + 1
    ids.tofile(shard)


TINY = ["--model", "gpt-tiny", "--cluster", "local-cpu"]
BEYOND = "1180591620717411303424"  # 2**70: beyond int64
SEARCH = [*TINY, "--gpus", "2", "--global-batch", "4"]
TUNE = ["tune", *SEARCH, "--study", "{tmp}/t.db", "--trials", "1"]
MISSING, DIR_FOR_FILE, FILE_FOR_DIR = "missing file", "directory for a file", "file for a directory"
UNWRITABLE = "unwritable"
MALFORMED, EMPTY, WRONG_TYPES, RANGE = "malformed JSON", "empty file", "wrong JSON types", "out of range"
EXISTING = "a folder that already holds files"

# (command, kind, argv, what the line says)
CASES = [
    ("estimate", MISSING, ["estimate", "--model-file", "{tmp}/nope.json"], "no such file"),
    ("estimate", DIR_FOR_FILE, ["estimate", *TINY, "--out", "{tmp}/dir"], "is a directory"),
    ("estimate", FILE_FOR_DIR, ["estimate", *TINY, "--out", "{tmp}/file.txt/p.json"], "is a file, not a directory"),
    ("estimate", UNWRITABLE, ["estimate", *TINY, "--out", "{ro}/p.json"], "cannot write in"),
    ("estimate", MALFORMED, ["estimate", "--model-file", "{tmp}/bad.json"], "not valid JSON"),
    ("estimate", EMPTY, ["estimate", *TINY, "--calibration", "{tmp}/empty.json"], "not valid JSON"),
    ("estimate", WRONG_TYPES, ["estimate", "--model-file", "{tmp}/wrong_model.json"], "layers must be a positive"),
    ("estimate", RANGE, ["estimate", *TINY, "--tp", "0"], "expected a positive integer"),
    ("estimate", RANGE, ["estimate", *TINY, "--gpus", BEYOND], "expected a positive integer of at most 1,000,000,000"),
    ("estimate", RANGE, ["estimate", *TINY, "--layers", "1e20"], "argument --layers: expected a positive integer"),
    (
        "estimate",
        RANGE,
        ["estimate", *TINY, "--layers", "10" + "0" * 20],
        "--layers: expected a positive integer of at most 1,000,000,000",
    ),
    (
        "search",
        MISSING,
        ["search", *SEARCH, "--cluster-file", "{tmp}/nope.toml", "--cluster", "local-cpu"],
        "either --cluster or --cluster-file",
    ),
    ("search", DIR_FOR_FILE, ["search", *SEARCH, "--out", "{tmp}/dir"], "is a directory"),
    ("search", UNWRITABLE, ["search", *SEARCH, "--out", "{ro}/best.json"], "cannot write in"),
    ("search", WRONG_TYPES, ["search", *SEARCH, "--calibration", "{tmp}/wrong_cal.json"], "must be a non-negative"),
    ("search", RANGE, ["search", *SEARCH, "--top", "0"], "--top must be at least 1"),
    (
        "search",
        RANGE,
        ["search", *TINY, "--gpus", "2", "--global-batch", "99999999999999999999"],
        "--global-batch: expected a positive integer of at most 1,000,000,000",
    ),
    ("search", RANGE, ["search", *SEARCH, "--top", BEYOND], "--top must be a positive integer of at most"),
    (
        "scaling",
        MISSING,
        ["scaling", *TINY, "--gpus", "2,4", "--global-batch", "4", "--calibration", "{tmp}/no.json"],
        "no such file",
    ),
    (
        "scaling",
        DIR_FOR_FILE,
        ["scaling", *TINY, "--gpus", "2,4", "--global-batch", "4", "--calibration", "{tmp}/dir"],
        "is a directory",
    ),
    (
        "scaling",
        MALFORMED,
        ["scaling", *TINY, "--gpus", "2,4", "--global-batch", "4", "--calibration", "{tmp}/bad.json"],
        "not valid JSON",
    ),
    ("scaling", RANGE, ["scaling", *TINY, "--gpus", "0,4", "--global-batch", "4"], "positive integers"),
    (
        "scaling",
        RANGE,
        ["scaling", *TINY, "--gpus", "128,1e20", "--global-batch", "4"],
        "expected comma-separated positive integers of at most 1,000,000,000",
    ),
    (
        "scaling",
        RANGE,
        ["scaling", *TINY, "--gpus", f"128,{BEYOND}", "--global-batch", "4"],
        "expected comma-separated positive integers of at most 1,000,000,000",
    ),
    (
        "scaling",
        RANGE,
        ["scaling", *TINY, "--gpus", "1,1000000", "--global-batch", "100000"],
        "weak scaling: 1000000 GPUs grow global batch 100000 to 100,000,000,000, beyond 1,000,000,000",
    ),
    ("train", MISSING, ["train", "--plan", "{tmp}/nope.json"], "no such file"),
    ("train", DIR_FOR_FILE, ["train", "--model", "gpt-tiny", "--metrics-file", "{tmp}/dir"], "is a directory"),
    (
        "train",
        FILE_FOR_DIR,
        ["train", "--model", "gpt-tiny", "--checkpoint-dir", "{tmp}/file.txt"],
        "is a file, not a directory",
    ),
    ("train", FILE_FOR_DIR, ["train", "--model", "gpt-tiny", "--data", "{tmp}/file.txt"], "is a file, not a directory"),
    ("train", FILE_FOR_DIR, ["train", "--model", "gpt-tiny", "--tensorboard", "{tmp}/file.txt"], "is a file"),
    ("train", UNWRITABLE, ["train", "--model", "gpt-tiny", "--checkpoint-dir", "{ro}/ckpt"], "not writable"),
    ("train", UNWRITABLE, ["train", "--model", "gpt-tiny", "--metrics-file", "{ro}/m.jsonl"], "cannot write in"),
    ("train", MALFORMED, ["train", "--plan", "{tmp}/bad.json"], "not valid JSON"),
    ("train", EMPTY, ["train", "--plan", "{tmp}/empty.json"], "not valid JSON"),
    (
        "train",
        WRONG_TYPES,
        ["train", "--plan", "{tmp}/wrong.json"],
        "wrong.json: tp must be a positive integer, got 'two'",
    ),
    ("train", RANGE, ["train", "--steps", "0"], "expected a positive integer"),
    ("train", RANGE, ["train", "--model", "gpt-tiny", "--lr", "-1"], "--lr must be positive"),
    ("train", RANGE, ["train", "--model", "gpt-tiny", "--min-lr-ratio", "2"], "--min-lr-ratio must be in [0, 1]"),
    ("train", RANGE, ["train", "--model", "gpt-tiny", "--grad-clip", "nan"], "--grad-clip: expected a finite number"),
    ("train", RANGE, ["train", "--model", "gpt-tiny", "--lr", "inf"], "--lr: expected a finite number"),
    ("train", RANGE, ["train", "--model", "gpt-tiny", "--weight-decay", "-0.1"], "--weight-decay must be >= 0"),
    ("train", RANGE, ["train", "--model", "gpt-tiny", "--gpus", BEYOND], "expected a positive integer of at most"),
    (
        "train",
        WRONG_TYPES,
        ["train", "--plan", "{tmp}/huge.json"],
        "huge.json: global_batch must be a positive integer of at most 1,000,000,000, got 100000000000000000000",
    ),
    (
        "train",
        RANGE,
        ["train", "--plan", "{tmp}/plan.json", "--gpus", "3"],
        "the plan's global batch 2 does not split over micro-batch x dp = 1 x 3: pass --global-batch",
    ),
    (
        "train",
        WRONG_TYPES,
        ["train", "--model", "gpt-tiny", "--data", "{tmp}/changed/data"],
        "changed/data/shard-00001.bin: shard is corrupted (its sha256 differs from the one dataset.json records",
    ),
    (
        "prepare",
        MISSING,
        ["prepare", "--input", "{tmp}/*.txt", "--tokenizer", "{tmp}/nope.json", "--out", "{tmp}/data"],
        "no such file",
    ),
    (
        "prepare",
        DIR_FOR_FILE,
        ["prepare", "--input", "{tmp}/*.txt", "--tokenizer", "{tmp}/dir", "--out", "{tmp}/data"],
        "is a directory",
    ),
    ("prepare", FILE_FOR_DIR, ["prepare", "--stdlib", "--out", "{tmp}/file.txt"], "is a file, not a directory"),
    ("prepare", FILE_FOR_DIR, ["prepare", "--verify", "{tmp}/file.txt"], "is a file, not a directory"),
    ("prepare", UNWRITABLE, ["prepare", "--stdlib", "--out", "{ro}/data"], "not writable"),
    (
        "prepare",
        MALFORMED,
        ["prepare", "--input", "{tmp}/*.txt", "--tokenizer", "{tmp}/bad.json", "--out", "{tmp}/data"],
        "not a Hugging Face tokenizer.json",
    ),
    (
        "prepare",
        EMPTY,
        ["prepare", "--input", "{tmp}/*.txt", "--tokenizer", "{tmp}/empty.json", "--out", "{tmp}/data"],
        "not a Hugging Face tokenizer.json",
    ),
    (
        "prepare",
        WRONG_TYPES,
        ["prepare", "--input", "{tmp}/*.txt", "--tokenizer", "{tmp}/wrong.json", "--out", "{tmp}/data"],
        "not a Hugging Face tokenizer.json",
    ),
    ("prepare", RANGE, ["prepare", "--stdlib", "--shard-tokens", "0", "--out", "{tmp}/data"], "positive integer"),
    ("export", MISSING, ["export", "--checkpoint", "{tmp}/nope", "--out", "{tmp}/hf"], "no such directory"),
    (
        "export",
        FILE_FOR_DIR,
        ["export", "--checkpoint", "{tmp}/file.txt", "--out", "{tmp}/hf"],
        "is a file, not a directory",
    ),
    (
        "export",
        FILE_FOR_DIR,
        ["export", "--checkpoint", "{tmp}/ckpt", "--out", "{tmp}/file.txt"],
        "is a file, not a directory",
    ),
    ("export", UNWRITABLE, ["export", "--checkpoint", "{tmp}/ckpt", "--out", "{ro}/hf"], "not writable"),
    ("export", MALFORMED, ["export", "--checkpoint", "{tmp}/ckpt", "--out", "{tmp}/hf"], "manifest.json"),
    (
        "export",
        RANGE,
        ["export", "--checkpoint", "{tmp}/ckpt", "--step", "-1", "--out", "{tmp}/hf"],
        "non-negative integer",
    ),
    (
        "export",
        RANGE,
        ["export", "--checkpoint", "{tmp}/ckpt", "--step", BEYOND, "--out", "{tmp}/hf"],
        "non-negative integer of at most 1,000,000,000",
    ),
    ("launch", MISSING, ["launch", "--plan", "{tmp}/nope.json", "--scheduler", "slurm"], "no such file"),
    (
        "launch",
        DIR_FOR_FILE,
        ["launch", "--plan", "{tmp}/plan.json", "--scheduler", "slurm", "--out", "{tmp}/dir"],
        "is a directory",
    ),
    (
        "launch",
        FILE_FOR_DIR,
        ["launch", "--plan", "{tmp}/plan.json", "--scheduler", "slurm", "--out", "{tmp}/file.txt/job.sh"],
        "is a file, not a directory",
    ),
    (
        "launch",
        UNWRITABLE,
        ["launch", "--plan", "{tmp}/plan.json", "--scheduler", "slurm", "--out", "{ro}/job.sh"],
        "cannot write in",
    ),
    ("launch", MALFORMED, ["launch", "--plan", "{tmp}/bad.json", "--scheduler", "slurm"], "not valid JSON"),
    ("launch", EMPTY, ["launch", "--plan", "{tmp}/empty.json", "--scheduler", "slurm"], "not valid JSON"),
    ("launch", WRONG_TYPES, ["launch", "--plan", "{tmp}/wrong.json", "--scheduler", "slurm"], "wrong.json: tp must be"),
    (
        "launch",
        RANGE,
        ["launch", "--plan", "{tmp}/plan.json", "--scheduler", "slurm", "--nodes", "0"],
        "expected a positive integer",
    ),
    (
        "launch",
        RANGE,
        ["launch", "--plan", "{tmp}/plan.json", "--scheduler", "slurm", "--time", "99:99"],
        "--time 99:99: 99 seconds in minutes:seconds (at most 59)",
    ),
    (
        "launch",
        RANGE,
        ["launch", "--plan", "{tmp}/plan.json", "--scheduler", "slurm", "--time", "1-24:00"],
        "--time 1-24:00: 24 hours in days-hours:minutes (at most 23)",
    ),
    (
        "launch",
        RANGE,
        ["launch", "--plan", "{tmp}/plan.json", "--scheduler", "slurm", "--time", "1:60:00"],
        "--time 1:60:00: 60 minutes in hours:minutes:seconds (at most 59)",
    ),
    ("export-config", MISSING, ["export-config", "--plan", "{tmp}/nope.json", "--for", "megatron"], "no such file"),
    ("export-config", DIR_FOR_FILE, ["export-config", "--plan", "{tmp}/dir", "--for", "megatron"], "is a directory"),
    (
        "export-config",
        DIR_FOR_FILE,
        ["export-config", "--plan", "{tmp}/plan.json", "--for", "deepspeed", "--out", "{tmp}/ds/ds_args.sh"],
        "ds_config.json: is a directory",
    ),
    (
        "export-config",
        UNWRITABLE,
        ["export-config", "--plan", "{tmp}/plan.json", "--for", "megatron", "--out", "{ro}/args.sh"],
        "cannot write in",
    ),
    ("export-config", MALFORMED, ["export-config", "--plan", "{tmp}/bad.json", "--for", "megatron"], "not valid JSON"),
    ("export-config", EMPTY, ["export-config", "--plan", "{tmp}/empty.json", "--for", "torchtitan"], "not valid JSON"),
    (
        "export-config",
        WRONG_TYPES,
        ["export-config", "--plan", "{tmp}/wrong.json", "--for", "megatron"],
        "wrong.json: tp must be",
    ),
    ("tune", MISSING, [*TUNE, "--calibration", "{tmp}/nope.json"], "no such file"),
    ("tune", DIR_FOR_FILE, [*TUNE, "--out", "{tmp}/dir"], "is a directory"),
    ("tune", DIR_FOR_FILE, ["tune", *SEARCH, "--study", "{tmp}/dir", "--trials", "1"], "is a directory"),
    ("tune", FILE_FOR_DIR, [*TUNE, "--runs-file", "{tmp}/file.txt/runs.jsonl"], "is a file, not a directory"),
    ("tune", UNWRITABLE, [*TUNE, "--out", "{ro}/best.json"], "cannot write in"),
    ("tune", MALFORMED, [*TUNE, "--calibration", "{tmp}/bad.json"], "not valid JSON"),
    ("tune", WRONG_TYPES, [*TUNE, "--calibration", "{tmp}/wrong_cal.json"], "must be a non-negative"),
    ("tune", RANGE, [*TUNE, "--prune-ratio", "2"], "--prune-ratio must be in [0, 1)"),
    ("tune", RANGE, [*TUNE, "--trials", "0"], "expected a positive integer"),
    ("tune", RANGE, [*TUNE, "--prune-ratio", "nan"], "--prune-ratio: expected a finite number"),
    (
        "tune",
        RANGE,
        ["tune", *TINY, "--gpus", BEYOND, "--global-batch", "4", "--study", "{tmp}/t.db"],
        "expected a positive integer of at most",
    ),
    ("report", MISSING, ["report", "--plan", "{tmp}/nope.json", "--out", "{tmp}/report"], "no such file"),
    ("report", DIR_FOR_FILE, ["report", "--plan", "{tmp}/dir", "--out", "{tmp}/report"], "is a directory"),
    (
        "report",
        FILE_FOR_DIR,
        ["report", "--plan", "{tmp}/plan.json", "--out", "{tmp}/file.txt"],
        "is a file, not a directory",
    ),
    ("report", UNWRITABLE, ["report", "--plan", "{tmp}/plan.json", "--out", "{ro}/report"], "not writable"),
    ("report", MALFORMED, ["report", "--search", "{tmp}/bad.json", "--out", "{tmp}/report"], "not valid JSON"),
    ("report", EMPTY, ["report", "--scaling", "{tmp}/empty.json", "--out", "{tmp}/report"], "not valid JSON"),
    (
        "report",
        WRONG_TYPES,
        ["report", "--plan", "{tmp}/wrong.json", "--out", "{tmp}/report"],
        "wrong.json: tp must be",
    ),
    ("demo", FILE_FOR_DIR, ["demo", "--out", "{tmp}/file.txt"], "is a file, not a directory"),
    ("demo", UNWRITABLE, ["demo", "--out", "{ro}/demo"], "not writable"),
    ("demo", EXISTING, ["demo", "--out", "{tmp}/ckpt"], "already holds files"),
    ("demo", RANGE, ["demo", "--out", "{tmp}/demo", "--ranks", "0"], "expected a positive integer"),
    ("demo", RANGE, ["demo", "--out", "{tmp}/demo", "--steps", "3"], "--steps must be an integer of at least 4"),
    ("bench", DIR_FOR_FILE, ["bench", "--out", "{tmp}/dir", "--quick"], "is a directory"),
    ("bench", FILE_FOR_DIR, ["bench", "--out", "{tmp}/file.txt/c.json", "--quick"], "is a file, not a directory"),
    ("bench", UNWRITABLE, ["bench", "--out", "{ro}/c.json", "--quick"], "cannot write in"),
    ("bench", RANGE, ["bench", "--out", "{tmp}/c.json", "--ranks", "0"], "expected a positive integer"),
    ("calibrate", MISSING, ["calibrate", "{tmp}/nope.jsonl", "--out", "{tmp}/c.json"], "no such file"),
    ("calibrate", DIR_FOR_FILE, ["calibrate", "{tmp}/runs.jsonl", "--out", "{tmp}/dir"], "is a directory"),
    (
        "calibrate",
        FILE_FOR_DIR,
        ["calibrate", "{tmp}/runs.jsonl", "--out", "{tmp}/file.txt/c.json"],
        "is a file, not a directory",
    ),
    ("calibrate", UNWRITABLE, ["calibrate", "{tmp}/runs.jsonl", "--out", "{ro}/c.json"], "cannot write in"),
    ("calibrate", MALFORMED, ["calibrate", "{tmp}/bad.json", "--out", "{tmp}/c.json"], "not a JSON line"),
    ("calibrate", EMPTY, ["calibrate", "{tmp}/empty.json", "--out", "{tmp}/c.json"], "no RunRecords"),
    (
        "calibrate",
        WRONG_TYPES,
        ["calibrate", "{tmp}/wrong_runs.jsonl", "--out", "{tmp}/c.json"],
        "measured steps must be a number",
    ),
    (
        "record",
        MISSING,
        ["record", "--plan", "{tmp}/nope.json", "--step-time", "1", "--cluster", "dgx-a100", "--out", "{tmp}/r.jsonl"],
        "no such file",
    ),
    (
        "record",
        MISSING,
        [
            "record",
            "--from",
            "{tmp}/nope.sh",
            "--log",
            "{tmp}/file.txt",
            "--cluster",
            "dgx-a100",
            "--out",
            "{tmp}/r.jsonl",
        ],
        "no such file",
    ),
    (
        "record",
        DIR_FOR_FILE,
        ["record", "--plan", "{tmp}/plan.json", "--step-time", "1", "--out", "{tmp}/dir"],
        "is a directory",
    ),
    (
        "record",
        MALFORMED,
        ["record", "--plan", "{tmp}/bad.json", "--step-time", "1", "--cluster", "dgx-a100", "--out", "{tmp}/r.jsonl"],
        "not valid JSON",
    ),
    (
        "record",
        EMPTY,
        ["record", "--plan", "{tmp}/empty.json", "--step-time", "1", "--cluster", "dgx-a100", "--out", "{tmp}/r.jsonl"],
        "not valid JSON",
    ),
    (
        "record",
        RANGE,
        ["record", "--plan", "{tmp}/plan.json", "--step-time", "0", "--out", "{tmp}/r.jsonl"],
        "expected a positive number",
    ),
    ("validate", MISSING, ["validate", "{tmp}/nope.jsonl"], "no such file"),
    ("validate", DIR_FOR_FILE, ["validate", "{tmp}/dir"], "is a directory"),
    ("validate", MALFORMED, ["validate", "{tmp}/runs.jsonl", "--calibration", "{tmp}/bad.json"], "not valid JSON"),
    ("validate", EMPTY, ["validate", "{tmp}/empty.json"], "no RunRecords"),
    ("validate", WRONG_TYPES, ["validate", "{tmp}/wrong_runs.jsonl"], "measured steps must be a number"),
]


# Refusals whose line once gave advice that did not fit the cause: (argv, what the line says, what it must not say)
ADVICE = [
    (["train", "--model", "gpt-tiny", "--dp", "1000000", "--steps", "1"], "use at most", "smaller model"),
    (
        ["search", "--model", "gpt-tiny", "--cluster", "frontier", "--gpus", "1000000000", "--global-batch", "8"],
        "try another device count",
        "more devices",
    ),
    (["estimate", *TINY, "--gpus", "100", "--pp", "100"], "lower pp to at most 4", "interleave"),
    (
        ["estimate", *TINY, "--pp", "2", "--gpus", "2", "--interleave", "3", "--schedule", "interleaved"],
        "lower interleave to at most 2",
        "lower pp",
    ),
    (["estimate", *TINY, "--tokens", "-3T"], "--tokens must be a whole number of tokens", "expected one argument"),
    (["scaling", *TINY, "--gpus", "128,", "--global-batch", "128"], "got '128,'", "Traceback"),
    (
        ["launch", "--plan", "{tmp}/unversioned.json", "--scheduler", "slurm"],
        "unversioned.json: no plan version",
        "Traceback",
    ),
    (["train", "--plan", "{tmp}/wrong.json"], "wrong.json: tp must be a positive integer", "--tp"),
    # paths as typed (relative here: the test runs in {tmp}), in a message on a file's contents and on its folder
    (["estimate", "--model-file", "bad.json"], "error: bad.json: not valid JSON", "/"),
    (["launch", "--plan", "wrong.json", "--scheduler", "slurm"], "error: wrong.json: tp must be", "/"),
    (
        ["estimate", *TINY, "--out", "file.txt/p.json"],
        "--out file.txt/p.json: file.txt is a file, not a directory",
        "/tmp",
    ),
]


@pytest.mark.parametrize("argv, says, not_said", ADVICE, ids=[" ".join(a[:1] + a[-4:]) for a, _, _ in ADVICE])
def test_the_advice_fits_the_cause(argv, says, not_said, w, capsys, monkeypatch) -> None:
    import importlib

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(importlib.import_module("exatrain.trainer.spawn"), "launch_local", lambda configs, **kw: None)
    monkeypatch.chdir(w["tmp"])
    assert main([a.format(**w) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and not_said not in err, err


def _tree(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime for p in root.rglob("*")}


@pytest.mark.parametrize(
    "command, kind, argv, needle", CASES, ids=[f"{c}: {k} {i}" for i, (c, k, _, _) in enumerate(CASES)]
)
def test_one_line_exit_2_nothing_written(command, kind, argv, needle, w, capsys, monkeypatch) -> None:
    if kind == UNWRITABLE and not w["ro"]:
        pytest.skip("running as root with no read-only directory: root writes through file permissions")
    import importlib

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    # a train case let through starts no rank: the launcher returns at once
    monkeypatch.setattr(importlib.import_module("exatrain.trainer.spawn"), "launch_local", lambda configs, **kw: None)
    monkeypatch.chdir(w["tmp"])  # anything written by default lands where it is seen
    root = Path(w["tmp"])
    before = _tree(root)
    code = main([a.format(**w) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2, (code, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert needle in err, err
    assert _tree(root) == before  # nothing written, nothing touched


def test_every_command_with_inputs_is_in_the_matrix() -> None:
    from exatrain.cli import build_parser

    parser = build_parser()
    commands = set(next(a for a in parser._actions if a.dest == "command").choices)
    covered = {c for c, *_ in CASES}
    assert commands - covered == {"models", "hardware"}
    for command in covered - {"validate", "bench", "scaling", "search"}:
        kinds = {k for c, k, *_ in CASES if c == command}
        assert {MISSING, RANGE} & kinds or {MISSING, MALFORMED} <= kinds, command


# The Python API refuses the same values as the CLI, with a one-line UserError, before any work.
B = 2**70
API_CASES = [
    (
        "estimate",
        dict(model="gpt-tiny", cluster="local-cpu", gpus=B),
        "--gpus must be a positive integer of at most 1,000,000,000, got 1180591620717411303424",
    ),
    ("estimate", dict(model="gpt-tiny", cluster="local-cpu", gpus=2, global_batch=10**20), "--global-batch must be"),
    ("estimate", dict(model="gpt-tiny", cluster="local-cpu", gpus=2, layers=10**20), "--layers must be a positive"),
    ("estimate", dict(model="gpt-tiny", cluster="local-cpu", gpus=2, layers=1e20), "layers must be a positive integer"),
    ("search", dict(model="gpt-tiny", cluster="local-cpu", gpus=B, global_batch=4), "--gpus must be"),
    ("search", dict(model="gpt-tiny", cluster="local-cpu", gpus=2, global_batch=10**20), "--global-batch must be"),
    ("scaling", dict(model="gpt-tiny", cluster="local-cpu", gpus=(128, 10**20), global_batch=4), "--gpus must be"),
    ("make_plan", dict(model="gpt-tiny", cluster="local-cpu", gpus=B), "--gpus must be"),
    ("make_plan", dict(model="gpt-tiny", cluster="local-cpu", tp=1, dp=2, micro_batch=B), "--micro-batch must be"),
    ("train", dict(model="gpt-tiny", gpus=B), "--gpus must be"),
    ("train", dict(model="gpt-tiny", grad_clip=float("nan")), "--grad-clip must be a finite number, got nan"),
    ("train", dict(model="gpt-tiny", lr=float("inf")), "--lr must be a finite number, got inf"),
    ("train", dict(model="gpt-tiny", weight_decay=float("-inf")), "--weight-decay must be a finite number"),
    ("train", dict(model="gpt-tiny", lr=-1e-3), "--lr must be positive"),
    ("tune", dict(model="gpt-tiny", gpus=B, global_batch=4, study="{tmp}/t.db"), "--gpus must be"),
    (
        "tune",
        dict(model="gpt-tiny", gpus=2, global_batch=4, prune_ratio=float("nan"), study="{tmp}/t.db"),
        "--prune-ratio must be in [0, 1)",
    ),
    ("launch", dict(plan="{tmp}/plan.json", scheduler="slurm", nodes=B), "--nodes must be"),
    ("launch", dict(plan="{tmp}/plan.json", scheduler="slurm", time="99:99"), "99 seconds in minutes:seconds"),
    ("export_model", dict(checkpoint="{tmp}/ckpt", out="{tmp}/hf", step=B), "--step must be"),
]


@pytest.mark.parametrize("call, kwargs, needle", API_CASES, ids=[f"{c} {i}" for i, (c, _, _) in enumerate(API_CASES)])
def test_the_api_refuses_the_same_values_in_one_line(call, kwargs, needle, w, monkeypatch) -> None:
    from exatrain import api
    from exatrain.errors import UserError

    import importlib

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    # a value let through would start no rank: the launcher records nothing and returns
    monkeypatch.setattr(importlib.import_module("exatrain.trainer.spawn"), "launch_local", lambda configs, **kw: None)
    monkeypatch.chdir(w["tmp"])
    root = Path(w["tmp"])
    before = _tree(root)
    kwargs = {k: v.format(**w) if isinstance(v, str) else v for k, v in kwargs.items()}
    with pytest.raises(UserError) as exc:
        getattr(api, call)(**kwargs)
    assert needle in str(exc.value) and "\n" not in str(exc.value), str(exc.value)
    assert _tree(root) == before
