"""Checkpoints read as untrusted input: each case crafts a bad checkpoint and recomputes its sha256
manifest so that the hashes match, then checks that naming it is one line and exit status 2, that
``--resume auto`` and ``export`` fall back to the previous good checkpoint saying which one they
skipped and why (one line each), and that nothing was deleted that should not be. Unfinished saves
(``.tmp-step-*`` directories or links) are reported, then removed by the next save without following
a link.

Checkpoints come from a one-rank run in this process (gloo, world size 1), as in test_recovery.py."""

from __future__ import annotations

import importlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch

from exatrain.catalog import get_model
from exatrain.cli import main
from exatrain.data.dataset import sha256_file
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.trainer.checkpoint import files
from exatrain.trainer.checkpoint.files import CheckpointError
from exatrain.trainer.config import TrainConfig
from exatrain.trainer.train import Trainer

ARGS = ["--model", "gpt-tiny", "--tp", "1", "--pp", "1", "--dp", "1", "--micro-batch", "2", "--global-batch", "4"]
NEWEST, GOOD = "step-00000003", "step-00000002"


def plan() -> Plan:
    return Plan(
        model=get_model("gpt-tiny"), dims=ParallelDims(), shape=TrainShape(2, 4), dtype="float32", cluster="local-cpu"
    ).validate()


@pytest.fixture(scope="module")
def saved(one_rank: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Checkpoints after steps 2 and 3 of gpt-tiny (on the default data)."""
    root = tmp_path_factory.mktemp("saved") / "ckpt"
    Trainer(TrainConfig(plan=plan(), steps=3, quiet=True, checkpoint_dir=str(root), save_every=1, keep_last=2)).run()
    return root


@pytest.fixture
def ckpt(saved: Path, tmp_path: Path) -> Path:
    shutil.copytree(saved, tmp_path / "ckpt")
    return tmp_path / "ckpt"


# ---- crafting ------------------------------------------------------------------------------------
def rehash(d: Path, manifest: Callable[[dict], None] | None = None) -> None:
    """Recompute manifest.json for the files it lists (and any it does not yet), then let ``manifest``
    edit the result: a crafted checkpoint whose hashes all match."""
    raw = json.loads((d / files.MANIFEST).read_text())
    names = set(raw["files"]) | {f.name for f in d.iterdir() if f.is_file() and f.name != files.MANIFEST}
    raw["files"] = {
        n: {"bytes": (d / n).stat().st_size, "sha256": sha256_file(d / n)} for n in sorted(names) if (d / n).is_file()
    }
    if manifest is not None:
        manifest(raw)
    (d / files.MANIFEST).write_text(json.dumps(raw))


def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))


def edit_table(d: Path, change: Callable[[dict], None]) -> None:
    edit_json(d / files.METADATA, lambda raw: change(raw["tensors"]))


def rewrite_tensor(d: Path, key: str, value: torch.Tensor) -> None:
    """Store ``value`` as chunk ``key`` of __0.safetensors (the caller edits metadata.json to match)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(d / "__0.safetensors"))
    tensors[key] = value.contiguous()
    save_file(tensors, str(d / "__0.safetensors"))


def first_param(table: dict) -> str:
    return next(k for k in table if k.startswith("model."))


def wq_shape(d: Path) -> None:
    """A parameter stored (table and file alike) with another shape than the plan's model has."""
    name = "model.layers.0.attn.wq.weight"
    entry = json.loads((d / files.METADATA).read_text())["tensors"][name]
    key = entry["chunks"][0]["key"]
    rewrite_tensor(d, key, torch.zeros(32, 64))

    def change(t: dict) -> None:
        t[name]["size"] = [32, 64]
        t[name]["chunks"][0]["sizes"] = [32, 64]

    edit_table(d, change)


def wq_dtype(d: Path) -> None:
    name = "model.layers.0.attn.wq.weight"
    entry = json.loads((d / files.METADATA).read_text())["tensors"][name]
    rewrite_tensor(d, entry["chunks"][0]["key"], torch.zeros(entry["size"], dtype=torch.float64))
    edit_table(d, lambda t: t[name].update(dtype="float64"))


def unknown_tensor(d: Path, key: str) -> None:
    rewrite_tensor(d, f"{key}@0", torch.zeros(4))
    edit_table(
        d,
        lambda t: t.__setitem__(
            key,
            {
                "dtype": "float32",
                "size": [4],
                "chunks": [{"offsets": [0], "sizes": [4], "file": "__0.safetensors", "key": f"{key}@0"}],
            },
        ),
    )


def chunk_file(name: str) -> Callable[[Path], None]:
    def craft(d: Path) -> None:
        edit_table(d, lambda t: t[first_param(t)]["chunks"][0].update(file=name))

    return craft


