"""A run directory's per-rank files, and a failed run told in one line.

    RUN_DIR/                 CHECKPOINT_DIR/ranks, else METRICS.ranks beside the metrics file
      rank-3.log             rank 3's stderr (appended to; each start adds a header line)
      heartbeat-3.json       rank 3's last heartbeat: run, steps completed, phase and its age, pid, limit
      failure-3.json         how rank 3 ended when it did not finish: kind, cause, step, phase, exit status
      reported-0             created (O_EXCL) by the one rank that reports run 0's failure (torchrun/srun);
                             "done" added once its RunRecord and line are written

The heartbeat and failure files are written aside and renamed into place, so a reader never sees half
of one. ``diagnose`` reads them (with the exit statuses, when a local launcher knows them) and picks the
one rank to name, in this order: an interrupt (Ctrl-C, a scheduler's SIGTERM, a hangup); bad input a rank found
(the same one line as if the CLI had found it); a rank's own exception, the earliest; a rank killed by
a signal; a hang (the ranks that did not arrive); a rank that exited without a record; a rank that lost
a peer (a collective error such as gloo's "Connection closed by peer"), the earliest. ``tail`` adds
where the last checkpoint is and how to resume; ``write_failed_record`` appends the RunRecord: status
``interrupted`` for a run a signal stopped (nothing went wrong with it: it is resumable, and a run that
measures or calibrates leaves it out like any run that did not finish), else ``failed`` (``oom``).
Nothing here imports torch at module level.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from exatrain.errors import Interrupted, RankFailed, RankHung, UserError
from exatrain.plan import Plan
from exatrain.trainer.failed_runs import run_lines, summarize_windows, versions_of, write_failed_record

# Messages of collective errors that mean "a peer went away", not "this rank did something wrong"
# (gloo's TCP transport, NCCL's abort and remote-error reports, the c10d store).
PEER_LOST = re.compile(
    r"connection (closed|reset) by peer|broken pipe|econnreset|connection refused|"
    r"communicator was aborted|remote process exited|nccl.*remote error|socket timeout|"
    r"peer closed|transport retry|failed to recv|failed to send|read error|"
    r"client socket.*(closed|reset)",
    re.IGNORECASE,
)
HEARTBEAT = "heartbeat-{rank}.json"
FAILURE = "failure-{rank}.json"
LOG = "rank-{rank}.log"
CLAIM = "reported-{run}"


def run_dir_for(checkpoint_dir: str | None, metrics_file: str | None) -> Path | None:
    """Where a run's rank files go when the config names no run_dir: CHECKPOINT_DIR/ranks (shared by
    every node, like the checkpoints), else METRICS.ranks beside the metrics file; None without either."""
    if checkpoint_dir:
        return Path(checkpoint_dir) / "ranks"
    if metrics_file:
        m = Path(metrics_file)
        return m.with_name(m.stem + ".ranks")
    return None


def log_path(run_dir: Path, rank: int) -> Path:
    return run_dir / LOG.format(rank=rank)


def prepare(run_dir: Path) -> None:
    """Create the run directory and remove the heartbeats, failure records and report claims of an
    earlier start (rank logs are kept: they are appended to)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for pattern in ("heartbeat-*.json", "failure-*.json", "reported-*", ".*.tmp"):
        for p in run_dir.glob(pattern):
            p.unlink(missing_ok=True)


