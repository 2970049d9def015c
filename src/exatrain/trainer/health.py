"""One rank's health: where it is (step and phase), a heartbeat its launcher and peers can read, a
watchdog for a phase that does not complete, and the straggler windows.

**Phases.** The step loop enters ``data``, ``forward``/``backward`` per micro-batch (one
``forward/backward`` for a whole pipeline schedule), ``grad-sync`` (gradient reductions, tied-embedding
sync, the global norm), ``optimizer``, ``metrics`` (the loss all-reduce, memory gather, straggler
window) and ``checkpoint``; ``setup`` covers building and loading, ``done`` the end of a run. Entering a
phase is two attribute writes: the main thread never touches a file or a lock for it.

**Heartbeat and watchdog.** A daemon thread wakes every ``beat_s`` (the limit / 20, between 1 and
15 s), writes heartbeat-R.json into the run directory (failures.py) and checks the phase's age. A
phase older than its limit — ``watchdog_s``, or by default max(300 s, 20 x the median step so far);
setup and checkpoint phases at least 300 s, since loading and saving may take minutes; every phase of a
compiled run's first step at least 30 minutes, since torch.compile compiles the blocks there, possibly
in worker processes, so that neither the wall clock nor the step thread's CPU time tells compiling from
waiting — means a collective that some rank did not join. The thread then reads every rank's
heartbeat, names the ranks that did not arrive (failures.not_arrived), writes this rank's failure
record and ends the process with exit status 5. A blocked collective cannot be cancelled from Python
(gloo has no abort), so ending the process is the only clean way out; the last published checkpoint is
untouched (a save publishes by renaming a finished directory).

**Stopping on a signal.** SIGTERM, SIGINT and SIGHUP during the step loop ask for a stop; they do not
end the rank where it is, since a rank cannot leave a collective alone. The request rides on the
step's last collective (the peak-memory all_gather, ``stop_vote``), so every rank learns at the same
step boundary that some rank was asked to stop, and all stop there: the checkpoint of that step is
saved when the run has a checkpoint directory, then each rank ends as interrupted (``Stopped``),
exit status 128 + the signal's number. A rank that does not reach the boundary within
``stop_grace_s`` (a peer gone, a collective stuck) ends where it is, as before. Outside the step loop
(setup, the end of a run) a signal ends the rank at once. The heartbeat thread reads the signal
wake-up pipe, so it sees the signal even while the main thread is blocked inside a collective, and it
enforces the grace. A rank spawned by ``launch_local`` also watches its launcher through the pipe
that multiprocessing keeps open to it (``launcher_fd``): when the launcher is gone, however it ended,
the rank stops as on SIGHUP and reports the run itself, so no rank outlives its launcher.

**Computing is not hanging (CPU ranks).** A rank blocked in a gloo collective or a pipeline receive
sleeps: its main thread, where a CPU rank's whole compute runs, uses no CPU. A rank that the operating
system gives little CPU (a loaded machine, a low priority) still uses some: at the lowest priority on a
busy core, about 1.5% of it, some 15 ms a second. So on CPU ranks the watchdog counts a phase's age from
the later of its start and the last beat at which this rank's main thread (the one that runs the
steps), or a peer's (the ``cpu_s`` of its heartbeat, read at every beat), had used ``CPU_MOVED_S`` CPU
seconds since the beat before: a slow step is not a hang, a collective nobody computes towards is. A
phase still computing past ``CPU_CAP`` times its limit is ended all the same (a loop that never reaches
its collective). CUDA ranks keep the wall-clock age: a host thread waiting on the GPU may spin, so its
CPU time says nothing there.

**Stragglers.** Each step is split into compute time and wait time. On the CPU (gloo) compute is the
main thread's CPU time (``time.thread_time``): with one intra-op thread per rank (how exatrain runs CPU
ranks) all of a rank's compute runs on that thread, while a rank blocked in a gloo collective or a
pipeline receive sleeps without CPU; wait is the rest of the step's wall time (which also holds time
the operating system gave to other processes). On CUDA, CUDA events recorded on the current stream at
each phase boundary time the data, forward, backward and optimizer phases as compute; the rest of the
step (gradient reductions, the loss all-reduce, host waits) is wait. The trainer already synchronises
the device once per step to time it, so the events are read then, with no extra synchronisation; TP
and pipeline collectives issued inside forward and backward count as compute there. Every
``straggler_every`` steps one all_gather of three floats per rank (compute, wait, steps) gives every
rank the window's table. A rank is **slow** in a window when its compute per step exceeds 1.3 x the
median of its stage peers' (the other ranks holding the same pipeline stage, which do the same work;
a stage held by one rank is not judged) and exceeds it by at least 2 ms per step; a slow rank is
named a **straggler** when it is slow in two windows running.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import statistics
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Mapping

from exatrain.trainer import failures
from exatrain.trainer.stragglers import (
    COMPUTE_PHASES,
    SLOW_RANK_ENV,
    SLOW_RATIO,
    StepClock,
    StragglerWindows,
    slow_injection,
    slow_ranks,
    spin_cpu,
    straggler_lines,
)

PHASES = (
    "setup",
    "data",
    "forward",
    "backward",
    "forward/backward",
    "grad-sync",
    "optimizer",
    "metrics",
    "checkpoint",
    "stopped",
    "done",
)
LONG_PHASES = frozenset({"setup", "checkpoint", "stopped", "done"})
MIN_LIMIT_S = 300.0  # the watchdog's default floor, and the floor of setup and checkpoint phases
COMPILE_LIMIT_S = 1800.0  # the floor of every phase of a compiled run's first step (torch.compile compiles then)
LIMIT_STEPS = 20  # the default limit: this many median steps (when more than the floor)
CPU_MOVED_S = 0.005  # main-thread CPU seconds between two looks that mean computing (a blocked thread uses none)
CPU_CAP = 10  # a CPU rank's phase still computing past this many watchdog limits is ended all the same
# The signals that stop a run (SIGHUP: the terminal closed; absent on Windows).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))
# How long a stop request waits for the step boundary before the rank ends where it is: STOP_STEPS median
# steps, at least STOP_MIN_S (a first step, a loaded machine) and at most STOP_MAX_S (SLURM's default KillWait
# is 30 s, torchrun's 30 s: a step longer than that needs an earlier signal, e.g. sbatch --signal=TERM@120).
STOP_STEPS = 3
STOP_MIN_S = 10.0
STOP_MAX_S = 120.0
REPORT_WAIT_S = 10.0  # torchrun/srun: how long a rank that does not report waits for the one that does


def thread_cpu_clock(ident: int | None = None) -> int | None:
    """The clock of a thread's CPU time (default: the calling thread's), readable from any thread; None
    where the platform has none."""
    try:
        return time.pthread_getcpuclockid(threading.get_ident() if ident is None else ident)
    except (AttributeError, OSError, TypeError):
        return None


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Terminated(BaseException):
    """SIGTERM or SIGHUP in the main thread outside the step loop: a launcher or scheduler ending the rank
    (like KeyboardInterrupt)."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(f"terminated ({signal_name(signum)})")
        self.signum = int(signum)


