"""``estimate --from`` / ``search --from`` on launches as people write them: a Megatron-LM sbatch script with torchrun,
variables, arrays and line continuations; a Megatron-DeepSpeed script with the deepspeed launcher and a DeepSpeed
JSON beside it; an srun line; a torchtitan TOML leaning on its defaults; and export-config's own files read back
through the CLI. Bad files are one line and exit 2.

Broken on purpose, each failing here: ${VAR:-default} expanded to "" (the Megatron-LM script's world size);
array expansion "${A[@]}" kept as one word (its model flags lost); the deepspeed launcher's --num_gpus ignored;
the DeepSpeed JSON's ZeRO stage ignored for --zero-stage; unknown flags dropped silently (the warning line); the
torchtitan shard degree -1 read as 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exatrain import api
from exatrain.catalog import get_model

from tests.helpers.cli import refused, run

MEGATRON_LM = r"""#!/bin/bash
#SBATCH --job-name=llama3-8b
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NNODES=${SLURM_NNODES:-2}   # the allocation's, 2 when run by hand
TP=2
PP=2
DATA=/data/fineweb_text_document

GPT_MODEL_ARGS=(
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention --num-query-groups 8
    --seq-length 8192 --max-position-embeddings 8192
    --position-embedding-type rope --rotary-base 500000
    --normalization RMSNorm --swiglu --disable-bias-linear
    --untie-embeddings-and-output-weights
    --attention-dropout 0.0 --hidden-dropout 0.0
)
TRAINING_ARGS=(--micro-batch-size 1 --global-batch-size 128 --lr 3e-4 --train-iters 1000 --bf16)

torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank $SLURM_NODEID \
    pretrain_gpt.py \
    "${GPT_MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" \
    --tensor-model-parallel-size $TP --pipeline-model-parallel-size ${PP} \
    --num-virtual-stages-per-pipeline-rank 2 --sequence-parallel \
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
    --recompute-granularity selective \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Meta-Llama-3-8B \
    --data-path $DATA --save /ckpt --log-interval 10 \
    --no-rope-fusion --frobnicate 3
"""

MEGATRON_DEEPSPEED = r"""#!/bin/bash
ZERO_STAGE=2
DS_CONFIG=ds_config.json
deepspeed --num_gpus 8 --num_nodes 1 pretrain_gpt.py \
  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 --no-pipeline-parallel \
  --num-layers 24 --hidden-size 2048 --num-attention-heads 16 \
  --seq-length 2048 --max-position-embeddings 2048 \
  --micro-batch-size 2 --global-batch-size 64 \
  --tokenizer-type GPT2BPETokenizer --make-vocab-size-divisible-by 128 \
  --attention-dropout 0.1 --hidden-dropout 0.1 \
  --bf16 --use-flash-attn-v2 --checkpoint-activations \
  --zero-stage $ZERO_STAGE --deepspeed --deepspeed_config $DS_CONFIG \
  --deepspeed-activation-checkpointing
"""

DS_JSON = {
    "train_batch_size": 64,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 8,
    "zero_optimization": {"stage": 2, "overlap_comm": True, "contiguous_gradients": True},
    "bf16": {"enabled": True},
    "gradient_clipping": 1.0,
    "steps_per_print": 10,
}

TORCHTITAN = """
[job]
dump_folder = "./outputs"
description = "Llama 3 8B training"

[model]
name = "llama3"
flavor = "8B"

[training]
local_batch_size = 2
seq_len = 8192
steps = 1000

[parallelism]
tensor_parallel_degree = 2

[activation_checkpoint]
mode = "full"

[compile]
enable = true
components = ["model", "loss"]