def write_json(path: Path, obj: Mapping[str, Any]) -> None:
    """Write aside, then rename: a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj), encoding="utf-8")
    os.replace(tmp, path)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def read_ranks(run_dir: Path | None, world: int) -> tuple[dict[int, dict], dict[int, dict]]:
    """(heartbeats, failure records) by rank; absent files are left out."""
    beats: dict[int, dict] = {}
    fails: dict[int, dict] = {}
    if run_dir is None:
        return beats, fails
    for r in range(world):
        if (b := _read(run_dir / HEARTBEAT.format(rank=r))) is not None:
            beats[r] = b
        if (f := _read(run_dir / FAILURE.format(rank=r))) is not None:
            fails[r] = f
    return beats, fails


def write_failure(run_dir: Path, record: Mapping[str, Any]) -> None:
    write_json(run_dir / FAILURE.format(rank=record["rank"]), record)


def claim(run_dir: Path, run: int) -> bool:
    """True for the first caller only (an exclusive create): the rank that reports a run's failure."""
    try:
        fd = os.open(run_dir / CLAIM.format(run=run), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    except OSError:  # no run directory to coordinate in: report anyway
        return True
    os.write(fd, f"{os.getpid()}\n".encode())
    os.close(fd)
    return True


def mark_reported(run_dir: Path | None, run: int) -> None:
    """The reporting rank has written the RunRecord and the line (see ``wait_reported``)."""
    if run_dir is None:
        return
    try:
        with open(run_dir / CLAIM.format(run=run), "a", encoding="utf-8") as f:
            f.write("done\n")
    except OSError:
        pass


def wait_reported(run_dir: Path | None, run: int, timeout_s: float) -> bool:
    """Wait (at most ``timeout_s``) until the reporting rank is done: a rank that ends first would let
    a launcher that kills the other tasks when one exits (srun --kill-on-bad-exit) cut the report short."""
    if run_dir is None:
        return True
    end = time.monotonic() + timeout_s
    while True:
        try:
            if "done" in (run_dir / CLAIM.format(run=run)).read_text(encoding="utf-8"):
                return True
        except OSError:
            pass
        if time.monotonic() > end:
            return False
        time.sleep(0.05)


def is_peer_loss(message: str) -> bool:
    """Whether an exception's message says a peer went away (a consequence, not a cause)."""
    return bool(PEER_LOST.search(message))


def rank_label(rank: int, plan: Plan) -> str:
    """``rank 3 (tp 1, pp 0, dp 1)``: a rank and its place in the mesh (ParallelDims' rank order)."""
    from exatrain.trainer.parallel.ranks import coordinates, cp_coordinate

    pp, dp, tp = coordinates(rank, plan)
    cp = f", cp {cp_coordinate(rank, plan)}" if plan.cp > 1 else ""
    return f"rank {rank} (tp {tp}, pp {pp}, dp {dp}{cp})"


def ranks_text(ranks: Sequence[int]) -> str:
    """``rank 3`` / ``ranks 0, 1, 2``, or ``ranks 0-63`` for a run of consecutive ranks."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 3 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def where(state: Mapping[str, Any]) -> str:
    """What a rank was doing, from its heartbeat or failure record: the phase and the step."""
    phase, done = state.get("phase", "?"), int(state.get("completed", 0))
    if phase == "setup":
        return "in setup" + (f" (resuming after step {done})" if done else "")
    if phase == "checkpoint":
        return f"saving the checkpoint of step {done}"
    if phase == "done":
        return f"finishing after step {done}"
    if phase == "stopped":
        return f"after step {done}"
    return f"in {phase} of step {done + 1}"


def stale_after(beat: Mapping[str, Any]) -> float:
    """Seconds without a new heartbeat after which a rank counts as stopped (frozen or dead): three
    missed beats, and at least half its watchdog limit, so a busy machine's scheduling does not count."""
    return max(3 * float(beat.get("beat_s", 5.0)), 0.5 * float(beat.get("limit_s", 300.0)))


def not_arrived(beats: Mapping[int, Mapping[str, Any]], world: int, now: float) -> tuple[list[int], str]:
    """The ranks that did not arrive where their peers wait, and why: those with no heartbeat, or one
    older than ``stale_after`` (stopped or dead); failing those, the live ranks furthest behind (by
    steps completed, then by phases entered in the step), when not every rank is at the same place."""
    stale = [r for r in range(world) if r not in beats or now - float(beats[r]["time"]) > stale_after(beats[r])]
    if stale:
        return stale, "stale"
    progress = {r: (int(b.get("completed", 0)), int(b.get("seq", 0))) for r, b in beats.items()}
    low = min(progress.values())
    behind = [r for r, p in progress.items() if p == low]
    if len(behind) == len(progress):
        return [], "level"
    return behind, "behind"


@dataclass(frozen=True)
class Diagnosis:
    """The one rank named, the exception to raise (its message the one line), the RunRecord's failure."""

    error: UserError
    failure: dict[str, Any]
    run: int


@dataclass(frozen=True)
class RunContext:
    """What the one line needs beside the rank files: the run's plan and paths, how to resume."""

    plan: Plan
    run: int
    checkpoint_dir: str | None
    run_dir: Path | None
    resume: str | None  # the command that resumes, or a sentence; None: nothing to say


class _Evidence:
    """The rank files of one run read together: each rank's state, the failures by kind in time order, and the
    failure record and one line (``failed``) for the rank a rule names."""

    def __init__(
        self,
        ctx: RunContext,
        beats: Mapping[int, dict],
        fails: Mapping[int, dict],
        codes: dict[int, int | None],
        now: float,
    ) -> None:
        self.ctx, self.codes, self.now, self.world = ctx, codes, now, ctx.plan.gpus
        self.beats = {r: b for r, b in beats.items() if int(b.get("run", 0)) == ctx.run}
        self.fails = {r: f for r, f in fails.items() if int(f.get("run", 0)) == ctx.run}
        self.end = tail(ctx)

    def state(self, r: int) -> dict:
        """A rank's own record; or its heartbeat, unless its peers have completed more steps since (a
        heartbeat is up to a beat old): then the step its peers were in, the phase unknown."""
        if r in self.fails:
            return dict(self.fails[r])
        others = [x for q, x in (*self.beats.items(), *self.fails.items()) if q != r]
        top = max((int(x.get("completed", 0)) for x in others), default=0)
        b = self.beats.get(r)
        if b is not None and int(b.get("completed", 0)) >= top:
            return dict(b)
        in_setup = all(x.get("phase") == "setup" for x in others)
        return {"completed": top, "phase": "setup" if in_setup else "unknown"}

    def failure(
        self, r: int, kind: str, cause: str, code: int, state_: Mapping[str, Any] | None = None, **extra: Any
    ) -> dict[str, Any]:
        """The RunRecord's failure for rank ``r``: where it sits in the layout, its step and phase, the cause."""
        from exatrain.trainer.parallel.ranks import coordinates

        s = self.state(r) if state_ is None else state_
        pp, dp, tp = coordinates(r, self.ctx.plan)
        log = str(log_path(self.ctx.run_dir, r)) if self.ctx.run_dir is not None else ""
        return {
            "rank": r,
            "tp": tp,
            "pp": pp,
            "dp": dp,
            "step": _step_of(s),
            "phase": s.get("phase", "?"),
            "kind": kind,
            "cause": cause,
            "exit_code": code,
            "log": log,
            **extra,
        }

    def by_time(self, kind: str) -> list[int]:
        """The ranks that recorded a failure of ``kind``, the earliest first."""
        return sorted(
            (r for r, f in self.fails.items() if f.get("kind") == kind), key=lambda r: (self.fails[r]["time"], r)
        )

    def logs(self, r: int) -> str:
        return f"; log: {log_path(self.ctx.run_dir, r)}" if self.ctx.run_dir is not None else ""

    def failed(self, r: int, kind: str, cause: str, verb: str = "failed") -> Diagnosis:
        """Rank ``r`` failed (or lost a peer) where it was, for ``cause``: RankFailed's one line."""
        ctx = self.ctx
        return Diagnosis(
            RankFailed(f"{rank_label(r, ctx.plan)} {verb} {_at(self.state(r))}: {cause}{self.end}{self.logs(r)}"),
            self.failure(r, kind, cause, RankFailed.exit_code),
            ctx.run,
        )


def _interrupted(ev: _Evidence, interrupted: bool | int) -> Diagnosis | None:
    """A stop signal the launcher or a rank got: the run was interrupted, not broken."""
    interrupts = ev.by_time("interrupted")
    if not (interrupted or interrupts):
        return None
    fails = ev.fails
    sig = signal.SIGINT if interrupted is True else int(interrupted)
    r = interrupts[0] if interrupts else min(range(ev.world), key=lambda q: (-_progress(ev.state(q)), q))
    if interrupts:
        cause, sig = fails[r]["cause"], _signal_of(fails[r], sig)
    else:
        cause = f"interrupted ({_signal_name(sig)})"
    error = Interrupted(f"{cause} {where(ev.state(r))}{ev.end}", sig)
    extra = {"stopped_after": fails[r]["stopped_after"]} if interrupts and "stopped_after" in fails[r] else {}
    return Diagnosis(error, ev.failure(r, "interrupted", cause, error.exit_code, **extra), ev.ctx.run)


def _user_error(ev: _Evidence) -> Diagnosis | None:
    """A rank refused bad input: its own one line and exit status, as the rank would have printed them."""
    fails = ev.fails
    users = sorted(
        (r for r, f in fails.items() if f.get("kind") == "error" and f.get("user_error")),
        key=lambda r: (fails[r]["time"], r),
    )
    if not users:
        return None
    r = users[0]
    exc = UserError(fails[r]["cause"])  # the line the rank would have printed itself
    exc.exit_code = int(fails[r]["exit_code"])
    return Diagnosis(exc, ev.failure(r, "error", fails[r]["cause"], exc.exit_code), ev.ctx.run)


def _peer_loss(ev: _Evidence) -> Diagnosis | None:
    """Ranks that lost a peer or were terminated: the rank that went quiet without a word if there is one,
    else a stop every rank was told of, else the first rank that lost its peer."""
    fails = ev.fails
    peers = ev.by_time("peer") + ev.by_time("terminated")
    gone, why = not_arrived(ev.beats, ev.world, ev.now)
    gone = [r for r in gone if r not in fails] if why == "stale" else []
    if peers and not gone:  # every rank but these recorded how it ended: these went without a word
        gone = [r for r in range(ev.world) if r not in fails] if len(fails) >= ev.world // 2 else []
    if peers and gone:  # a peer error or a launcher's SIGTERM, and a rank that went quiet: that one
        r = gone[0]
        age = ev.now - float(ev.beats[r]["time"]) if r in ev.beats else None
        quiet = f"last heartbeat {age:.0f} s before" if age is not None else "no heartbeat at all"
        return ev.failed(r, "lost", f"stopped without a failure record ({quiet}; killed by a signal?)")
    terms = ev.by_time("terminated")
    if terms and not ev.by_time("peer"):  # every rank was told to stop (scancel, a launcher's SIGTERM)
        r = terms[0]
        cause = fails[r]["cause"]
        error = Interrupted(f"{cause} {where(ev.state(r))}{ev.end}", _signal_of(fails[r], signal.SIGTERM))
        return Diagnosis(error, ev.failure(r, "terminated", cause, error.exit_code), ev.ctx.run)
    if peers:
        r = peers[0]
        return ev.failed(r, fails[r]["kind"], fails[r]["cause"], verb="lost a peer")
    return None


def diagnose(
    ctx: RunContext,
    beats: Mapping[int, dict],
    fails: Mapping[int, dict],
    *,
    exit_codes: Mapping[int, int | None] | None = None,
    killed: set[int] | frozenset = frozenset(),
    interrupted: bool | int = False,
    now: float | None = None,
) -> Diagnosis:
    """Name the failure of run ``ctx.run`` (see the module docstring for the order of the rules).
    ``exit_codes``: each rank's exit status as a local launcher saw it (negative: killed by that signal);
    ``killed``: ranks the launcher itself killed (their deaths are not a cause); ``interrupted``: the
    stop signal the launcher itself got (True: SIGINT)."""
    codes = dict(exit_codes or {})
    ev = _Evidence(ctx, beats, fails, codes, time.time() if now is None else now)
    found = _interrupted(ev, interrupted) or _user_error(ev)
    if found:
        return found
    own = ev.by_time("error")
    if own:
        return ev.failed(own[0], "error", ev.fails[own[0]]["cause"])
    signalled = [r for r, c in sorted(codes.items()) if c is not None and c < 0 and r not in killed]
    if signalled:
        r = signalled[0]
        return ev.failed(r, "signal", f"killed by {_signal_name(-int(codes[r]))}")
    hung = ev.by_time("hung")
    if hung:
        return _hang(ctx, ev.beats, ev.fails, hung, ev.world, ev.now, ev.end, ev.logs, ev.failure)
    silent = [r for r, c in sorted(codes.items()) if c is not None and c > 0 and r not in ev.fails]
    if silent:
        r = silent[0]
        return ev.failed(r, "exit", f"exited with status {codes[r]} without a failure record")
    found = _peer_loss(ev)
    if found:
        return found
    r = next((q for q, c in sorted(codes.items()) if c), 0)
    return ev.failed(r, "exit", f"exited with status {codes.get(r)}")


def _hang(
    ctx: RunContext,
    beats: Mapping[int, dict],
    fails: Mapping[int, dict],
    hung: list[int],
    world: int,
    now: float,
    end: str,
    logs,
    failure,
) -> Diagnosis:
    """The watchdog's message: the ranks that did not arrive (and what each was doing), then the ranks
    that waited for them, grouped by where they waited."""
    first = fails[hung[0]]
    limit = float(first.get("limit_s", 0))
    gone = [r for r in first.get("not_arrived", []) if r not in hung]
    if not gone:
        gone, _ = not_arrived(beats, world, now)
        gone = [r for r in gone if r not in hung]
    parts = []
    for r in gone:
        b = beats.get(r)
        if b is None:
            parts.append(f"{rank_label(r, ctx.plan)} never sent a heartbeat")
            continue
        parts.append(
            f"{rank_label(r, ctx.plan)} was last heard from {max(0.0, now - float(b['time'])):.0f} s "
            f"before, {where(b)} (last completed step {int(b.get('completed', 0))})"
        )
    waiting: dict[str, list[int]] = {}
    for r in hung:
        f = fails[r]
        waiting.setdefault(f"{where(f)} (last completed step {int(f.get('completed', 0))})", []).append(r)
    waited = "; ".join(f"{ranks_text(rs)} waited {where_}" for where_, rs in waiting.items())
    if parts:
        head = f"{ranks_text(gone)} did not arrive within the watchdog's {limit:.0f} s: {'; '.join(parts)}"
        r = gone[0]
    else:
        head = f"no rank is behind: every rank waited longer than the watchdog's {limit:.0f} s"
        r = hung[0]
    f = failure(
        r,
        "hung",
        head,
        RankHung.exit_code,
        beats.get(r) or fails.get(r),
        not_arrived=gone,
        limit_s=limit,
        ranks={
            str(q): {"completed": int(s.get("completed", 0)), "phase": s.get("phase", "?")}
            for q, s in sorted({**beats, **fails}.items())
        },
    )
    return Diagnosis(RankHung(f"{head}; {waited}{end}{logs(r)}"), f, ctx.run)


def _progress(state: Mapping[str, Any]) -> int:
    return int(state.get("completed", 0))


def _step_of(state: Mapping[str, Any]) -> int:
    """The step a rank was running (1-based); the step just finished while it saved its checkpoint."""
    done = int(state.get("completed", 0))
    return done if state.get("phase") in ("checkpoint", "stopped", "done") else done + 1


def _at(state: Mapping[str, Any]) -> str:
    phase = state.get("phase", "unknown")
    if phase == "setup":
        return "during setup"
    if phase == "checkpoint":
        return f"saving the checkpoint of step {_step_of(state)}"
    if phase == "stopped":
        return f"after step {_step_of(state)}"
    if phase == "unknown":
        return f"at step {_step_of(state)}"
    return f"at step {_step_of(state)} ({phase})"


_SOURCE_TAG = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|h|hpp|cu):\d+\]\s*")
_GLOO_ADVICE = re.compile(r"\s*This is typically caused by a remote worker.*$", re.DOTALL)