class Stopped(BaseException):
    """The ranks agreed at the boundary after ``step`` to stop; ``votes``: the ranks asked to stop, each
    with its signal's number. Raised once that step's checkpoint is saved."""

    def __init__(self, step: int, votes: Mapping[int, int], cause: str, signum: int = 0) -> None:
        super().__init__(cause)
        self.step, self.votes, self.cause = step, dict(votes), cause
        # The exit status's signal: this rank's own, else the one its peers got (the lowest when several)
        self.signum = int(signum) or min(votes.values())


class RankMonitor:
    """One rank's health across the runs of its process (a launch may run several configs in turn).

    ``supervised``: a local launcher reads this rank's files and reports a failure, so the rank only
    records it; otherwise (torchrun, srun) the rank that first claims the run reports it on
    ``report_fd`` (the terminal's stderr, kept aside when stderr goes to the rank's log).
    ``watch``: run the heartbeat/watchdog thread (False for a Trainer built without a launcher)."""

    def __init__(
        self,
        rank: int,
        world: int,
        run_dir: Path | None,
        *,
        supervised: bool,
        watch: bool = True,
        report_fd: int | None = None,
        launcher_fd: int | None = None,
    ) -> None:
        self.rank, self.world, self.run_dir = rank, world, run_dir
        self.supervised, self.watch, self.report_fd = supervised, watch, report_fd
        self.launcher_fd = launcher_fd  # readable (EOF) once the launcher that spawned this rank is gone
        # Stop requests (see the module docstring): the signal asked with, since when (monotonic), in words;
        # ``stoppable``: the step loop runs and can stop at a boundary; ``stopping``: the boundary is reached.
        self.stop_signal = 0
        self.stop_cause = ""
        self._stop_t = 0.0
        self.stoppable = False
        self.stopping = False
        self.versions: dict[str, Any] | None = None  # metrics.torch_versions(), once torch is loaded here
        self.run = 0
        self.context: Any = None  # failures.RunContext of the current run (for a report made here)
        self.config: Any = None
        self.completed = 0  # steps completed (1-based number of the last one)
        self.seq = 0  # phases entered in the current step
        self._at = ("setup", time.monotonic())  # (phase, its start): one attribute, read whole by the thread
        self.watchdog_s = 0.0
        self.compiles = False  # the current run compiles its blocks: its first step's phases get COMPILE_LIMIT_S
        self.step_times: deque[float] = deque(maxlen=50)
        self.started = time.time()
        self._ending = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None
        self._handlers: dict[int, Any] = {}
        self._slow_s = slow_injection(rank)
        self._clock: StepClock | None = None
        self._main_cpu: int | None = None  # the CPU clock of the thread that runs the steps (new_run's caller)
        self._cpu_gated = False  # this run's ranks compute on that thread (CPU): see the module docstring
        self._moved = 0.0  # monotonic time of the last beat at which this rank or a peer used CPU
        self._cpu_seen: dict[int, float] = {}  # rank -> the main-thread CPU seconds last seen

    # --- the main thread's side ---------------------------------------------------------------
    def new_run(self, run: int, config: Any, context: Any = None) -> None:
        """A new config starts in this process: back to setup, step 0."""
        self.run, self.config, self.context = run, config, context
        self.watchdog_s = float(getattr(config, "watchdog_s", 0.0) or 0.0)
        self.compiles = bool(getattr(config, "compile", False))
        self._main_cpu = thread_cpu_clock()
        self._cpu_gated = self._main_cpu is not None and getattr(config, "device", "cpu") == "cpu"
        self._moved, self._cpu_seen = 0.0, {}
        self.completed, self.seq = 0, 0
        self.stoppable = self.stopping = False
        self.step_times.clear()
        if self.versions is None and "torch" in sys.modules:  # for a launcher's RunRecord (failures.py)
            from exatrain.trainer.metrics import torch_versions

            self.versions = torch_versions()
        self.enter("setup")

    @property
    def phase(self) -> str:
        return self._at[0]

    def enter(self, phase: str) -> None:
        self._at = (phase, time.monotonic())
        self.seq += 1
        if self._clock is not None:
            self._clock.mark(phase)
            if self._slow_s and phase in ("forward", "forward/backward") and not self._clock.slowed:
                self._clock.slowed = True
                spin_cpu(self._slow_s)

    def resumed(self, step: int) -> None:
        self.completed = step

    # --- stop requests -------------------------------------------------------------------------------
    def request_stop(self, signum: int, cause: str = "") -> None:
        """Ask the step loop to stop at the next step boundary (the first request counts; more are the same)."""
        if self.stop_signal:
            return
        self.stop_cause = cause or f"interrupted ({signal_name(signum)})"
        self._stop_t = time.monotonic()
        self.stop_signal = int(signum)

    def stop_vote(self) -> int:
        """This rank's vote for the step's last collective: the signal it was asked to stop with, else 0."""
        return self.stop_signal

    def stop_agreed(self, step: int, votes: Mapping[int, int]) -> str:
        """Every rank saw ``votes`` (rank -> signal) after ``step``: the stop begins here (the grace no
        longer runs). Returns the cause the ranks record: this rank's own, else whose signal it was."""

        self.stopping = True
        if self.stop_signal:
            return self.stop_cause
        named = sorted({signal_name(v) for v in votes.values()})
        return f"interrupted ({'/'.join(named)} to {failures.ranks_text(sorted(votes))})"

    def stop_grace_s(self) -> float:
        """How long a stop request waits for the step boundary (STOP_STEPS median steps, clamped)."""
        recent = list(self.step_times)
        steps = STOP_STEPS * statistics.median(recent) if recent else 0.0
        return min(STOP_MAX_S, max(STOP_MIN_S, steps))

    def _stop_overdue(self) -> bool:
        """A stop request that has waited past its grace for the boundary (a save in progress restarts
        the wait: a published checkpoint is worth the time, and the save has its own watchdog)."""
        if not self.stop_signal or self.stopping or not self.stoppable:
            return False
        now = time.monotonic()
        if self.phase == "checkpoint":
            self._stop_t = max(self._stop_t, now)
            return False
        return now - self._stop_t > self.stop_grace_s()

    def attach_clock(self, clock: "StepClock | None") -> None:
        self._clock = clock

    def step_begin(self) -> None:
        self.seq = 0
        if self._clock is not None:
            self._clock.begin()
        self.enter("data")

    def step_end(self, step_s: float) -> tuple[float, float] | None:
        """The step is complete: count it; returns its (compute, wait) seconds when a clock runs."""
        self.completed += 1
        self.step_times.append(step_s)
        return self._clock.end() if self._clock is not None else None

    def limit_s(self, phase: str | None = None) -> float:
        """The watchdog's limit for a phase (see the module docstring)."""
        if self.watchdog_s > 0:
            limit = self.watchdog_s
        else:
            recent = list(self.step_times)
            limit = max(MIN_LIMIT_S, LIMIT_STEPS * statistics.median(recent)) if recent else MIN_LIMIT_S
        if (phase or self.phase) in LONG_PHASES:
            limit = max(limit, MIN_LIMIT_S)
        if self.compiles and not self.step_times:
            limit = max(limit, COMPILE_LIMIT_S)
        return limit

    def beat_s(self) -> float:
        return min(15.0, max(1.0, self.limit_s("data") / 20))

    def state(self) -> dict[str, Any]:
        """This rank's heartbeat: where it is, since when, and what its watchdog allows."""
        phase, t0 = self._at
        beat = {
            "rank": self.rank,
            "run": self.run,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "completed": self.completed,
            "phase": phase,
            "seq": self.seq,
            "phase_s": round(time.monotonic() - t0, 3),
            "limit_s": self.limit_s(phase),
            "beat_s": self.beat_s(),
            "time": time.time(),
        }
        if (cpu := self._cpu_now()) is not None:
            beat["cpu_s"] = round(cpu, 4)
        return beat

    def _cpu_now(self) -> float | None:
        """CPU seconds of the thread that runs the steps (None: no clock, or that thread has ended)."""
        try:
            return time.clock_gettime(self._main_cpu) if self._main_cpu is not None else None
        except OSError:
            return None

    def note_cpu(self) -> None:
        """CPU ranks, each beat: remember the beat when this rank's main thread, or a peer's (from its
        heartbeat), used CPU since the last look."""
        own = self._cpu_now() if self._cpu_gated else None
        if own is None:
            return
        moved = self._advanced(self.rank, own)
        if self.run_dir is not None and self.world > 1:  # every beat, so each peer's last value is fresh
            beats, _ = failures.read_ranks(self.run_dir, self.world)
            for r, beat in beats.items():
                if r != self.rank and int(beat.get("run", -1)) == self.run and "cpu_s" in beat:
                    moved = self._advanced(r, float(beat["cpu_s"])) or moved
        if moved:
            self._moved = time.monotonic()

    def _advanced(self, rank: int, cpu_s: float) -> bool:
        """Whether ``rank``'s main thread used CPU_MOVED_S since the last look at it."""
        seen, self._cpu_seen[rank] = self._cpu_seen.get(rank), cpu_s
        return seen is not None and cpu_s - seen >= CPU_MOVED_S

    def overdue(self) -> tuple[float, bool] | None:
        """(the current phase's age, whether it was still computing) when the watchdog ends the rank for
        it, else None: older than its limit counted from the last beat that saw CPU used (CPU ranks) or
        from its start, or older than CPU_CAP limits however busy."""
        phase, t0 = self._at
        now = time.monotonic()
        limit = self.limit_s(phase)
        waited = now - t0
        idle = now - max(t0, self._moved) if self._cpu_gated else waited
        if idle > limit:
            return waited, False
        return (waited, True) if waited > CPU_CAP * limit else None

    # --- the heartbeat / watchdog thread ------------------------------------------------------------
    def start(self) -> None:
        """Start the heartbeat thread, and route SIGTERM/SIGINT/SIGHUP to it through the wake-up pipe (call
        from the main thread)."""
        if not self.watch or self._thread is not None:
            return
        r, w = os.pipe()
        os.set_blocking(w, False)
        self._wake = (r, w)
        self._handlers = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._loop, name="exatrain-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        assert self._wake is not None
        os.write(self._wake[1], b"\0")
        self._thread.join(timeout=30)
        signal.set_wakeup_fd(-1)
        for sig, handler in self._handlers.items():
            signal.signal(sig, handler)
        for fd in self._wake:
            os.close(fd)
        self._thread, self._wake = None, None

    def _on_signal(self, signum: int, frame: Any) -> None:
        """A stop signal in the main thread: in the step loop a stop request (the boundary ends the rank);
        elsewhere an exception the rank's guard records, unless the rank is already ending (then its record
        and report are finished first)."""
        if self._ending.locked():
            return
        if self.stoppable:
            self.request_stop(signum)
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(signum)

    def _loop(self) -> None:
        assert self._wake is not None
        timeout = 0.0  # the first heartbeat at once
        while not self._stop.is_set():
            watched = [self._wake[0]] + ([self.launcher_fd] if self.launcher_fd is not None else [])
            ready, _, _ = select.select(watched, [], [], timeout)
            timeout = self.beat_s() if not self.stop_signal or self.stopping else min(self.beat_s(), 0.25)
            if self._wake[0] in ready:
                for num in os.read(self._wake[0], 64):
                    if num in STOP_SIGNALS and not self._stop.is_set():
                        self._signalled(num)
            if self.launcher_fd is not None and self.launcher_fd in ready and not self._stop.is_set():
                self._launcher_gone()
            if self._stop.is_set():
                return
            if self._stop_overdue():
                self.end(*self.terminated(self.stop_signal), cause_of=self.stop_cause)
            if self.run_dir is not None:
                try:
                    failures.write_json(self.run_dir / failures.HEARTBEAT.format(rank=self.rank), self.state())
                except OSError:
                    pass
            self.note_cpu()
            if (late := self.overdue()) is not None:
                self._hang(*late)

    def _hang(self, waited: float, computing: bool = False) -> None:
        beats, _ = failures.read_ranks(self.run_dir, self.world)
        beats[self.rank] = self.state()
        gone, why = failures.not_arrived(beats, self.world, time.time())
        cause = (
            f"waited {waited:.0f} s {failures.where(self.state())} (watchdog limit {self.limit_s():.0f} s"
            + (f"; still computing after {CPU_CAP} x the limit)" if computing else ")")
            + (f"; did not arrive: {failures.ranks_text(gone)}" if gone else "")
        )
        self.end("hung", cause, 5, not_arrived=[r for r in gone if r != self.rank], limit_s=self.limit_s())

    def _signalled(self, signum: int) -> None:
        """The heartbeat thread saw a stop signal: a stop request in the step loop, else the end now. After
        a hangup the terminal is gone: the rank's stdout (progress lines) goes nowhere rather than fail."""
        if signum == getattr(signal, "SIGHUP", None) and _isatty(1):
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, 1)
            os.close(fd)
        if self.stoppable:
            self.request_stop(signum)
        else:
            self.end(*self.terminated(signum))

    def _launcher_gone(self) -> None:
        """The launcher that spawned this rank has ended: nobody will read the rank files, so this rank
        reports (as under torchrun), and stops as on SIGHUP."""
        self.launcher_fd = None
        self.supervised = False
        if self.context is None and self.config is not None:
            config = self.config
            self.context = failures.RunContext(
                plan=config.plan,
                run=self.run,
                checkpoint_dir=config.checkpoint_dir,
                run_dir=self.run_dir,
                resume=failures.resume_command(sys.argv),
            )
        signum = getattr(signal, "SIGHUP", signal.SIGTERM)
        cause = "interrupted (the launcher ended)"
        if self.stoppable:
            self.request_stop(signum, cause)
        else:
            self.end("interrupted", cause, 128 + signum)

    def terminated(self, signum: int = signal.SIGTERM) -> tuple[str, str, int]:
        """How a stop signal that ends the rank where it is gets recorded: SIGINT, and anything under a
        local launcher, as an interrupt (someone stopped the run); SIGTERM/SIGHUP under torchrun/srun
        usually as the launcher stopping the survivors of another rank's failure, so a consequence
        (``terminated``) that the report looks past for its cause."""
        kind = "interrupted" if self.supervised or signum == signal.SIGINT else "terminated"
        return (kind, f"interrupted ({signal_name(signum)})", 128 + int(signum))

    # --- ending the rank ------------------------------------------------------------------------------------
    def end(
        self, kind: str, cause: str, exit_code: int, *, user_error: bool = False, cause_of: str = "", **extra: Any
    ) -> None:
        """Record how this rank ends (failure-R.json and a line in its log), report it when no launcher
        will (the first rank to claim the run), and end the process with ``exit_code``. Never returns:
        a second caller (another thread) waits here until the process is gone. ``cause_of``: a stop
        request's own words, in place of ``cause``."""
        if not self._ending.acquire(blocking=False):
            threading.Event().wait()
        cause = cause_of or cause

        record = {
            **self.state(),
            "kind": kind,
            "cause": cause,
            "exit_code": exit_code,
            "user_error": user_error,
            **({"versions": self.versions} if self.versions else {}),
            **extra,
        }
        try:
            if self.run_dir is not None:
                failures.write_failure(self.run_dir, record)
            sys.stderr.write(f"exatrain rank {self.rank}: {kind} {failures.where(record)}: {cause}\n")
            if not self.supervised:
                exit_code = self._report(kind, record) or exit_code
        except BaseException as exc:  # ending must not fail: say why in the log and go
            sys.stderr.write(f"exatrain rank {self.rank}: could not record the failure ({exc!r})\n")
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(exit_code)

    def _report(self, kind: str, record: Mapping[str, Any]) -> int | None:
        """torchrun/srun: no launcher of ours reads the files, so one rank reports, and ends with the
        report's exit status (returned; None when another rank reports). A rank with the cause (its own
        error, the watchdog, a stop all ranks agreed on) claims at once; a rank hit by a peer's failure or
        a signal first gives the rank with the cause a few beats to claim. A rank that does not report
        waits until the report is written (``failures.wait_reported``)."""
        from exatrain.errors import error_line

        ctx = self.context
        if ctx is None:
            return None
        if self.run_dir is None:
            if self.rank != 0 and (kind != "error" or record.get("user_error")):
                return None
        else:
            if kind not in ("error", "hung") and record.get("stopped_after") is None:  # an agreed stop: no wait
                time.sleep(min(10.0, 3 * self.beat_s()))
            if not failures.claim(self.run_dir, self.run):
                failures.wait_reported(self.run_dir, self.run, REPORT_WAIT_S)
                return None
        try:
            beats, fails = failures.read_ranks(self.run_dir, self.world)
            beats[self.rank] = self.state()
            fails[self.rank] = dict(record)
            diag = failures.diagnose(ctx, beats, fails)
            config = self.config
            failures.write_failed_record(
                config.metrics_file,
                ctx.plan,
                diag,
                device=config.device,
                wall_s=time.time() - self.started,
                measure_after=config.measure_after,
            )
            line = error_line("train", diag.error)
            os.write(self.report_fd if self.report_fd is not None else 2, line.encode())
        finally:
            failures.mark_reported(self.run_dir, self.run)
        return diag.error.exit_code


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


__all__ = [
    "COMPUTE_PHASES",
    "PHASES",
    "RankMonitor",
    "SLOW_RANK_ENV",
    "SLOW_RATIO",
    "STOP_SIGNALS",
    "StepClock",
    "Stopped",
    "StragglerWindows",
    "Terminated",
    "signal_name",
    "slow_ranks",
    "straggler_lines",
]