def header_garbage(d: Path) -> None:
    data = bytearray((d / "__0.safetensors").read_bytes())
    data[:8] = (2**40).to_bytes(8, "little")
    (d / "__0.safetensors").write_bytes(bytes(data))


def link_outside(d: Path) -> None:
    outside = d.parent.parent / "outside.safetensors"
    shutil.copyfile(d / "__0.safetensors", outside)
    (d / "__0.safetensors").unlink()
    (d / "__0.safetensors").symlink_to(outside)


# id -> (craft the newest checkpoint's files, or None; edit its rehashed manifest, or None; the reason named)
CRAFTED: dict[str, tuple[Callable[[Path], None] | None, Callable[[dict], None] | None, str]] = {
    "manifest entries are not objects": (
        None,
        lambda m: m["files"].update({"trainer.json": "abc"}),
        "manifest.json entry 'trainer.json' is not an object with bytes and sha256",
    ),
    "manifest entry a list": (
        None,
        lambda m: m["files"].update({"metadata.json": [1, 2]}),
        "manifest.json entry 'metadata.json' is not an object",
    ),
    "manifest names ..": (
        None,
        lambda m: m["files"].update({"..": {"bytes": 4096, "sha256": "0" * 64}}),
        "manifest.json names a file outside the checkpoint ('..')",
    ),
    "manifest names an absolute path": (
        None,
        lambda m: m["files"].update({"/etc/hostname": {"bytes": 1, "sha256": "0" * 64}}),
        "names a file outside the checkpoint ('/etc/hostname')",
    ),
    "manifest step a string": (None, lambda m: m.update(step="3"), "manifest.json step is str"),
    "manifest step another directory's": (
        None,
        lambda m: m.update(step=2),
        "manifest.json is of step 2, not of the step its name says",
    ),
    "trainer.json without plan": (
        lambda d: edit_json(d / "trainer.json", lambda t: t.pop("plan")),
        None,
        "trainer.json field 'plan' is missing, not dict",
    ),
    "trainer.json plan malformed": (
        lambda d: edit_json(d / "trainer.json", lambda t: t["plan"].update(tp="two")),
        None,
        "trainer.json: plan: tp must be a positive integer, got 'two'",
    ),
    "trainer.json plan of unknown keys": (
        lambda d: edit_json(d / "trainer.json", lambda t: t["plan"].update(x=1)),
        None,
        "trainer.json: plan: unknown plan key(s) x",
    ),
    "trainer.json separator id a string": (
        lambda d: edit_json(d / "trainer.json", lambda t: t.update(separator_id="0")),
        None,
        "field 'separator_id' is str",
    ),
    "trainer.json layout disagrees with its plan": (
        lambda d: edit_json(d / "trainer.json", lambda t: t.update(layout={"tp": 2, "pp": 1, "dp": 1})),
        None,
        "layout, seq_len or global batch disagree with its plan",
    ),
    "chunk file ..": (
        chunk_file(".."),
        None,
        "names a file that is not one of the checkpoint's safetensors files ('..')",
    ),
    "chunk file escapes": (chunk_file("../step-00000002/__0.safetensors"), None, "names a file that is not one of"),
    "chunk file is the metadata": (chunk_file("metadata.json"), None, "names a file that is not one of"),
    "unknown tensor key": (
        lambda d: unknown_tensor(d, "evil"),
        None,
        "holds tensor 'evil', which no exatrain checkpoint has",
    ),
    "unknown parameter": (
        lambda d: unknown_tensor(d, "model.layers.9.attn.wq.weight"),
        None,
        "it has layers.9.attn.wq.weight, which gpt-tiny lacks",
    ),
    "unknown optimizer state": (
        lambda d: unknown_tensor(d, "optim.norm.weight.momentum"),
        None,
        "holds tensor 'optim.norm.weight.momentum', which is not a state",
    ),
    "wrong size in the table only": (
        lambda d: edit_table(d, lambda t: t["model.norm.weight"].update(size=[65])),
        None,
        "its chunks do not tile its size [65]",
    ),
    "wrong chunk shape in the table only": (
        lambda d: edit_table(d, lambda t: t["model.norm.weight"]["chunks"][0].update(sizes=[32])),
        None,
        "holds chunk 'model.norm.weight@0' as F32 [64], not F32 [32]",
    ),
    "wrong shape everywhere": (wq_shape, None, "layers.0.attn.wq.weight is [32, 64] there but [64, 64] in gpt-tiny"),
    "wrong dtype everywhere": (wq_dtype, None, "model.layers.0.attn.wq.weight is float64 [64, 64], not float32"),
    "wrong dtype in the table only": (
        lambda d: edit_table(d, lambda t: t["model.norm.weight"].update(dtype="int32")),
        None,
        "as F32 [64], not I32 [64]",
    ),
    "chunk outside its tensor": (
        lambda d: edit_table(d, lambda t: t["model.norm.weight"]["chunks"][0].update(offsets=[10])),
        None,
        "has a chunk outside its size",
    ),
    "safetensors header garbage": (header_garbage, None, "__0.safetensors is not a safetensors file"),
    "a listed file is a link": (link_outside, None, "__0.safetensors is not a regular file"),
    "metadata nested too deeply": (
        lambda d: (d / files.METADATA).write_text("[" * 100_000 + "]" * 100_000),
        None,
        "metadata.json is unreadable (nested too deeply)",
    ),
}