[mystery]
knob = 1
"""


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_megatron_lm_sbatch_script(capsys, tmp_path) -> None:
    script = write(tmp_path, "train_llama.sh", MEGATRON_LM)
    # the vocabulary is the tokenizer's, which the script does not state
    assert "pass --vocab" in refused(capsys, "estimate", "--from", script)
    code, out, err = run(capsys, "estimate", "--from", script, "--vocab", "128256", "--cluster", "dgx-h100", "--json")
    assert code == 0, err
    plan = json.loads(out)["plan"]
    assert plan["model"]["name"] == "llama3-8b" and plan["model"]["seq_len"] == 8192  # the catalog's shape
    assert (plan["tp"], plan["pp"], plan["dp"], plan["interleave"], plan["schedule"]) == (2, 2, 4, 2, "interleaved")
    assert (plan["micro_batch"], plan["global_batch"], plan["zero_stage"], plan["recompute"]) == (
        1,
        128,
        1,
        "selective",
    )
    assert plan["sequence_parallel"] and plan["dtype"] == "bfloat16" and plan["runtime"] == "megatron-core"
    lines = err.strip().splitlines()
    assert len(lines) == 2, err
    defaults = next(line for line in lines if "leaves to Megatron-LM's defaults" in line)
    assert "--attention-backend" in defaults and "dropout" not in defaults
    assert "--no-rope-fusion, --frobnicate" in next(line for line in lines if "does not read" in line)
    with pytest.warns(api.ExatrainWarning):
        values = api.from_launch(script, shape={"vocab": 128256})
    assert values["overlap"] == "dp_grad_reduce,dp_param_gather,pp_p2p" and values["gpus"] == 16
    assert values["model"] == get_model("llama3-8b")


def test_flags_win_over_the_file(capsys, tmp_path) -> None:
    script = write(tmp_path, "train_llama.sh", MEGATRON_LM)
    code, out, err = run(
        capsys,
        "estimate",
        "--from",
        script,
        "--vocab",
        "128256",
        "--tp",
        "4",
        "--pp",
        "1",
        "--recompute",
        "full",
        "--overlap",
        "none",
        "--cluster",
        "dgx-h100",
        "--json",
    )
    assert code == 0, err
    plan = json.loads(out)["plan"]
    assert (plan["tp"], plan["pp"], plan["dp"], plan["recompute"]) == (4, 1, 4, "full")


def test_megatron_deepspeed_with_its_json(capsys, tmp_path) -> None:
    script = write(tmp_path, "ds_gpt.sh", MEGATRON_DEEPSPEED)
    assert "ds_config.json is neither written by the script nor beside it" in refused(
        capsys, "estimate", "--from", script
    )
    (tmp_path / "ds_config.json").write_text(json.dumps(DS_JSON))
    code, out, err = run(capsys, "estimate", "--from", script, "--cluster", "dgx-a100", "--json")
    assert code == 0, err
    plan = json.loads(out)["plan"]
    assert (plan["tp"], plan["pp"], plan["dp"], plan["micro_batch"], plan["global_batch"]) == (2, 1, 4, 2, 64)
    assert (plan["zero_stage"], plan["recompute"], plan["runtime"], plan["flash_attention"]) == (
        2,
        "full",
        "megatron-deepspeed",
        True,
    )
    assert plan["model"]["vocab"] == 50432  # GPT-2's 50,257 tokens padded to a multiple of 128 x tp
    assert plan["model"]["dropout"] == 0.1 and plan["model"]["arch"] == "gpt"
    values = api.from_launch(script, warn=lambda line: None)
    assert values["overlap"] == "dp_grad_reduce,dp_param_gather"
    with pytest.warns(api.ExatrainWarning, match="leaves to Megatron-DeepSpeed's defaults"):
        plan = api.estimate(from_file=script, cluster="dgx-a100", micro_batch=1)  # an argument wins over the file
    assert (plan.micro_batch, plan.global_batch, plan.zero_stage, plan.runtime) == (1, 64, 2, "megatron-deepspeed")
    # inconsistent sizes: the JSON's batch does not divide into the launch's ranks
    (tmp_path / "ds_config.json").write_text(json.dumps({**DS_JSON, "train_batch_size": 48}))
    assert "--global-batch-size 64 but the DeepSpeed JSON's train_batch_size is 48" in refused(
        capsys, "estimate", "--from", script
    )
    (tmp_path / "ds_config.json").write_text(json.dumps({**DS_JSON, "gradient_accumulation_steps": 4}))
    assert "makes 8 data-parallel ranks, 16 ranks with tp*pp 2, but the launch runs 8" in refused(
        capsys, "estimate", "--from", script
    )
    (tmp_path / "ds_config.json").write_text(json.dumps({**DS_JSON, "zero_optimization": {"stage": 1}}))
    assert "--zero-stage 2 but the DeepSpeed JSON's zero_optimization.stage is 1" in refused(
        capsys, "estimate", "--from", script
    )
    # the JSON's stage is the one DeepSpeed runs, --zero-stage or not
    (tmp_path / "ds_config.json").write_text(json.dumps({**DS_JSON, "zero_optimization": {"stage": 3}}))
    bare = write(tmp_path, "ds_bare.sh", MEGATRON_DEEPSPEED.replace("--zero-stage $ZERO_STAGE ", ""))
    assert api.from_launch(bare, warn=lambda line: None)["zero"] == 3


def test_srun_line(capsys, tmp_path) -> None:
    script = write(
        tmp_path,
        "srun.sbatch",
        "#!/bin/bash\n#SBATCH -N 4\nsrun --ntasks-per-node=8 \\\n"
        "  python /opt/Megatron-LM/pretrain_gpt.py --tensor-model-parallel-size 8 "
        "--pipeline-model-parallel-size 2 --num-layers 40 --hidden-size 5120 --num-attention-heads 40 "
        "--seq-length 2048 --max-position-embeddings 2048 --vocab-size 50257 "
        "--micro-batch-size 1 --global-batch-size 256 --bf16 --recompute-granularity full "
        "--recompute-method block --recompute-num-layers 2\n",
    )
    values = api.from_launch(script, warn=lambda line: None)
    assert values["gpus"] == 32 and values["recompute_layers"] == 2 and values["model"].vocab == 51200
    plan = api.estimate(**values, cluster="dgx-a100")
    assert (plan.tp, plan.pp, plan.dp, plan.recompute_layers, plan.runtime) == (8, 2, 2, 2, "megatron-core")


def test_torchtitan_toml(capsys, tmp_path) -> None:
    job = write(tmp_path, "llama3_8b.toml", TORCHTITAN)
    assert "pass --gpus" in refused(capsys, "estimate", "--from", job)  # shard degree -1: every rank left
    code, out, err = run(capsys, "estimate", "--from", job, "--gpus", "16", "--cluster", "dgx-h100", "--json")
    assert code == 0, err
    plan = json.loads(out)["plan"]
    assert plan["model"]["name"] == "llama3-8b" and plan["model"]["seq_len"] == 8192  # torchtitan's 8B flavor
    assert (plan["tp"], plan["dp"], plan["micro_batch"], plan["global_batch"], plan["zero_stage"]) == (2, 8, 2, 16, 3)
    assert plan["recompute"] == "full" and plan["sequence_parallel"] and plan["runtime"] == "torchtitan"
    assert "[mystery]" in err and "fsdp_reshard_after_forward" in err


def test_search_pins_what_the_file_states(capsys, tmp_path) -> None:
    script = write(tmp_path, "train_llama.sh", MEGATRON_LM)
    code, out, err = run(
        capsys, "search", "--from", script, "--vocab", "128256", "--cluster", "dgx-h100", "--top", "3", "--json"
    )
    assert code == 0, err
    ranked = json.loads(out)["ranked"]
    assert ranked and all(
        (r["plan"]["tp"], r["plan"]["pp"], r["plan"]["zero_stage"], r["plan"]["recompute"]) == (2, 2, 1, "selective")
        for r in ranked
    )


@pytest.mark.parametrize("target", ["megatron", "deepspeed", "torchtitan"])
def test_cli_export_then_from(capsys, tmp_path, target) -> None:
    """export-config's file, read by estimate --from, plans the same layout (the plan file's, runtime the target's)."""
    runtime = {"megatron": "megatron-core", "deepspeed": "megatron-deepspeed", "torchtitan": "torchtitan"}[target]
    zero = "3" if target == "torchtitan" else "1"  # torchtitan's FSDP2 has no ZeRO-1
    layout = [
        "--gpus",
        "32",
        "--tp",
        "4",
        "--pp",
        "2",
        "--micro-batch",
        "2",
        "--global-batch",
        "128",
        "--zero",
        zero,
        "--recompute",
        "full",
        "--sequence-parallel",
    ]
    plan_file, args = tmp_path / "plan.json", tmp_path / f"args.{'toml' if target == 'torchtitan' else 'sh'}"
    code, out, err = run(
        capsys,
        "estimate",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100",
        "--runtime",
        runtime,
        *layout,
        "--out",
        str(plan_file),
        "--json",
    )
    assert code == 0, err
    want = json.loads(out)["plan"]
    assert run(capsys, "export-config", "--plan", str(plan_file), "--for", target, "--out", str(args))[0] == 0
    code, out, err = run(capsys, "estimate", "--from", str(args), "--cluster", "dgx-h100", "--json")
    assert code == 0, err
    assert json.loads(out)["plan"] == want


