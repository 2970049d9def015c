"""Stand-ins for `srun` and `scontrol`, so a rendered batch script runs for real on one machine.

`srun` starts every task of the step here, each with the variables SLURM would give it (SLURM_PROCID,
SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS_PER_NODE), passes the command through
untouched, honours --kill-on-bad-exit, and logs each invocation (one JSON line) to $SRUN_LOG.
`scontrol show hostnames LIST` prints the comma-separated LIST one host a line.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

SRUN = r"""#!{python}
import json, os, subprocess, sys, time
args = sys.argv[1:]
opts = {{}}
while args and args[0].startswith("-"):
    a = args.pop(0)
    if "=" in a:
        k, v = a.split("=", 1)
    elif a in ("-N", "-n", "--nodes", "--ntasks", "--ntasks-per-node"):
        k, v = a, args.pop(0)
    else:
        k, v = a, ""
    opts[{{"-N": "--nodes", "-n": "--ntasks"}}.get(k, k)] = v
nodes = int(opts.get("--nodes", os.environ.get("SLURM_NNODES", "1")))
per_node = int(opts.get("--ntasks-per-node", 0)) or None
ntasks = int(opts.get("--ntasks", 0)) or nodes * (per_node or 1)
per_node = per_node or ntasks // nodes
if os.environ.get("SRUN_LOG"):
    with open(os.environ["SRUN_LOG"], "a") as log:
        log.write(json.dumps({{"options": opts, "command": args}}) + "\n")
procs = []
for rank in range(ntasks):
    env = dict(os.environ, SLURM_PROCID=str(rank), SLURM_NTASKS=str(ntasks), SLURM_NNODES=str(nodes),
               SLURM_LOCALID=str(rank % per_node), SLURM_NODEID=str(rank // per_node),
               SLURM_NTASKS_PER_NODE=str(per_node), SLURM_STEP_NUM_TASKS=str(ntasks))
    procs.append(subprocess.Popen(args, env=env))
codes = {{}}
while len(codes) < len(procs):
    for i, p in enumerate(procs):
        if i not in codes and p.poll() is not None:
            codes[i] = p.returncode
            if p.returncode and "--kill-on-bad-exit" in opts:
                for q in procs:
                    if q.poll() is None:
                        q.kill()
    time.sleep(0.05)
sys.exit(max((abs(c) for c in codes.values()), default=0))
"""

SCONTROL = r"""#!{python}
import signal, sys
signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # like the real one: `| head -n1` ends it quietly
if sys.argv[1:3] == ["show", "hostnames"]:
    print("\n".join(h for h in sys.argv[3].split(",") if h))
else:
    sys.exit("scontrol stand-in: only `show hostnames LIST` is implemented")
"""


def install(bin_dir: Path) -> Path:
    """Write both stand-ins into ``bin_dir`` (put it first on PATH) and return it."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        path = bin_dir / name
        path.write_text(text.format(python=sys.executable))
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_dir


def job_environment(bin_dir: Path, nodes: int, job_id: int = 4242, **extra: str) -> dict[str, str]:
    """What sbatch gives the batch script: the allocation's variables, stand-ins first on PATH
    (then this interpreter's directory, so `python` and `torchrun` are the ones under test)."""
    env = dict(os.environ)
    for key in [
        k
        for k in env
        if k.startswith("SLURM_") or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    ]:
        del env[key]
    env.update(
        PATH=os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env.get("PATH", "")]),
        SLURM_JOB_ID=str(job_id),
        SLURM_NNODES=str(nodes),
        SLURM_NODELIST=",".join(["127.0.0.1"] * nodes),
        SLURM_JOB_NODELIST=",".join(["127.0.0.1"] * nodes),
        **extra,
    )
    return env