def craft(ckpt: Path, case: str) -> Path:
    files_craft, manifest_edit, _ = CRAFTED[case]
    d = ckpt / NEWEST
    if files_craft is not None:
        files_craft(d)
    rehash(d, manifest_edit)
    return d


def snapshot(root: Path) -> dict[str, int]:
    """Every path under ``root`` (links not followed) with its size."""
    return {str(p.relative_to(root)): p.lstat().st_size for p in root.rglob("*")}


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> list[TrainConfig]:
    """The launcher records the configs it was given instead of starting ranks."""
    started: list[TrainConfig] = []
    module = importlib.import_module("exatrain.trainer.spawn")
    monkeypatch.setattr(module, "launch_local", lambda configs, **kw: started.extend(configs))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    return started


# ---- the cases -----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(CRAFTED))
def test_a_crafted_checkpoint_is_one_line_and_skipped_for_the_previous_one(
    case: str, ckpt: Path, tmp_path: Path
) -> None:
    bad = craft(ckpt, case)
    reason = CRAFTED[case][2]
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError) as exc:
        files.resolve(str(bad), None)
    assert reason in str(exc.value) and "\n" not in str(exc.value), str(exc.value)
    warnings: list[str] = []
    found = files.resolve("auto", str(ckpt), warn=warnings.append)
    assert found is not None and found.path == ckpt / GOOD
    assert len(warnings) == 1 and warnings[0].startswith("skipping checkpoint ") and NEWEST in warnings[0]
    assert reason in warnings[0], warnings[0]
    assert snapshot(tmp_path) == before  # nothing deleted, nothing written


CLI_CASES = [
    "manifest entries are not objects",
    "trainer.json without plan",
    "chunk file ..",
    "unknown tensor key",
    "wrong shape everywhere",
    "safetensors header garbage",
]