def compact(exc: BaseException, limit: int = 400) -> str:
    """An exception as one short line: ``Type: message``, whitespace folded, C++ source tags and gloo's
    boilerplate advice removed, cut at ``limit`` characters."""
    text = _GLOO_ADVICE.sub("", _SOURCE_TAG.sub("", " ".join(str(exc).split())))
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _signal_of(record: Mapping[str, Any], default: int) -> int:
    """The signal an interrupted rank's record ended it for (its exit status is 128 + it)."""
    code = int(record.get("exit_code", 0) or 0)
    return code - 128 if 128 < code < 128 + 65 else int(default)


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def last_checkpoint(checkpoint_dir: str | None) -> tuple[int, Path] | None:
    """(step, path) of the newest complete checkpoint (its files and their sizes checked; not hashes, nor
    its tensors against the model, which the resume checks anyway: building the model for that imports
    torch, seconds between a launcher's ranks ending and its one line), or None."""
    if not checkpoint_dir:
        return None
    from exatrain.trainer.checkpoint.files import newest_complete

    found = newest_complete(checkpoint_dir, hashes=False, warn=lambda line: None, check=None)
    return None if found is None else (found.step, found.path)


def tail(ctx: RunContext) -> str:
    """``; last checkpoint step 16 in DIR; resume with: ...`` (or that there is none)."""
    if not ctx.checkpoint_dir:
        return "; no checkpoint (the run has no --checkpoint-dir)"
    found = last_checkpoint(ctx.checkpoint_dir)
    text = (
        f"; last checkpoint step {found[0]} in {ctx.checkpoint_dir}"
        if found is not None
        else f"; no complete checkpoint in {ctx.checkpoint_dir} yet"
    )
    if ctx.resume:
        text += f"; {'resume' if found is not None else 'restart'} with: {ctx.resume}"
    return text


