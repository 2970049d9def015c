"""Recovery without spawning ranks: finding the newest complete checkpoint, reporting broken ones,
refusing checkpoints and data that do not fit, the NaN policy, and loading without unpickling.

Checkpoints come from a one-rank run in this process (gloo, world size 1)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exatrain.catalog import get_model
from exatrain.cli import main
from exatrain.errors import TrainingStopped
from exatrain.plan import ParallelDims, Plan, TrainShape
from exatrain.records import read_run_records
from exatrain.trainer import spawn
from exatrain.trainer.checkpoint import files
from exatrain.trainer.checkpoint.files import CheckpointError
from exatrain.trainer.checkpoint.storage import read_full
from exatrain.trainer.config import TrainConfig
from exatrain.trainer.train import Trainer

ARGS = ["--model", "gpt-tiny", "--tp", "1", "--pp", "1", "--dp", "1", "--micro-batch", "2", "--global-batch", "4"]


def plan() -> Plan:
    return Plan(
        model=get_model("gpt-tiny"), dims=ParallelDims(), shape=TrainShape(2, 4), dtype="float32", cluster="local-cpu"
    ).validate()


@pytest.fixture(scope="module")
def saved(one_rank: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Checkpoints after steps 1, 2 and 3 of gpt-tiny (on the default data)."""
    root = tmp_path_factory.mktemp("saved") / "ckpt"
    Trainer(TrainConfig(plan=plan(), steps=3, quiet=True, checkpoint_dir=str(root), save_every=1)).run()
    return root


@pytest.fixture
def ckpt(saved: Path, tmp_path: Path) -> Path:
    """A copy of the saved checkpoints that a test may damage."""
    shutil.copytree(saved, tmp_path / "ckpt")
    return tmp_path / "ckpt"


def flip_byte(path: Path, at: int = 200) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_auto_takes_the_newest_and_reports_a_corrupted_one(ckpt: Path) -> None:
    assert files.resolve("auto", str(ckpt)).step == 3
    flip_byte(ckpt / "step-00000003" / "__0.safetensors")
    warnings: list[str] = []
    found = files.resolve("auto", str(ckpt), warn=warnings.append)
    assert found is not None and found.step == 2
    assert len(warnings) == 1 and "step-00000003" in warnings[0] and "__0.safetensors is corrupted" in warnings[0]
    with pytest.raises(CheckpointError, match="step-00000003: __0.safetensors is corrupted"):
        files.resolve(str(ckpt / "step-00000003"), None)


def test_a_missing_manifest_or_a_truncated_file_is_named(ckpt: Path) -> None:
    (ckpt / "step-00000003" / "manifest.json").unlink()  # what a crash before publication leaves
    with pytest.raises(CheckpointError, match="step-00000003: no manifest.json: the checkpoint is incomplete"):
        files.verify(ckpt / "step-00000003")
    meta = ckpt / "step-00000002" / "metadata.json"
    meta.write_bytes(meta.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="step-00000002: metadata.json is truncated"):
        files.verify(ckpt / "step-00000002", hashes=False)
    warnings: list[str] = []
    assert files.resolve("auto", str(ckpt), warn=warnings.append).step == 1
    assert len(warnings) == 2
    (ckpt / ".tmp-step-00000004").mkdir()  # a save a crash interrupted is never considered
    assert [s for s, _ in files.list_checkpoints(ckpt)] == [3, 2, 1]
    assert files.resolve("auto", str(ckpt.parent / "empty")) is None  # a first run starts fresh


