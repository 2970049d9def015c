"""Files in, files out: ``prepare`` (text -> tokenizer -> token shards), ``verify_dataset``,
``export_model`` (checkpoint -> Hugging Face) and ``report`` (pictures and an index.html).

Each checks the paths it reads and writes before any work, and writes aside then renames.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from exatrain.api.requests import TokenizeOptions, coerce, routed
from exatrain.errors import UserError
from exatrain.limits import check_counts
from exatrain.paths import check_input_dir, check_input_file, check_output_dir

DEFAULT_SEPARATOR = "<|endoftext|>"


def prepare(
    out: str | Path,
    input: Sequence[str] = (),
    *,
    stdlib: bool = False,
    builtin: bool = False,
    tokenize: TokenizeOptions | None = None,
    quiet: bool = False,
    **pins: Any,
):
    """Tokenize the files matching ``input`` globs (each file one document) with a Hugging Face
    ``tokenize.tokenizer`` (tokenizer.json) or a byte-level BPE of ``tokenize.train_tokenizer`` ids trained on
    them, or, with the byte tokenizer, the built-in corpus that ``train`` uses without data (``builtin``) or this
    Python's standard library source (``stdlib``), into token shards and dataset.json in ``out`` (new or empty).
    Returns the DatasetMeta. The tokenize fields may be given flat by name (``prepare("data/", ["*.txt"],
    train_tokenizer=32000)``)."""
    t = routed("prepare", pins, {"tokenize": coerce(TokenizeOptions, tokenize, "")})
    if t["settings"]:
        raise TypeError(f"prepare() got an unexpected keyword argument {next(iter(t['settings']))!r}")
    tok = t["tokenize"]
    tokenizer, train_tokenizer, separator, shard_tokens = (
        tok.tokenizer,
        tok.train_tokenizer,
        tok.separator,
        tok.shard_tokens,
    )
    from exatrain.data import prepare as prep

    check_output_dir(out, "--out")
    kw: dict = {"quiet": quiet}
    if shard_tokens is not None:
        kw["shard_tokens"] = shard_tokens
    if stdlib and builtin:
        raise UserError("give either --builtin or --stdlib, not both")
    if stdlib or builtin:
        flag, what = ("--stdlib", "this Python's standard library") if stdlib else ("--builtin", "the built-in corpus")
        if input or tokenizer or train_tokenizer or separator:
            raise UserError(
                f"{flag} uses the byte tokenizer over {what}; drop --input/--tokenizer/--train-tokenizer/--separator"
            )
        return prep.prepare_stdlib(out, **kw) if stdlib else prep.prepare_builtin(out, **kw)
    if not input:
        raise UserError("give --input GLOB (repeatable), --builtin or --stdlib")
    if tokenizer is not None and train_tokenizer is not None:
        raise UserError("give either --tokenizer or --train-tokenizer, not both")
    if tokenizer is None and train_tokenizer is None:
        raise UserError("give --tokenizer tokenizer.json or --train-tokenizer VOCAB")
    tokenizer_json = None
    if tokenizer is not None:
        from exatrain.data import tokenizer as tk

        tk.load(str(check_input_file(tokenizer, "--tokenizer")))  # a readable tokenizer, or one line
        tokenizer_json = Path(tokenizer).read_text(encoding="utf-8")
    docs = prep.find_documents(list(input))
    return prep.prepare(
        docs,
        out,
        tokenizer_json=tokenizer_json,
        train_vocab=train_tokenizer,
        separator=separator or DEFAULT_SEPARATOR,
        sources={"inputs": list(input)},
        **kw,
    )


def verify_dataset(path: str | Path):
    """Recompute every shard's sha256 of a prepared dataset against its dataset.json (DatasetMeta)."""
    from exatrain.data import dataset

    return dataset.verify(check_input_dir(path, "--verify"))


def export_model(*, checkpoint: str | Path, out: str | Path, step: int | None = None, format: str = "hf") -> Path:
    """A checkpoint of any layout (or the newest complete one under a checkpoint folder; ``step``:
    that step's) as a Hugging Face model in ``out`` (new or empty). Returns the checkpoint used."""
    if format != "hf":
        raise UserError(f"--format must be hf, got {format!r}")
    check_counts({"step": step})
    check_input_dir(checkpoint, "--checkpoint")
    check_output_dir(out, "--out")
    from exatrain.trainer.hf_export import export_hf

    return export_hf(checkpoint, out, step=step)


def report(
    *,
    out: str | Path = "report",
    plan: Sequence[str | Path] = (),
    search: Sequence[str | Path] = (),
    scaling: Sequence[str | Path] = (),
    runs: Sequence[str | Path] = (),
    calibration: str | Path | None = None,
    cluster: str | None = None,
    cluster_file: str | Path | None = None,
):
    """PNGs and an index.html in ``out`` from plan files (or `estimate --json`), `search --json`,
    `scaling --json` and runs files. Returns (index.html's path, the sections)."""
    from exatrain.report import inputs as rin

    if not (plan or search or scaling or runs):
        raise UserError("nothing to report: give at least one of --plan, --search, --scaling, --runs")
    for flag, paths in (("--plan", plan), ("--search", search), ("--scaling", scaling), ("--runs", runs)):
        for path in paths:
            check_input_file(path, flag)
    check_output_dir(out, "--out")
    if cluster is not None and cluster_file is not None:
        raise UserError("give either --cluster or --cluster-file, not both")
    from exatrain.catalog import get_cluster, load_cluster_file
    from exatrain.report.build import ReportInputs, write_report

    cal = {}
    if calibration is not None:
        from exatrain.planner.cost.coefficients import load_calibration

        cal = load_calibration(check_input_file(calibration, "--calibration"))
    c = (
        get_cluster(cluster)
        if cluster
        else load_cluster_file(check_input_file(cluster_file, "--cluster-file"))
        if cluster_file
        else None
    )
    inputs = ReportInputs(
        plans=tuple(rin.read_plan(x) for x in plan),
        searches=tuple(rin.read_search(x) for x in search),
        scalings=tuple(rin.read_scaling(x) for x in scaling),
        runs=tuple(rin.read_runs(x) for x in runs),
        cluster=c,
        calibration=cal,
    )
    return write_report(inputs, out)


__all__ = ["export_model", "prepare", "report", "verify_dataset"]