def resume_command(argv: Sequence[str], distributed: bool = False) -> str:
    """How to resume, from this process's argv: ``exatrain train <its arguments> --resume auto`` for
    ``exatrain train ...`` and ``python -m exatrain train ...``; under torchrun/srun the launch script
    itself (each rank's arguments are the script's); else the flag to add."""
    args = list(argv)
    name = Path(args[0]).name if args else ""
    flags: list[str] | None = None
    if name in ("exatrain", "__main__.py") and args[1:2] == ["train"]:
        flags = args[2:]
    elif name == "train.py" and Path(args[0]).parent.name == "exatrain":  # python -m exatrain.train
        flags = args[1:]
    if flags is None:
        return "the same command with --resume auto"
    if distributed:
        if _resume_value(flags) == "auto":
            return "the same launch (it passes --resume auto)"
        return "the same launch with --resume auto added to exatrain's arguments"
    kept, skip = [], False
    for a in flags:
        if skip:
            skip = False
        elif a == "--resume":
            skip = True
        elif not a.startswith("--resume="):
            kept.append(a)
    return shlex.join(["exatrain", "train", *kept, "--resume", "auto"])


def _resume_value(flags: Sequence[str]) -> str | None:
    for i, a in enumerate(flags):
        if a == "--resume" and i + 1 < len(flags):
            return flags[i + 1]
        if a.startswith("--resume="):
            return a.split("=", 1)[1]
    return None


__all__ = [
    "Diagnosis",
    "RunContext",
    "claim",
    "compact",
    "diagnose",
    "is_peer_loss",
    "last_checkpoint",
    "log_path",
    "mark_reported",
    "not_arrived",
    "prepare",
    "rank_label",
    "read_ranks",
    "resume_command",
    "run_dir_for",
    "run_lines",
    "summarize_windows",
    "tail",
    "versions_of",
    "wait_reported",
    "where",
    "write_failed_record",
    "write_failure",
    "write_json",
]
