"""Resume exactness, across layouts, and export of the checkpoints to Hugging Face transformers.

A tp2 x dp2 ZeRO-1 run of gpt-tiny (DTensor parameters kept as local shards, ZeroRedundancyOptimizer
partitions) trains STEPS (6) steps and saves after steps SAVED (3) and 6. From the step-3 checkpoint:
* the same layout continues 3 steps: bit-identical losses (CPU, float32);
* pp2 (plain AdamW, each rank half the layers) and tp2 x pp2 x dp2 with FSDP2 ZeRO-3 (2-D sharded
  DTensors) continue 3 steps: within 1e-5 of the straight run.
Every step records the global sample indices each dp rank read: the three resumed steps read exactly
the samples the straight run read at steps 4-6, and the six steps together read 0 .. 6*batch - 1
once each. The checkpoints are then exported (gpt and a tp2 llama) and loaded in transformers, whose
logits must equal exatrain's own forward within 1e-5.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.helpers.ckpt_runs import Run, max_rel_diff, samples_by_step

from exatrain.catalog import get_model
from exatrain.cli import main
from exatrain.trainer.checkpoint.storage import read_full
from exatrain.trainer.model import Transformer

pytestmark = pytest.mark.slow
GLOBAL_BATCH = 8  # trainer_runs.GLOBAL_BATCH
RTOL = 1e-5
STEPS = 6  # the straight run's
SAVED = 3  # the step of the checkpoint the other runs resume from (the straight run saves every SAVED steps)
CKPT = f"step-{SAVED:08d}"


def cases_on_four(out: Path) -> dict[str, dict]:
    """The straight run, its same-layout resume and llama, in the four-rank launch shared with the
    resharding tests (conftest.py)."""
    return {
        "straight": dict(
            tp=2,
            dp=2,
            zero_stage=1,
            steps=STEPS,
            checkpoint_dir=str(out / "ckpt"),
            save_every=SAVED,
            tensorboard_dir=str(out / "tb"),
        ),
        "same-layout": dict(tp=2, dp=2, zero_stage=1, steps=STEPS, resume_from=str(out / "ckpt" / CKPT)),
        "llama": dict(model="llama-tiny", tp=2, dp=2, steps=3, checkpoint_dir=str(out / "llama")),
    }


def cases_after_four(out: Path, world: int) -> dict[str, dict]:
    """Other layouts resumed from the straight run's step-SAVED checkpoint, by world size."""
    ckpt = str(out / "ckpt" / CKPT)
    return {
        2: {"pp2": dict(pp=2, steps=STEPS, resume_from=ckpt)},
        8: {"tp2-pp2-dp2-fsdp": dict(tp=2, pp=2, dp=2, zero_stage=3, steps=STEPS, resume_from=ckpt)},
    }[world]


@pytest.fixture(scope="module")
def four(ckpt_out: Path, launch_four: dict) -> tuple[Path, dict[str, Run]]:
    return ckpt_out / "resume", launch_four["resume"]


@pytest.fixture(scope="module")
def other_layouts(launch_two_after_four: dict, launch_eight: dict) -> dict[str, Run]:
    return {**launch_two_after_four["resume"], **launch_eight["resume"]}


def test_same_layout_resume_is_bit_identical(four: tuple[Path, dict[str, Run]]) -> None:
    runs = four[1]
    straight, resumed = runs["straight"], runs["same-layout"]
    assert [s["step"] for s in resumed.steps] == list(range(SAVED + 1, STEPS + 1))
    assert resumed.losses == straight.losses[SAVED:]
    assert resumed.grad_norms == straight.grad_norms[SAVED:]
    assert samples_by_step(resumed) == samples_by_step(straight)[SAVED:]


@pytest.mark.parametrize("case", ["pp2", "tp2-pp2-dp2-fsdp"])
def test_another_layout_resumes_within_tolerance(
    case: str, four: tuple[Path, dict[str, Run]], other_layouts: dict[str, Run]
) -> None:
    straight, resumed = four[1]["straight"], other_layouts[case]
    assert [s["step"] for s in resumed.steps] == list(range(SAVED + 1, STEPS + 1))
    assert max_rel_diff(resumed.losses, straight.losses[SAVED:]) <= RTOL, (resumed.losses, straight.losses[SAVED:])
    assert max_rel_diff(resumed.grad_norms, straight.grad_norms[SAVED:]) <= RTOL
    before = [i for step in samples_by_step(straight)[:SAVED] for i in step]
    after = [i for step in samples_by_step(resumed) for i in step]
    assert sorted(before + after) == list(range(STEPS * GLOBAL_BATCH))  # none repeated, none skipped
    assert samples_by_step(resumed) == samples_by_step(straight)[SAVED:]


