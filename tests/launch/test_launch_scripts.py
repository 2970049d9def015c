"""Rendered SLURM scripts and torchrun commands: valid bash, the right node layout, environment,
rendezvous and trainer command, for Frontier, an NVIDIA cluster and CPU ranks."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from exatrain.catalog import get_cluster, get_model
from exatrain.errors import UserError
from exatrain.launch import SlurmOptions, TorchrunOptions, TrainArgs, node_layout, render_slurm, render_torchrun
from exatrain.launch.common import environment, parse_master
from exatrain.plan import ParallelDims, Plan, TrainShape


def plan(tp: int = 4, pp: int = 16, dp: int = 2, model: str = "gpt-175b", zero: int = 1) -> Plan:
    return Plan(
        model=get_model(model),
        dims=ParallelDims(tp, pp, dp),
        shape=TrainShape(1, 640 if pp > 1 else dp),
        zero_stage=zero,
        recompute="full",
    ).validate()


def bash_n(text: str, tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text(text)
    out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def sbatch_options(text: str) -> dict[str, str]:
    return dict(m.groups() for m in re.finditer(r"^#SBATCH --([a-z-]+)(?:=(.*))?$", text, re.M))


def exports(text: str) -> dict[str, str]:
    return dict(re.findall(r'^export ([A-Z_]+)="(.*)"$', text, re.M))


def test_node_layout() -> None:
    frontier = get_cluster("frontier")
    lay = node_layout(plan(), frontier)
    assert (lay.nodes, lay.ranks_per_node) == (16, 8)
    lay = node_layout(plan(tp=2, pp=1, dp=2, model="gpt-1.4b"), frontier)  # 4 ranks: one partial node
    assert (lay.nodes, lay.ranks_per_node) == (1, 4)
    lay = node_layout(plan(), frontier, nodes=32)  # spread thinner: 4 per node, still whole tp groups
    assert (lay.nodes, lay.ranks_per_node) == (32, 4)


@pytest.mark.parametrize(
    "kwargs,nodes,message",
    [
        (dict(tp=16, pp=1, dp=1, model="gpt-1t"), None, "tp 16 needs 16 devices in one node"),
        ({}, 8, "hold 64 devices"),
        ({}, 64, "not a multiple of tp 4"),  # 2 ranks per node would split a tp group
        ({}, 48, "do not split evenly"),
    ],
)
def test_node_layout_rejects(kwargs: dict, nodes: int | None, message: str) -> None:
    with pytest.raises(UserError, match=message):
        node_layout(plan(**kwargs) if kwargs else plan(), get_cluster("frontier"), nodes)


def test_frontier_slurm_script(tmp_path: Path) -> None:
    p = plan()
    text = render_slurm(
        p,
        get_cluster("frontier"),
        SlurmOptions(
            account="ABC123",
            time="02:00:00",
            partition="batch",
            setup=("module load rocm/6.2.4",),
            train=TrainArgs(checkpoint_dir="/lustre/orion/abc123/ckpt gpt"),
        ),
    )
    bash_n(text, tmp_path)
    assert text.index("module load rocm/6.2.4") < text.index("set -euo pipefail")
    opts = sbatch_options(text)
    assert opts == {
        "job-name": "exatrain-gpt-175b",
        "account": "ABC123",
        "partition": "batch",
        "time": "02:00:00",
        "nodes": "16",
        "ntasks-per-node": "8",
        "gpus-per-node": "8",
        "cpus-per-task": "7",
        "requeue": None,
        "open-mode": "append",
        "output": "%x-%j.out",
    }
    env = exports(text)
    # REFERENCE "Frontier launch environment": plugin on LD_LIBRARY_PATH, GDR level 3, hsn0, no ATS,
    # MIOpen caches on node-local /tmp, one device connection for TP overlap
    assert env["NCCL_NET_GDR_LEVEL"] == "3" and env["NCCL_SOCKET_IFNAME"] == "hsn0" and env["FI_CXI_ATS"] == "0"
    assert env["LD_LIBRARY_PATH"].startswith("${AWS_OFI_RCCL_DIR:?") and env["LD_LIBRARY_PATH"].endswith(
        "/lib:${LD_LIBRARY_PATH:-}"
    )
    assert env["MIOPEN_USER_DB_PATH"].startswith("/tmp/") and env["MIOPEN_CUSTOM_CACHE_DIR"] == "${MIOPEN_USER_DB_PATH}"
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and env["OMP_NUM_THREADS"] == "1"
    assert env["MASTER_ADDR"] == '$(scontrol show hostnames "$SLURM_NODELIST" | head -n1)'
    assert env["MASTER_PORT"] == "29500"
    run = text[text.rindex("srun ") :]
    assert run.startswith("srun --nodes=16 --ntasks=128 --ntasks-per-node=8 --gpu-bind=closest")
    assert (
        'python -m exatrain.train --plan "$PLAN" --checkpoint-dir "$CHECKPOINT_DIR" --resume auto --device cuda'
    ) in run
    assert 'CHECKPOINT_DIR="/lustre/orion/abc123/ckpt gpt"' in text
    # the embedded plan is the plan, byte for byte what Plan.load reads back
    embedded = text.split("<<'EXATRAIN_PLAN_JSON'\n", 1)[1].split("\nEXATRAIN_PLAN_JSON\n", 1)[0]
    assert Plan.from_dict(json.loads(embedded)) == p


def test_nvidia_and_cpu_environments(tmp_path: Path) -> None:
    text = render_slurm(plan(), get_cluster("dgx-h100"), SlurmOptions(rccl_plugin_dir="/unused"))
    bash_n(text, tmp_path)
    env = exports(text)
    assert "NCCL_SOCKET_IFNAME" not in env and "MIOPEN_USER_DB_PATH" not in env and "FI_CXI_ATS" not in env
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert "--gpu-bind" not in text and sbatch_options(text)["gpus-per-node"] == "8"
    assert "--account=" not in text.replace("# #SBATCH --account=<project>", "")

    tiny = Plan(model=get_model("gpt-tiny"), dims=ParallelDims(1, 2, 2), shape=TrainShape(1, 4)).validate()
    text = render_slurm(tiny, get_cluster("local-cpu"), SlurmOptions(nodes=2, train=TrainArgs(steps=3)))
    bash_n(text, tmp_path)
    assert exports(text).keys() == {"MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"}
    assert "gpus-per-node" not in sbatch_options(text) and "--device cpu --steps 3" in text
    assert "srun --nodes=2 --ntasks=4 --ntasks-per-node=2 --kill-on-bad-exit=1" in text


def test_fsdp_plans_leave_device_connections_alone() -> None:
    # Megatron-LM's validate_args wants CUDA_DEVICE_MAX_CONNECTIONS unset or >1 for sharded dp
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in {v.name for v in environment(plan(zero=3), get_cluster("dgx-a100"))}
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in {
        v.name for v in environment(plan(tp=1, pp=1, dp=8, model="gpt-1.4b"), get_cluster("dgx-a100"))
    }


@pytest.mark.parametrize(
    "options,message",
    [
        (SlurmOptions(time="2 hours"), "--time"),
        (SlurmOptions(account="ABC 123"), "--account"),
        (SlurmOptions(job_name="x;rm -rf /"), "--job-name"),
        (SlurmOptions(master_port=70000), "master port"),
    ],
)
def test_slurm_rejects_bad_options(options: SlurmOptions, message: str) -> None:
    with pytest.raises(UserError, match=message):
        render_slurm(plan(), get_cluster("frontier"), options)


def test_torchrun_script(tmp_path: Path) -> None:
    opts = TorchrunOptions(
        plan_path="/shared/plans/175b.json",
        nodes=16,
        master="node0:29500",
        train=TrainArgs(checkpoint_dir="/shared/ckpt"),
    )
    text = render_torchrun(plan(), get_cluster("frontier"), opts)
    bash_n(text, tmp_path)
    command = " ".join(line.rstrip("\\ ").strip() for line in text[text.index("torchrun ") :].splitlines())
    assert command == (
        "torchrun --nnodes=16 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=node0:29500 "
        "--rdzv-id=exatrain-gpt-175b --max-restarts=0 -m exatrain.train --plan "
        "/shared/plans/175b.json --checkpoint-dir /shared/ckpt --resume auto --device cuda"
    )
    assert exports(text)["NCCL_SOCKET_IFNAME"] == "hsn0"
    # without --master the endpoint comes from the environment at run time, and says so if unset
    text = render_torchrun(plan(), get_cluster("dgx-h100"), TorchrunOptions(plan_path="/p.json"))
    assert '--rdzv-endpoint="${MASTER_ADDR:?' in text
    bash_n(text, tmp_path)


@pytest.mark.parametrize(
    "text,expected",
    [("node0:29500", ("node0", 29500)), ("[::1]:29400", ("::1", 29400)), ("10.0.0.1:1", ("10.0.0.1", 1))],
)
def test_parse_master(text: str, expected: tuple[str, int]) -> None:
    assert parse_master(text) == expected


@pytest.mark.parametrize("text", ["node0", "node0:", ":29500", "node0:0", "node0:99999", "a b:1", "$(x):1"])
def test_parse_master_rejects(text: str) -> None:
    with pytest.raises(UserError, match="--master"):
        parse_master(text)