def test_load_reads_no_pickle(ckpt: Path, one_rank: None, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("torch.load (unpickling) called while loading a checkpoint")

    monkeypatch.setattr(torch, "load", refuse)
    trainer = Trainer(TrainConfig(plan=plan(), steps=3, quiet=True, resume_from=str(ckpt / "step-00000002")))
    stored = read_full(ckpt / "step-00000002", prefix="model.")
    params = {name: p for name, p in trainer.pm.inner[0].named_parameters()}
    assert set(stored) == set(params)
    assert all(torch.equal(stored[n], params[n].detach()) for n in stored)
    assert trainer.start_step == 2 and trainer.order.consumed(2) == 8
    for f in (ckpt / "step-00000002").iterdir():  # every file is JSON or safetensors (an 8-byte length + JSON header)
        head = f.read_bytes()
        if f.suffix == ".json":
            json.loads(head)
        else:
            assert f.suffix == ".safetensors"
            n = int.from_bytes(head[:8], "little")
            json.loads(head[8 : 8 + n])


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> list[TrainConfig]:
    started: list[TrainConfig] = []
    monkeypatch.setattr(spawn, "launch_local", lambda configs, **kw: started.extend(configs))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    return started


def test_cli_resume_auto_reports_and_skips_a_corrupted_checkpoint(
    ckpt: Path, no_launch: list, capsys: pytest.CaptureFixture
) -> None:
    flip_byte(ckpt / "step-00000003" / "__0.safetensors")
    assert main(["train", *ARGS, "--steps", "5", "--checkpoint-dir", str(ckpt), "--resume", "auto", "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "skipping checkpoint" in err[0] and "step-00000003" in err[0]
    (cfg,) = no_launch
    assert cfg.resume_from == str(ckpt / "step-00000002") and cfg.checkpoint_dir == str(ckpt)


@pytest.fixture(scope="module")
def other_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from exatrain.data.prepare import Document, prepare
    from exatrain.data.tokenizer import byte_separator, byte_tokenizer_json, train_bpe

    root = tmp_path_factory.mktemp("bigvocab")
    (root / "a.txt").write_text("the tokenizer of this data has more ids than gpt-tiny has rows " * 50)
    text = (root / "a.txt").read_text()
    prepare([Document("a.txt", root / "a.txt")], root / "data", tokenizer_json=train_bpe([text], 300), quiet=True)
    data = json.loads(byte_tokenizer_json())  # 256 byte ids too, but another tokenizer (another identity)
    data["pre_tokenizer"]["use_regex"] = True
    prepare(
        [Document("a.txt", root / "a.txt")],
        root / "other",
        tokenizer_json=json.dumps(data),
        separator=byte_separator(),
        quiet=True,
    )
    return root


BAD = {
    "missing data dir": (["--data", "NOWHERE"], "no such data directory"),
    "tokenizer vocabulary beyond the model's": (["--data", "BIGVOCAB"], "needs 300 token ids"),
    "checkpoint of another model shape": (
        ["--model", "llama-tiny", "--resume", "CKPT/step-00000003"],
        "was saved for another model (gpt-tiny)",
    ),
    "corrupted checkpoint named": (["--resume", "CORRUPT"], "__0.safetensors is corrupted"),
    "checkpoint without manifest": (["--resume", "NOMANIFEST"], "no manifest.json"),
    "resume auto without a directory": (["--resume", "auto"], "--resume auto needs --checkpoint-dir"),
    "save-every without a directory": (["--save-every", "5"], "need --checkpoint-dir"),
    "checkpoint from another tokenizer": (
        ["--data", "OTHERTOK", "--resume", "CKPT/step-00000003"],
        "another tokenizer",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_exit_2_before_any_rank(
    case: str, ckpt: Path, other_data: Path, tmp_path: Path, no_launch: list, capsys: pytest.CaptureFixture
) -> None:
    corrupt = ckpt / "step-00000002"
    flip_byte(corrupt / "__0.safetensors")
    (ckpt / "step-00000001" / "manifest.json").unlink()
    subs = {
        "NOWHERE": str(tmp_path / "nowhere"),
        "BIGVOCAB": str(other_data / "data"),
        "OTHERTOK": str(other_data / "other"),
        "CKPT": str(ckpt),
        "CORRUPT": str(corrupt),
        "NOMANIFEST": str(ckpt / "step-00000001"),
    }
    argv, message = BAD[case]
    for k, v in subs.items():
        argv = [a.replace(k, v) for a in argv]
    model = [] if "--model" in argv else ["--model", "gpt-tiny"]
    assert main(["train", *ARGS[2:], *model, *argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert no_launch == []


class NanAt:
    """Wraps a Trainer's stepper: a non-finite loss at one step, parameter snapshots around it."""

    def __init__(self, trainer: Trainer, bad_step: int) -> None:
        self.inner, self.trainer, self.bad = trainer.stepper, trainer, bad_step
        self.calls = 0
        self.snapshots: list[list[torch.Tensor]] = []

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        self.snapshots.append([p.detach().clone() for p in self.trainer.pm.parameters()])
        loss = self.inner(inputs, targets, keys)
        self.calls += 1
        return torch.full_like(loss, float("nan")) if self.calls == self.bad + 1 else loss


def test_nan_policy_skip_drops_the_update_and_counts_it(one_rank: None, tmp_path: Path) -> None:
    trainer = Trainer(
        TrainConfig(
            plan=plan(),
            steps=4,
            quiet=True,
            nan_policy="skip",
            metrics_file=str(tmp_path / "m.jsonl"),
            checkpoint_dir=str(tmp_path / "ck"),
        )
    )
    trainer.stepper = fake = NanAt(trainer, bad_step=1)
    history = trainer.run()
    assert [m.skipped for m in history] == [False, True, False, False] and trainer.nan_skipped == 1
    assert all(torch.equal(a, b) for a, b in zip(fake.snapshots[1], fake.snapshots[2]))  # step 2 changed nothing
    assert not all(torch.equal(a, b) for a, b in zip(fake.snapshots[2], fake.snapshots[3]))
    lines = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines() if '"step"' in x]
    assert [x["skipped"] for x in lines if x["kind"] == "step"] == [False, True, False, False]
    assert json.loads((tmp_path / "ck" / "step-00000004" / "trainer.json").read_text())["nan_skipped"] == 1


def test_nan_policy_stop_names_the_step_before_updating(one_rank: None, tmp_path: Path) -> None:
    trainer = Trainer(TrainConfig(plan=plan(), steps=4, quiet=True, metrics_file=str(tmp_path / "m.jsonl")))
    trainer.stepper = fake = NanAt(trainer, bad_step=2)
    with pytest.raises(TrainingStopped, match="loss nan .* at step 3: stopped by --nan-policy stop"):
        trainer.run()
    assert fake.calls == 3
    (rec,) = read_run_records(tmp_path / "m.jsonl")
    assert rec.status == "failed" and "at step 3" in rec.error and rec.measured.steps == 2


@pytest.mark.slow
def test_a_diverging_run_stops_with_one_line_and_status_3(tmp_path: Path) -> None:
    """Through the CLI and a spawned rank: the rank's TrainingStopped becomes the command's one line."""
    out = subprocess.run(
        [sys.executable, "-m", "exatrain", "train", *ARGS, "--steps", "4", "--lr", "1e30", "--warmup", "0", "--quiet"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert out.returncode == 3, out.stderr[-3000:]
    assert out.stderr.strip().splitlines() == [
        "exatrain train: error: loss nan (gradient norm nan) at step 2: stopped by --nan-policy stop before the "
        "update; lower --lr, use float32, or --nan-policy skip"
    ]