def test_checkpoints_are_published_with_manifests(four: tuple[Path, dict[str, Run]]) -> None:
    root = four[0] / "ckpt"
    # no .tmp- left (ranks/ holds the ranks' logs and heartbeats: trainer/failures.py)
    assert sorted(p.name for p in root.iterdir()) == ["ranks", CKPT, f"step-{STEPS:08d}"]
    for step in (SAVED, STEPS):
        d = root / f"step-{step:08d}"
        manifest = json.loads((d / "manifest.json").read_text())
        trainer = json.loads((d / "trainer.json").read_text())
        assert manifest["step"] == trainer["step"] == step
        assert trainer["samples_consumed"] == step * GLOBAL_BATCH and trainer["layout"] == {"tp": 2, "pp": 1, "dp": 2}
        assert set(manifest["files"]) == {p.name for p in d.iterdir()} - {"manifest.json"}
        assert not any(p.suffix in (".distcp", ".pt", ".pkl") or p.name == ".metadata" for p in d.iterdir())


def test_tensorboard_has_every_step(four: tuple[Path, dict[str, Run]]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(four[0] / "tb"))
    acc.Reload()
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == list(range(1, STEPS + 1))
    assert [e.value for e in loss] == pytest.approx(four[1]["straight"].losses, rel=1e-6)
    for tag in ("train/grad_norm", "train/lr", "perf/tokens_per_s", "perf/step_time_s"):
        assert len(acc.Scalars(tag)) == STEPS


def exatrain_logits(checkpoint: Path, model: str, tokens: torch.Tensor) -> torch.Tensor:
    spec = get_model(model)
    net = Transformer(spec)
    state = read_full(checkpoint, prefix="model.")
    if spec.tied_embeddings:
        state["head.weight"] = state["embed.tok.weight"]
    net.load_state_dict(state, strict=True)
    with torch.no_grad():
        return net.eval()(tokens)


@pytest.mark.parametrize("model,ckpt", [("gpt-tiny", f"ckpt/step-{STEPS:08d}"), ("llama-tiny", "llama/step-00000003")])
def test_export_loads_in_transformers_with_the_same_logits(
    model: str, ckpt: str, tmp_path: Path, four: tuple[Path, dict[str, Run]]
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "hf"
    assert main(["export", "--checkpoint", str(four[0] / ckpt), "--format", "hf", "--out", str(out)]) == 0
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == {"gpt-tiny": "GPT2LMHeadModel", "llama-tiny": "LlamaForCausalLM"}[model]
    tokens = torch.randint(0, 256, (2, get_model(model).seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = hf(tokens).logits
    ours = exatrain_logits(four[0] / ckpt, model, tokens)
    assert (theirs - ours).abs().max().item() <= 1e-5 * ours.abs().max().item()
    tok = AutoTokenizer.from_pretrained(out)
    assert tok("def f():").input_ids == list(b"def f():")  # the byte tokenizer went along


def test_export_picks_the_newest_or_a_named_step(
    tmp_path: Path, four: tuple[Path, dict[str, Run]], capsys: pytest.CaptureFixture
) -> None:
    root = four[0] / "ckpt"
    assert main(["export", "--checkpoint", str(root), "--out", str(tmp_path / "newest")]) == 0
    assert f"step-{STEPS:08d}" in capsys.readouterr().out
    assert main(["export", "--checkpoint", str(root), "--step", str(SAVED), "--out", str(tmp_path / "saved")]) == 0
    assert CKPT in capsys.readouterr().out
    assert main(["export", "--checkpoint", str(root), "--step", "4", "--out", str(tmp_path / "four")]) == 2
    err = capsys.readouterr().err  # step 4 ran but was not saved
    assert "step-00000004" in err and len(err.strip().splitlines()) == 1
