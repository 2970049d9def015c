"""Starting the ranks: from torchrun's or srun's environment, or by spawning local processes.

Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) or srun (SLURM_PROCID, SLURM_NTASKS,
SLURM_LOCALID, with MASTER_ADDR/MASTER_PORT exported by the batch script) every process is one rank.
Otherwise ``launch_local`` spawns the plan's ranks on this machine, each with OMP_NUM_THREADS=1
(more threads per rank oversubscribe the cores: several times slower on a small CPU machine).
gloo on the CPU, NCCL on CUDA devices (the ROCm build's RCCL answers to the same name).

Every rank runs under a RankMonitor (health.py: heartbeat, watchdog, straggler windows, stop requests)
and ends any failure through it, so a failure becomes one record per rank in the run directory and one
line for the user (failures.py), never a rank's traceback or the launcher's teardown on the terminal.

Signals. ``launch_local`` catches SIGTERM, SIGINT and SIGHUP (what ``kill``, ``timeout``, a scheduler, a
terminal's Ctrl-C or hangup send, to it alone or to its whole process group) and passes the signal on
to every rank, which stop together after the step they are in (health.py); a second signal kills the
ranks at once. A rank watches its launcher too, so it never outlives it (health.py). The launcher then
writes the interrupted RunRecord and raises Interrupted: one line, exit status 128 + the signal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from exatrain.errors import UserError
from exatrain.trainer.config import TrainConfig


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def dist_env(environ: Mapping[str, str] | None = None) -> DistEnv | None:
    """This process's rank when a launcher (torchrun, srun) started it; None otherwise."""
    env = os.environ if environ is None else environ
    try:
        if "RANK" in env and "WORLD_SIZE" in env:
            world = int(env["WORLD_SIZE"])
            return DistEnv(
                int(env["RANK"]),
                world,
                int(env.get("LOCAL_RANK", env["RANK"])),
                int(env.get("LOCAL_WORLD_SIZE", world)),
            )
        if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "MASTER_ADDR" in env:
            world = int(env["SLURM_NTASKS"])
            return DistEnv(
                int(env["SLURM_PROCID"]),
                world,
                int(env.get("SLURM_LOCALID", 0)),
                int(str(env.get("SLURM_NTASKS_PER_NODE", world)).split("(")[0]),
            )
    except ValueError as exc:
        raise UserError(f"malformed launcher environment ({exc})") from None
    return None