@pytest.mark.parametrize(
    "text, name, message",
    [
        ("#!/bin/bash\necho hello\n", "run.sh", "no pretrain_gpt.py command"),
        (
            "torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size $TP --num-layers 2\n",
            "run.sh",
            "--tensor-model-parallel-size is $TP, which the script does not assign",
        ),
        (
            "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 4 --hidden-size 64 --num-attention-heads 4 "
            "--seq-length 64 --vocab-size 100 --pipeline-model-parallel-size 2 "
            "--pipeline-model-parallel-layout 'Et|t*2L'\n",
            "run.sh",
            "the pipeline layout holds 3 layers, the model 4",
        ),
        ("[model\nname = 'llama3'\n", "job.toml", "not valid TOML"),
        ("title = 'x'\n", "job.toml", "no torchtitan section"),
        (
            "[parallelism]\ntensor_parallel_degree = 3\ndata_parallel_shard_degree = 2\n[model]\nname = 'llama3'\n"
            "flavor = 'mine'\n",
            "job.toml",
            "flavor 'mine' is not one exatrain knows",
        ),
    ],
)
def test_bad_launches_are_one_line(capsys, tmp_path, text, name, message) -> None:
    assert message in refused(capsys, "estimate", "--from", write(tmp_path, name, text))
    assert message in refused(
        capsys, "search", "--from", write(tmp_path, name, text), "--gpus", "16", "--global-batch", "64"
    )


def test_shell_words() -> None:
    """The bash the reader understands: quotes, continuations, comments, ${VAR:-default}, $((arithmetic)), arrays
    and their appends, here-documents by target file; an unassigned variable stays as written."""
    from exatrain.engine_configs.shell import run_script

    script = run_script(
        "N=4 # nodes\nA=(--x 1 'two words')\nA+=(--y)\nW=$((N*8))\n"
        'cat > "cfg.json" <<\'EOF\'\n{"k": $N}\nEOF\n'
        'cmd "${A[@]}" --n ${N} --w $W --d ${D:-7} --u "$U" \\\n  --q "a b" --c ${#A[@]}; echo x\n'
    )
    assert script.commands[1] == [
        "cmd",
        "--x",
        "1",
        "two words",
        "--y",
        "--n",
        "4",
        "--w",
        "32",
        "--d",
        "7",
        "--u",
        "$U",
        "--q",
        "a b",
        "--c",
        "4",
    ]
    assert script.heredocs == {"cfg.json": '{"k": $N}\n'} and script.commands[2] == ["echo", "x"]