@pytest.mark.parametrize("case", CLI_CASES)
def test_export_falls_back_and_naming_the_bad_one_is_exit_2(
    case: str, ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    bad = craft(ckpt, case)
    before = snapshot(ckpt)
    assert main(["export", "--checkpoint", str(bad), "--out", str(tmp_path / "named")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and CRAFTED[case][2] in err, err
    assert not (tmp_path / "named").exists() and not list(tmp_path.glob(".named.tmp-*"))
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(tmp_path / "hf")]) == 0
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and NEWEST in lines[0] and CRAFTED[case][2] in lines[0], out.err
    assert str(ckpt / GOOD) in out.out
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert snapshot(ckpt) == before


@pytest.mark.parametrize("case", CLI_CASES)
def test_train_resume_auto_falls_back_and_a_named_one_is_exit_2(
    case: str, ckpt: Path, no_launch: list, capsys: pytest.CaptureFixture
) -> None:
    bad = craft(ckpt, case)
    before = snapshot(ckpt)
    assert main(["train", *ARGS, "--steps", "5", "--resume", str(bad), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and CRAFTED[case][2] in err, err
    assert no_launch == []
    assert main(["train", *ARGS, "--steps", "5", "--checkpoint-dir", str(ckpt), "--resume", "auto", "--quiet"]) == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "skipping checkpoint" in lines[0] and NEWEST in lines[0], lines
    (cfg,) = no_launch
    assert cfg.resume_from == str(ckpt / GOOD)
    assert snapshot(ckpt) == before


def test_unfinished_saves_are_reported_then_removed_without_following_links(
    ckpt: Path, tmp_path: Path, one_rank: None, capsys: pytest.CaptureFixture
) -> None:
    """A ``.tmp-step-*`` link to a directory elsewhere (the step the resumed run saves next) and a
    real ``.tmp-step-*`` directory: ``--resume auto`` names both and keeps them; the run's first
    save removes both (the link, not what it points to) and publishes its own checkpoint."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_text("not a checkpoint")
    link = ckpt / files.tmp_dir_name(4)
    link.symlink_to(elsewhere, target_is_directory=True)
    stale = ckpt / files.tmp_dir_name(9)
    stale.mkdir()
    (stale / "__0.safetensors").write_bytes(b"half")
    warnings: list[str] = []
    manifest = files.resolve("auto", str(ckpt), warn=warnings.append)
    assert manifest is not None and manifest.path == ckpt / NEWEST
    assert warnings == [
        f"ignoring unfinished checkpoint save {link} (the next save into {ckpt} removes it)",
        f"ignoring unfinished checkpoint save {stale} (the next save into {ckpt} removes it)",
    ]
    assert link.is_symlink() and stale.is_dir()
    Trainer(
        TrainConfig(plan=plan(), steps=4, quiet=True, checkpoint_dir=str(ckpt), resume_from=str(manifest.path))
    ).run()
    err = [x for x in capsys.readouterr().err.splitlines() if "unfinished" in x]
    assert err == [f"removed unfinished checkpoint save {link}", f"removed unfinished checkpoint save {stale}"]
    assert not os.path.lexists(link) and not stale.exists()
    assert (elsewhere / "precious.txt").read_text() == "not a checkpoint"
    assert files.verify(ckpt / files.step_dir_name(4)).step == 4
    assert [s for s, _ in files.list_checkpoints(ckpt)] == [4, 3, 2]


def test_pruning_never_deletes_through_a_link(ckpt: Path, tmp_path: Path, one_rank: None) -> None:
    """keep_last removes old checkpoint directories; a step-* link (a checkpoint kept elsewhere) is
    the user's: neither it nor its target is pruned."""
    kept = tmp_path / "kept"
    shutil.copytree(ckpt / GOOD, kept)
    (ckpt / "step-00000001").symlink_to(kept, target_is_directory=True)
    Trainer(
        TrainConfig(
            plan=plan(), steps=4, quiet=True, checkpoint_dir=str(ckpt), keep_last=1, resume_from=str(ckpt / NEWEST)
        )
    ).run()
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-00000001", "step-00000004"]
    assert (ckpt / "step-00000001").is_symlink() and files.verify(kept).step == 2


def test_the_previous_checkpoint_is_not_deleted_when_the_newest_is_bad(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A checkpoint root holding only unusable checkpoints: export says so in one line, deletes nothing."""
    craft(ckpt, "manifest entries are not objects")
    edit_json(ckpt / GOOD / files.MANIFEST, lambda m: m["files"].update({"metadata.json": None}))
    before = snapshot(ckpt)
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(tmp_path / "hf")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and lines[-1].endswith(f"error: {ckpt}: no complete checkpoint here"), lines
    assert all("warning: skipping checkpoint" in x and "warning: warning" not in x for x in lines[:2])
    assert snapshot(ckpt) == before and not (tmp_path / "hf").exists()


def test_resume_auto_with_every_checkpoint_unusable_says_it_starts_from_step_1(
    ckpt: Path, no_launch: list, capsys: pytest.CaptureFixture
) -> None:
    """--resume auto over a folder whose checkpoints are all unusable: one warning per checkpoint (why), each
    once prefixed, then one line saying the run starts from step 1; the run starts fresh and nothing is deleted.
    Seen to fail with files.newest_complete's skip line carrying its own 'warning: ' again (the CLI printed
    'warning: warning: skipping checkpoint ...')."""
    craft(ckpt, "manifest entries are not objects")
    edit_json(ckpt / GOOD / files.MANIFEST, lambda m: m["files"].update({"metadata.json": None}))
    before = snapshot(ckpt)
    assert main(["train", *ARGS, "--steps", "5", "--checkpoint-dir", str(ckpt), "--resume", "auto", "--quiet"]) == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(x.startswith("exatrain train: warning: ") for x in lines), lines
    assert not any("warning: warning" in x for x in lines), lines
    assert "skipping checkpoint" in lines[0] and NEWEST in lines[0] and GOOD in lines[1], lines
    assert lines[2] == (
        f"exatrain train: warning: no usable checkpoint in {ckpt} (2 skipped, each named above with "
        "why), starting from step 1"
    ), lines
    (cfg,) = no_launch
    assert cfg.resume_from is None
    assert snapshot(ckpt) == before


def test_an_empty_checkpoint_folder_is_a_first_run_without_a_word(
    tmp_path: Path, no_launch: list, capsys: pytest.CaptureFixture
) -> None:
    """A requeue-safe job's first run: --resume auto over a folder with no checkpoint starts quietly."""
    (tmp_path / "ckpt").mkdir()
    assert (
        main(
            ["train", *ARGS, "--steps", "5", "--checkpoint-dir", str(tmp_path / "ckpt"), "--resume", "auto", "--quiet"]
        )
        == 0
    )
    assert capsys.readouterr().err == ""
    assert [c.resume_from for c in no_launch] == [None]