def backend(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def run_distributed(config: TrainConfig, env: DistEnv) -> None:
    """One rank started by torchrun or srun: join the process group, train, leave.

    With a run directory (failures.run_dir_for: the launch scripts always pass --checkpoint-dir) the
    rank's stderr goes to RUN_DIR/rank-R.log and its monitor writes heartbeats there; a failure is
    recorded by every rank and reported, as one line on the terminal's stderr, by the first rank to
    claim it (RankMonitor.end). The process then ends with the failure's exit status."""
    import torch.distributed as dist

    from exatrain.trainer import failures
    from exatrain.trainer.health import RankMonitor
    from exatrain.trainer.train import train

    if "MASTER_PORT" not in os.environ:
        raise UserError("MASTER_PORT is not set: export MASTER_ADDR and MASTER_PORT in the launch script")
    run_dir = run_dir_of(config)
    report_fd = None
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        report_fd = _stderr_to(failures.log_path(run_dir, env.rank), env.rank)
    _prepare_rank(config, env.local_rank)
    dist.init_process_group(backend(config.device), init_method="env://", rank=env.rank, world_size=env.world_size)
    if run_dir is not None:
        if env.rank == 0:
            failures.prepare(run_dir)  # an earlier start's heartbeats and records, before anyone writes
        dist.barrier()
    monitor = RankMonitor(env.rank, env.world_size, run_dir, supervised=False, report_fd=report_fd)
    monitor.new_run(
        0,
        config,
        failures.RunContext(
            plan=config.plan,
            run=0,
            checkpoint_dir=config.checkpoint_dir,
            run_dir=run_dir,
            resume=failures.resume_command(sys.argv, distributed=True),
        ),
    )
    monitor.start()
    try:
        train(config, env.local_rank, monitor)
    except BaseException as exc:  # noqa: B036 - every way out of a rank is recorded (end() exits)
        _end_rank(monitor, exc)
    monitor.stop()
    dist.destroy_process_group()
    if report_fd is not None:
        os.dup2(report_fd, 2)  # the CLI's own output after the run goes to the terminal again


def run_dir_of(config: TrainConfig) -> Path | None:
    """The config's run directory: ``run_dir``, else beside its checkpoints or metrics (failures.py)."""
    from exatrain.trainer.failures import run_dir_for

    return Path(config.run_dir) if config.run_dir else run_dir_for(config.checkpoint_dir, config.metrics_file)


def launch_local(configs: Sequence[TrainConfig], stall_s: float | None = None) -> None:
    """Spawn the plan's ranks here and run ``configs`` one after another in them (tests batch several
    runs into one set of processes).

    Each rank's stderr goes to RUN_DIR/rank-R.log (the run directory of the first config; a temporary
    one, removed after a clean run, when it names none), so the terminal shows the progress and, if a
    rank fails, one line: failures.diagnose reads the ranks' records and heartbeats with their exit
    statuses, the failed (or interrupted) RunRecord is appended to the metrics file, and the line is
    raised as a RankFailed (exit status 4), RankHung (5), Interrupted (128 + the signal: 129, 130, 143)
    or the UserError a rank raised (2, 3). After the first rank fails the others get a few seconds to
    record how they ended; when the first failure has no cause yet (a hang, a lost peer), they get until
    their watchdog's limit. A stop signal to this process (from the main thread's point of view: it is
    caught only there) is passed on to the ranks (see the module docstring). ``stall_s`` guards against
    a hang nothing else catches: when no rank's heartbeat moves on for that long (its step, its phase, or
    on CPU its main thread's CPU time), the ranks are killed and the hang is reported."""
    import multiprocessing

    from exatrain.trainer import failures

    world = configs[0].plan.gpus
    if any(c.plan.gpus != world for c in configs):
        raise ValueError("every config of one launch needs the same number of ranks")
    named = run_dir_of(configs[0])
    run_dir = named if named is not None else Path(tempfile.mkdtemp(prefix="exatrain-run-"))
    failures.prepare(run_dir)
    configs = tuple(dataclasses.replace(c, run_dir=str(run_dir)) for c in configs)
    port = _free_port()
    spawn = multiprocessing.get_context("spawn")
    procs = [
        spawn.Process(target=_spawned, args=(r, world, port, configs, str(run_dir)), name=f"exatrain-rank-{r}")
        for r in range(world)
    ]
    started = time.time()
    with _StopSignals() as signals:
        with _environ(OMP_NUM_THREADS="1"):
            for p in procs:
                p.start()
        outcome = _supervise(procs, run_dir, world, stall_s, signals)
    codes = {r: p.exitcode for r, p in enumerate(procs)}
    if not outcome.stalled and all(c == 0 for c in codes.values()):  # a signal after the last step: done
        if named is None:
            shutil.rmtree(run_dir, ignore_errors=True)
        return
    beats, fails = failures.read_ranks(run_dir, world)
    run = max([int(x.get("run", 0)) for x in (*beats.values(), *fails.values())], default=0)
    config = configs[run]
    if outcome.stalled:  # nothing else caught it: every rank still alive is reported as waiting
        for r in outcome.killed:
            if r in beats and r not in fails:
                fails[r] = {
                    **beats[r],
                    "kind": "hung",
                    "time": time.time(),
                    "limit_s": stall_s,
                    "cause": f"no progress for {stall_s:.0f} s",
                }
    ctx = failures.RunContext(
        plan=config.plan,
        run=run,
        checkpoint_dir=config.checkpoint_dir,
        run_dir=run_dir,
        resume=failures.resume_command(sys.argv),
    )
    diag = failures.diagnose(
        ctx, beats, fails, exit_codes=codes, killed=outcome.killed, interrupted=outcome.interrupted
    )
    failures.write_failed_record(
        config.metrics_file,
        config.plan,
        diag,
        device=config.device,
        wall_s=time.time() - started,
        measure_after=config.measure_after,
        versions=failures.versions_of(fails),
    )
    raise diag.error


@dataclass
class _Outcome:
    interrupted: int = 0  # the first stop signal the launcher got (0: none)
    stalled: bool = False
    killed: set[int] = dataclasses.field(default_factory=set)


CAUSE_GRACE_S = 10.0  # after a failure whose cause is known, how long the other ranks get to record theirs


def _stop_backstop_s() -> float:
    """After a stop signal, how long the launcher waits for the ranks before it kills them: a hang's limit
    only, since each rank bounds its own wait for the step boundary (health.STOP_MAX_S) and then saves
    under its checkpoint watchdog (at least health.MIN_LIMIT_S)."""
    from exatrain.trainer.health import MIN_LIMIT_S, STOP_MAX_S

    return STOP_MAX_S + MIN_LIMIT_S + 30.0


class _StopSignals:
    """SIGTERM, SIGINT and SIGHUP caught while the ranks run (only the main thread can catch signals;
    elsewhere this does nothing): ``got`` lists them; a wake-up pipe (``fd``) ends the supervisor's
    wait at once. The previous handlers come back on exit."""

    def __init__(self) -> None:
        self.got: list[int] = []
        self.fd: int | None = None
        self._fds: tuple[int, int] | None = None
        self._old: dict[int, object] = {}
        self._old_wakeup = -1

    def __enter__(self) -> _StopSignals:
        from exatrain.trainer.health import STOP_SIGNALS

        if threading.current_thread() is not threading.main_thread():
            return self
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        self._fds, self.fd = (r, w), r
        self._old = {sig: signal.signal(sig, self._caught) for sig in STOP_SIGNALS}
        self._old_wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        return self

    def _caught(self, signum: int, frame: object) -> None:
        self.got.append(int(signum))

    def drain(self) -> None:
        if self.fd is None:
            return
        try:
            while os.read(self.fd, 512):
                pass
        except BlockingIOError:
            pass

    def __exit__(self, *exc: object) -> None:
        if self._fds is None:
            return
        signal.set_wakeup_fd(self._old_wakeup)
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        for fd in self._fds:
            os.close(fd)
        self._fds, self.fd = None, None


def _supervise(
    procs: list, run_dir: Path, world: int, stall_s: float | None, signals: _StopSignals | None = None
) -> _Outcome:
    """Wait for the ranks (see launch_local); pass a stop signal on to them, kill them on a second one;
    kill what is left on the way out."""
    from multiprocessing.connection import wait

    from exatrain.trainer import failures

    signals = signals or _StopSignals()
    out = _Outcome()
    first_fail: float | None = None
    mark: tuple = ()
    moved = time.monotonic()
    stop_at: float | None = None
    handled = 0  # stop signals acted on
    try:
        while any(p.exitcode is None for p in procs):
            wait(
                [p.sentinel for p in procs if p.exitcode is None] + ([signals.fd] if signals.fd is not None else []),
                timeout=0.5,
            )
            signals.drain()
            now = time.monotonic()
            codes = [p.exitcode for p in procs]
            beats, fails = failures.read_ranks(run_dir, world)
            alive = [r for r, c in enumerate(codes) if c is None]
            if len(signals.got) > handled:
                if not handled:  # the first: every rank stops after the step it is in
                    out.interrupted = signals.got[0]
                    _forward(procs, alive, beats, out.interrupted, out)
                    stop_at = now + _stop_backstop_s()
                else:  # a second: at once
                    _kill(procs, alive, out)
                handled = len(signals.got)
                continue
            progress = (
                tuple(codes),
                tuple(
                    sorted(
                        (r, b.get("run"), b.get("completed"), b.get("seq"), b.get("cpu_s")) for r, b in beats.items()
                    )
                ),
            )
            if progress != mark:
                mark, moved = progress, now
            if first_fail is None and any(c not in (None, 0) for c in codes):
                first_fail = now
                # A known cause: a signal, an error, an interrupt, or a watchdog that named the ranks
                # that did not arrive (a frozen rank records nothing, and its last heartbeat may be
                # in a phase with a long limit: waiting for it to go stale would only add minutes).
                # After a stop signal the ranks end themselves (the backstop above stays).
                caused = any(c is not None and c < 0 for c in codes) or any(
                    f.get("kind") in ("error", "interrupted", "hung") for f in fails.values()
                )
                limits = [float(b.get("limit_s", 300.0)) + 3 * float(b.get("beat_s", 5.0)) for b in beats.values()]
                if not out.interrupted:
                    stop_at = now + (CAUSE_GRACE_S if caused else max(limits, default=300.0) + 30.0)
            if first_fail is not None or out.interrupted:
                wall = time.time()
                stale = [
                    r for r in alive if r in beats and wall - float(beats[r]["time"]) > failures.stale_after(beats[r])
                ]
                if (first_fail is not None and len(stale) == len(alive)) or (stop_at is not None and now > stop_at):
                    _kill(procs, alive, out)
            elif stall_s is not None and now - moved > stall_s:
                out.stalled = True
                _kill(procs, alive, out)
    finally:
        _kill(procs, [r for r, p in enumerate(procs) if p.exitcode is None], out)
        for p in procs:
            p.join(30)
    return out


def _forward(procs: list, ranks: Sequence[int], beats: Mapping[int, dict], signum: int, out: _Outcome) -> None:
    """Pass a stop signal on to the ranks whose monitor runs (they have a heartbeat); a rank still
    starting has nothing to save and is killed (a signal there would end it with a traceback)."""
    starting = [r for r in ranks if r not in beats]
    for r in ranks:
        if r not in starting:
            try:
                os.kill(procs[r].pid, signum)
            except ProcessLookupError:
                pass
    _kill(procs, starting, out)


def _kill(procs: list, ranks: Sequence[int], out: _Outcome) -> None:
    for r in ranks:
        if procs[r].exitcode is None:
            out.killed.add(r)
            procs[r].kill()
    for r in ranks:
        procs[r].join(30)


def _spawned(rank: int, world: int, port: int, configs: tuple[TrainConfig, ...], run_dir: str) -> None:
    """One spawned rank: stderr to its log (before torch is imported, so all of its noise lands there),
    its monitor, the process group, every config in turn. A failure ends the process (RankMonitor.end)."""
    from exatrain.trainer import failures

    _stderr_to(failures.log_path(Path(run_dir), rank), rank)
    import multiprocessing

    import torch.distributed as dist

    from exatrain.trainer.health import RankMonitor, Terminated
    from exatrain.trainer.train import train

    launcher = multiprocessing.parent_process()  # its sentinel: readable once the launcher is gone
    monitor = RankMonitor(
        rank, world, Path(run_dir), supervised=True, launcher_fd=None if launcher is None else launcher.sentinel
    )
    monitor.new_run(0, configs[0])
    monitor.start()
    try:
        _prepare_rank(configs[0], rank)
        dist.init_process_group(
            backend(configs[0].device), init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        for i, config in enumerate(configs):
            if i:
                if monitor.stop_signal:  # asked to stop during the last step of the run before
                    raise Terminated(monitor.stop_signal)
                monitor.new_run(i, config)
            train(config, rank, monitor)
            gc.collect()
    except BaseException as exc:  # noqa: B036 - every way out of a rank is recorded (end() exits)
        _end_rank(monitor, exc)
    monitor.stop()
    dist.destroy_process_group()


def _end_rank(monitor, exc: BaseException) -> None:
    """Record how the rank ended and end it (RankMonitor.end): bad input as its own one line and exit
    status, a stop at a step boundary or an interrupt as 128 + the signal, a collective error that means
    a lost peer as such, anything else as the rank's own failure (its traceback into the rank's log)."""
    import traceback

    from exatrain.trainer.failures import compact, is_peer_loss
    from exatrain.trainer.health import Stopped, Terminated

    if isinstance(exc, UserError):
        monitor.end("error", str(exc), exc.exit_code, user_error=True)
    if isinstance(exc, Stopped):
        monitor.end("interrupted", exc.cause, 128 + exc.signum, stopped_after=exc.step, signalled=sorted(exc.votes))
    if isinstance(exc, KeyboardInterrupt):
        monitor.end("interrupted", "interrupted (SIGINT)", 130)
    if isinstance(exc, Terminated):
        monitor.end(*monitor.terminated(exc.signum))
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    cause = compact(exc)
    monitor.end("peer" if is_peer_loss(cause) else "error", cause, 4)


def _stderr_to(path: Path, rank: int) -> int:
    """Send this process's stderr (fd 2, so C++ and child output too) to ``path``, appended to; returns
    a descriptor of the stderr it had (for a report to the terminal)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = os.dup(2)
    sys.stderr.flush()
    os.dup2(fd, 2)
    os.close(fd)
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    sys.stderr.write(f"--- exatrain rank {rank}, pid {os.getpid()}, started {stamp}\n")
    sys.stderr.flush()
    return saved


def _prepare_rank(config: TrainConfig, local_rank: int) -> None:
    """One GPU per rank, bound before NCCL starts; one thread per CPU rank when so asked."""
    import torch

    from exatrain.trainer.parallel.mesh import cuda_index

    if config.device == "cuda":
        torch.cuda.set_device(cuda_index(local_rank))
    elif os.environ.get("OMP_NUM_THREADS") == "1":
        torch.set_num_threads(1)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Set environment variables for the processes started inside, then restore them."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


__all__ = ["DistEnv", "backend", "dist_env", "launch_local", "run_dir_of", "run_distributed"]
