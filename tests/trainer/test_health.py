"""Rank health without ranks: the straggler rule, the watchdog's limits, the diagnosis of a failed run
from its rank files (the one line, the exception and its exit status), the resume command, superseded
metrics lines, the failed RunRecord, how a rank classifies what ended it, and the per-rank picture.

Broken on purpose and seen to fail here: the watchdog judging CPU ranks by wall-clock age
(``_cpu_gated`` always False: the two ``test_on_cpu_*`` tests); peers' heartbeats not read (the
peer test); no compile floor (the compile test)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from exatrain.catalog import get_model
from exatrain.errors import EXIT_STATUSES, Interrupted, RankFailed, RankHung, UserError
from exatrain.plan import Measured, ParallelDims, Plan, RunRecord, TrainShape
from exatrain.records import read_run_records
from exatrain.trainer import failures, health
from exatrain.trainer.checkpoint import files as ckpt_files
from exatrain.trainer.failures import summarize_windows
from exatrain.trainer.health import RankMonitor, slow_ranks
from exatrain.trainer.metrics import supersede_redone_steps


def plan(tp: int = 2, pp: int = 1, dp: int = 2) -> Plan:
    return Plan(
        model=get_model("gpt-tiny"),
        dims=ParallelDims(tp=tp, pp=pp, dp=dp),
        shape=TrainShape(1, 2 * dp),
        dtype="float32",
    ).validate()


# --- the straggler rule --------------------------------------------------------------------------------
def test_a_rank_is_slow_above_1_3x_its_stage_peers_median() -> None:
    assert slow_ranks([0.10, 0.10, 0.10, 0.14], [0, 0, 0, 0]) == [3]  # 1.4x
    assert slow_ranks([0.10, 0.10, 0.10, 0.12], [0, 0, 0, 0]) == []  # 1.2x
    # a heavier pipeline stage is not slow: each rank is held to the ranks of its own stage
    assert slow_ranks([0.10, 0.11, 0.30, 0.31], [0, 0, 1, 1]) == []
    assert slow_ranks([0.10, 0.11, 0.30, 0.50], [0, 0, 1, 1]) == [3]
    assert slow_ranks([0.10, 0.40], [0, 1]) == []  # alone on its stage: not judged
    # tiny steps: 1.5x but only 1 ms over the median is timer noise, not a straggler
    assert slow_ranks([0.002, 0.002, 0.003], [0, 0, 0]) == []


def test_rank_times_are_step_weighted_means_over_the_windows() -> None:
    windows = [
        {
            "kind": "ranks",
            "first_step": 1,
            "last_step": 10,
            "compute_s": [1.0, 2.0],
            "wait_s": [0.5, 0.0],
            "stragglers": [],
        },
        {
            "kind": "ranks",
            "first_step": 11,
            "last_step": 15,
            "compute_s": [4.0, 2.0],
            "wait_s": [0.5, 3.0],
            "stragglers": [0],
        },
    ]
    got = summarize_windows(windows)
    assert got == {"steps": 15, "windows": 2, "compute_s": [2.0, 2.0], "wait_s": [0.5, 1.0], "stragglers": [0]}
    assert summarize_windows([]) is None


def test_the_watchdog_limit_is_generous_by_default_and_exact_when_set() -> None:
    m = RankMonitor(0, 2, None, supervised=True, watch=False)
    assert m.limit_s("forward") == 300.0  # no step timed yet
    m.step_times = [0.5] * 10
    assert m.limit_s("forward") == 300.0  # 20 x 0.5 s is under the floor
    m.step_times = [30.0] * 10
    assert m.limit_s("forward") == 600.0  # 20 x the median step
    m.watchdog_s = 7.0
    assert m.limit_s("grad-sync") == 7.0
    assert m.limit_s("setup") == m.limit_s("checkpoint") == 300.0  # loading and saving may take minutes
    assert 1.0 <= m.beat_s() <= 15.0


# --- which ranks did not arrive -----------------------------------------------------------------------------
def beat(rank: int, completed: int, phase: str, age_s: float, now: float, seq: int = 3, **kw) -> dict:
    return {
        "rank": rank,
        "run": 0,
        "completed": completed,
        "phase": phase,
        "seq": seq,
        "time": now - age_s,
        "limit_s": 10.0,
        "beat_s": 1.0,
        "pid": 1000 + rank,
        **kw,
    }


def test_a_compiled_runs_first_step_gets_the_compile_floor() -> None:
    m = RankMonitor(0, 2, None, supervised=True, watch=False)
    m.new_run(0, SimpleNamespace(watchdog_s=7.0, device="cuda", compile=True))
    assert m.limit_s("forward") == m.limit_s("backward") == health.COMPILE_LIMIT_S  # compiling, however set
    m.step_end(2.0)
    assert m.limit_s("forward") == 7.0  # compiled: the limit as set
    m.new_run(1, SimpleNamespace(watchdog_s=7.0, device="cuda", compile=False))
    assert m.limit_s("forward") == 7.0  # an eager run's first step has none


def _busy(cpu_s: float = 0.02) -> None:
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


def _monitor(tmp_path: Path, world: int = 1, device: str = "cpu") -> RankMonitor:
    """A rank 0 whose forward began 20 s ago, under a 5 s watchdog (its CPU cap: 50 s)."""
    m = RankMonitor(0, world, tmp_path, supervised=True, watch=False)
    m.new_run(0, SimpleNamespace(watchdog_s=5.0, device=device))
    m._at = ("forward", time.monotonic() - 20.0)
    return m


def _peer_beat(tmp_path: Path, cpu_s: float, run: int = 0) -> None:
    failures.write_json(
        tmp_path / failures.HEARTBEAT.format(rank=1),
        {
            "rank": 1,
            "run": run,
            "completed": 0,
            "phase": "forward",
            "seq": 1,
            "time": time.time(),
            "beat_s": 1.0,
            "limit_s": 5.0,
            "cpu_s": cpu_s,
        },
    )


@pytest.mark.skipif(health.thread_cpu_clock() is None, reason="no per-thread CPU clock on this platform")
def test_on_cpu_a_rank_still_computing_is_not_hung_and_a_rank_waiting_is(tmp_path: Path) -> None:
    m = _monitor(tmp_path)
    m.note_cpu()  # the first look only takes the reading
    assert m.overdue() is not None and m.overdue()[1] is False  # 20 s without a look that saw CPU used
    _busy()
    m.note_cpu()
    assert m.overdue() is None  # slow, not stuck: the phase's age counts from this beat
    assert "cpu_s" in m.state()
    m._moved -= 6.0  # six seconds later, and the thread used no CPU since (blocked in a collective)
    m.note_cpu()
    assert m.overdue() is not None and m.overdue()[1] is False
    m._at = ("forward", time.monotonic() - 60.0)  # past CPU_CAP (10) x 5 s however busy
    _busy()
    m.note_cpu()
    assert m.overdue() is not None and m.overdue()[1] is True


@pytest.mark.skipif(health.thread_cpu_clock() is None, reason="no per-thread CPU clock on this platform")
def test_on_cpu_a_waiting_rank_is_not_hung_while_a_peer_computes(tmp_path: Path) -> None:
    m = _monitor(tmp_path, world=2)
    _peer_beat(tmp_path, 1.0)
    m.note_cpu()
    assert m.overdue() is not None  # nothing seen moving yet
    _peer_beat(tmp_path, 1.5)  # rank 1 computed half a second since
    m.note_cpu()
    assert m.overdue() is None
    m._moved -= 6.0
    m.note_cpu()  # rank 1's CPU time unchanged: stopped or blocked too
    assert m.overdue() is not None
    _peer_beat(tmp_path, 9.0, run=1)  # a heartbeat of another run in the same processes does not count
    m.note_cpu()
    assert m.overdue() is not None


def test_cuda_ranks_keep_the_wall_clock_watchdog(tmp_path: Path) -> None:
    m = _monitor(tmp_path, device="cuda")  # a host thread waiting on the GPU may spin: CPU time says nothing
    _busy()
    m.note_cpu()
    _busy()
    m.note_cpu()
    assert m.overdue() is not None and m.overdue()[1] is False
    m._at = ("forward", time.monotonic() - 1.0)
    assert m.overdue() is None


def test_not_arrived_is_the_stale_ranks_else_the_ranks_behind() -> None:
    now = time.time()
    beats = {
        0: beat(0, 16, "grad-sync", 1, now),
        1: beat(1, 16, "grad-sync", 1, now),
        2: beat(2, 16, "forward", 30, now),
    }
    assert failures.not_arrived(beats, 4, now) == ([2, 3], "stale")  # rank 3 never beat
    beats[3] = beat(3, 16, "forward", 1, now, seq=1)
    beats[2] = beat(2, 16, "grad-sync", 1, now)
    assert failures.not_arrived(beats, 4, now) == ([3], "behind")  # alive, but behind in its step
    beats[3] = beat(3, 16, "grad-sync", 1, now)
    assert failures.not_arrived(beats, 4, now) == ([], "level")


# --- the one line ------------------------------------------------------------------------------------------------
@pytest.fixture
def ckpt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkpoint folder whose newest complete checkpoint is step 16 (step 20's save never finished).
    The folders are stand-ins (no tensors), so the full readability check, which
    tests/checkpoint/test_untrusted.py covers, is replaced here by "has a manifest"."""

    def newest_with_manifest(d: str | None):
        done = sorted(
            int(p.name.split("-")[1])
            for p in Path(d or "/nonexistent").glob("step-*")
            if (p / ckpt_files.MANIFEST).is_file()
        )
        return (done[-1], Path(d) / ckpt_files.step_dir_name(done[-1])) if done else None

    monkeypatch.setattr(failures, "last_checkpoint", newest_with_manifest)
    root = tmp_path / "ckpt"
    for step in (12, 16):
        d = root / ckpt_files.step_dir_name(step)
        d.mkdir(parents=True)
        p = plan()
        (d / ckpt_files.TRAINER).write_text(
            json.dumps(
                {
                    "step": step,
                    "samples_consumed": step * p.global_batch,
                    "global_batch": p.global_batch,
                    "seq_len": p.model.seq_len,
                    "seed": 0,
                    "data_shuffle": True,
                    "tokenizer_sha256": "0" * 64,
                    "separator": "",
                    "separator_id": 0,
                    "nan_skipped": 0,
                    "layout": {"tp": p.tp, "pp": p.pp, "dp": p.dp},
                    "plan": p.to_dict(),
                    "steps": 20,
                }
            )
        )
        (d / ckpt_files.METADATA).write_text("{}")
        ckpt_files.write_manifest(d, step)
    (root / ckpt_files.step_dir_name(20)).mkdir()  # no manifest
    return root


def ctx(p: Plan, ckpt: Path | None, run_dir: Path, resume: str = "exatrain train --dp 2 --resume auto"):
    return failures.RunContext(
        plan=p, run=0, checkpoint_dir=None if ckpt is None else str(ckpt), run_dir=run_dir, resume=resume
    )


def fail(rank: int, kind: str, cause: str, completed: int, phase: str, t: float, **kw) -> dict:
    return {
        "rank": rank,
        "run": 0,
        "completed": completed,
        "phase": phase,
        "seq": 2,
        "time": t,
        "kind": kind,
        "cause": cause,
        "exit_code": kw.pop("exit_code", 4),
        "user_error": False,
        "limit_s": 10.0,
        "beat_s": 1.0,
        **kw,
    }


def test_an_exception_in_one_rank_is_named_with_its_place_step_checkpoint_and_resume(
    ckpt: Path, tmp_path: Path
) -> None:
    now = time.time()
    p = plan()
    fails = {
        3: fail(3, "error", "ValueError: bad shard", 16, "backward", now - 2),
        0: fail(0, "peer", "RuntimeError: Connection closed by peer", 16, "grad-sync", now - 1),
    }
    d = failures.diagnose(ctx(p, ckpt, tmp_path / "ranks"), {}, fails, exit_codes={0: 4, 1: 4, 2: 4, 3: 4})
    assert isinstance(d.error, RankFailed)
    assert str(d.error) == (
        f"rank 3 (tp 1, pp 0, dp 1) failed at step 17 (backward): ValueError: bad shard; "
        f"last checkpoint step 16 in {ckpt}; resume with: exatrain train --dp 2 --resume auto; "
        f"log: {tmp_path / 'ranks' / 'rank-3.log'}"
    )
    assert d.error.exit_code == 4 and EXIT_STATUSES[4] == "a rank failed"
    assert d.failure | {"log": ""} == {
        "rank": 3,
        "tp": 1,
        "pp": 0,
        "dp": 1,
        "step": 17,
        "phase": "backward",
        "kind": "error",
        "cause": "ValueError: bad shard",
        "exit_code": 4,
        "log": "",
    }
    assert "\n" not in str(d.error)


def test_a_rank_killed_by_a_signal_is_the_cause_even_when_its_peers_lost_it(ckpt: Path, tmp_path: Path) -> None:
    now = time.time()
    beats = {1: beat(1, 3, "setup", 40, now)}  # its last heartbeat is older than its peers' progress
    fails = {0: fail(0, "peer", "RuntimeError: Connection reset by peer", 16, "backward", now)}
    d = failures.diagnose(ctx(plan(1, 1, 2), ckpt, tmp_path), beats, fails, exit_codes={0: 4, 1: -9})
    assert isinstance(d.error, RankFailed)
    assert str(d.error).startswith(
        "rank 1 (tp 0, pp 0, dp 1) failed at step 17: killed by SIGKILL; last checkpoint step 16 in"
    )
    assert d.failure["kind"] == "signal" and d.failure["step"] == 17
    # killed by the launcher itself (after the cause was known): not the cause
    d = failures.diagnose(ctx(plan(1, 1, 2), ckpt, tmp_path), beats, fails, exit_codes={0: 4, 1: -9}, killed={1})
    assert str(d.error).startswith(
        "rank 1 (tp 0, pp 0, dp 1) failed at step 17: stopped without a failure record "
        "(last heartbeat 40 s before; killed by a signal?)"
    )


def test_bad_input_a_rank_found_is_its_own_line_and_status(tmp_path: Path) -> None:
    now = time.time()
    msg = "loss nan (gradient norm nan) at step 3: stopped by --nan-policy stop before the update"
    fails = {r: fail(r, "error", msg, 2, "metrics", now, exit_code=3, user_error=True) for r in range(2)}
    d = failures.diagnose(ctx(plan(1, 1, 2), None, tmp_path), {}, fails)
    assert type(d.error) is UserError and d.error.exit_code == 3 and str(d.error) == msg


def test_a_hang_names_the_ranks_that_did_not_arrive_and_what_each_was_doing(ckpt: Path, tmp_path: Path) -> None:
    now = time.time()
    beats = {
        0: beat(0, 16, "grad-sync", 1, now),
        1: beat(1, 16, "grad-sync", 1, now),
        2: beat(2, 16, "grad-sync", 1, now),
        3: beat(3, 16, "forward", 31, now, seq=1),
    }
    fails = {r: fail(r, "hung", "waited", 16, "grad-sync", now, exit_code=5, not_arrived=[3]) for r in range(3)}
    d = failures.diagnose(
        ctx(plan(), ckpt, tmp_path), beats, fails, exit_codes={0: 5, 1: 5, 2: 5, 3: -9}, killed={3}, now=now
    )
    assert isinstance(d.error, RankHung) and d.error.exit_code == 5
    text = str(d.error)
    assert text.startswith(
        "rank 3 did not arrive within the watchdog's 10 s: rank 3 (tp 1, pp 0, dp 1) was last heard "
        "from 31 s before, in forward of step 17 (last completed step 16); ranks 0, 1, 2 waited in "
        "grad-sync of step 17 (last completed step 16); last checkpoint step 16 in"
    ), text
    assert d.failure["rank"] == 3 and d.failure["kind"] == "hung" and d.failure["not_arrived"] == [3]
    assert d.failure["ranks"]["3"] == {"completed": 16, "phase": "forward"}


def test_an_interrupt_wins_and_is_status_130(tmp_path: Path) -> None:
    now = time.time()
    fails = {
        0: fail(0, "interrupted", "interrupted (SIGINT)", 5, "forward", now, exit_code=130),
        1: fail(1, "peer", "RuntimeError: Connection closed by peer", 5, "backward", now),
    }
    d = failures.diagnose(ctx(plan(1, 1, 2), None, tmp_path), {}, fails, interrupted=True)
    assert isinstance(d.error, Interrupted) and d.error.exit_code == 130
    assert str(d.error) == "interrupted (SIGINT) in forward of step 6; no checkpoint (the run has no --checkpoint-dir)"


def test_a_checkpoint_dir_without_a_complete_checkpoint_says_so(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    c = ctx(plan(1, 1, 2), tmp_path / "empty", tmp_path)
    assert failures.tail(c) == f"; no complete checkpoint in {tmp_path / 'empty'} yet; restart with: {c.resume}"


def test_the_resume_command_is_the_users_with_resume_auto() -> None:
    argv = ["/usr/bin/exatrain", "train", "--dp", "2", "--checkpoint-dir", "my ckpt", "--resume", "/x/step-00000004"]
    assert failures.resume_command(argv) == "exatrain train --dp 2 --checkpoint-dir 'my ckpt' --resume auto"
    argv = ["/p/exatrain/__main__.py", "train", "--steps", "9", "--resume=auto"]
    assert failures.resume_command(argv) == "exatrain train --steps 9 --resume auto"
    torchrun = ["/p/exatrain/train.py", "--plan", "p.json", "--checkpoint-dir", "c", "--resume", "auto"]
    assert failures.resume_command(torchrun, distributed=True) == "the same launch (it passes --resume auto)"
    assert failures.resume_command(["pytest", "-q"]) == "the same command with --resume auto"


def test_exception_text_is_one_short_line() -> None:
    gloo = RuntimeError(
        "[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
        "[127.0.0.1]:20910: Connection reset by peer. This is typically caused by a remote worker "
        "hanging or bugs in the application. Check the logs ... GLHF!"
    )
    assert failures.compact(gloo) == "RuntimeError: Read error [127.0.0.1]:20910: Connection reset by peer."
    assert failures.is_peer_loss(failures.compact(gloo))
    assert not failures.is_peer_loss("FileExistsError: [Errno 17] File exists: 'ckpt/.tmp-step-00000002'")
    assert len(failures.compact(ValueError("x" * 1000))) == 400


# --- how a rank classifies what ended it ------------------------------------------------------------------------------
class Ended(Exception):
    pass


class FakeMonitor(RankMonitor):
    """A monitor whose end() records what it was told instead of ending the process."""

    def __init__(self, supervised: bool = True) -> None:
        super().__init__(0, 2, None, supervised=supervised, watch=False)

    def end(self, kind: str, cause: str, exit_code: int, **kw) -> None:  # type: ignore[override]
        self.got = (kind, cause, exit_code, kw.get("user_error", False))
        raise Ended


@pytest.mark.parametrize(
    "exc, kind, code, user",
    [
        (UserError("bad --data"), "error", 2, True),
        (KeyboardInterrupt(), "interrupted", 130, False),
        (health.Terminated(signal.SIGTERM), "interrupted", 143, False),
        (health.Terminated(signal.SIGHUP), "interrupted", 129, False),
        (health.Stopped(7, {0: signal.SIGTERM}, "interrupted (SIGTERM)", signal.SIGTERM), "interrupted", 143, False),
        (SystemExit(1), "error", 4, False),
        (FileExistsError(17, "File exists"), "error", 4, False),
        (RuntimeError("Connection closed by peer"), "peer", 4, False),
    ],
)
def test_every_way_out_of_a_rank_is_recorded(
    exc: BaseException, kind: str, code: int, user: bool, capsys: pytest.CaptureFixture
) -> None:
    from exatrain.trainer.spawn import _end_rank

    m = FakeMonitor()
    with pytest.raises(Ended):
        _end_rank(m, exc)
    assert m.got[0] == kind and m.got[2] == code and m.got[3] == user


def test_sigterm_under_torchrun_or_srun_is_a_consequence_and_the_silent_rank_is_named(tmp_path: Path) -> None:
    from exatrain.trainer.spawn import _end_rank

    m = FakeMonitor(supervised=False)
    with pytest.raises(Ended):
        _end_rank(m, health.Terminated(signal.SIGTERM))
    assert m.got[:3] == ("terminated", "interrupted (SIGTERM)", 143)
    # rank 2 went without a word (SIGKILL); torchrun then sent SIGTERM to the others, who recorded it
    now = time.time()
    beats = {r: beat(r, 7, "backward", 0.5, now) for r in range(4)}  # not stale yet: it just died
    fails = {r: fail(r, "terminated", "interrupted (SIGTERM)", 7, "backward", now, exit_code=143) for r in (0, 1, 3)}
    d = failures.diagnose(ctx(plan(), None, tmp_path), beats, fails, now=now)
    assert isinstance(d.error, RankFailed) and d.failure["rank"] == 2 and d.failure["kind"] == "lost"
    assert str(d.error).startswith(
        "rank 2 (tp 0, pp 0, dp 1) failed at step 8 (backward): stopped without a "
        "failure record (last heartbeat 0 s before; killed by a signal?)"
    )
    # every rank told to stop (scancel): an interrupt
    fails[2] = fail(2, "terminated", "interrupted (SIGTERM)", 7, "backward", now, exit_code=143)
    d = failures.diagnose(ctx(plan(), None, tmp_path), beats, fails, now=now)
    assert isinstance(d.error, Interrupted) and d.error.exit_code == 143


def test_dcp_checkpoint_exception_a_baseexception_is_recorded_as_the_ranks_own_failure() -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    from exatrain.trainer.spawn import _end_rank

    exc = CheckpointException("save", {0: (OSError("disk full"), None)})
    assert not isinstance(exc, Exception)
    m = FakeMonitor()
    with pytest.raises(Ended):
        _end_rank(m, exc)
    assert m.got[0] == "error" and m.got[1].startswith("CheckpointException") and m.got[2] == 4


# --- metrics files ----------------------------------------------------------------------------------------------------
def step(i: int) -> dict:
    return {"kind": "step", "step": i, "loss": 5.0 - 0.1 * i}


def test_a_resume_supersedes_the_redone_steps_of_the_interrupted_run(tmp_path: Path) -> None:
    p = plan(1, 1, 1)
    ok = RunRecord(plan=p, measured=None, status="ok").to_dict()
    failed = RunRecord(plan=p, measured=None, status="failed").to_dict()
    window = {"kind": "ranks", "first_step": 5, "last_step": 6, "compute_s": [1.0], "wait_s": [0.0]}
    lines = [step(i) for i in (1, 2, 3)] + [ok] + [step(i) for i in (1, 2, 3, 4, 5, 6)] + [window, failed]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert supersede_redone_steps(path, 4) == 3  # steps 5, 6 and their window; not the earlier, finished run
    got = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["step"] for x in got if x["kind"] == "step"] == [1, 2, 3, 1, 2, 3, 4]
    sup = [x for x in got if x["kind"] == "superseded"]
    assert [x["line"].get("step", x["line"].get("last_step")) for x in sup] == [5, 6, 6]
    assert all(x["resumed_from_step"] == 4 for x in sup)
    assert len(read_run_records(path)) == 2
    assert supersede_redone_steps(path, 4) == 0  # idempotent


def test_the_failed_record_keeps_what_the_run_measured_and_its_ranks(tmp_path: Path) -> None:
    p = plan(1, 1, 2)
    metrics = tmp_path / "m.jsonl"
    earlier = RunRecord(plan=p, measured=None, status="ok").to_dict()
    full = {
        "grad_norm": 1.0,
        "lr": 1e-3,
        "step_time_s": 0.5,
        "tokens_per_s": 100.0,
        "model_tflops_per_gpu": 0.1,
        "mfu": None,
        "peak_memory_bytes": [10, 20],
        "skipped": False,
    }
    lines = (
        [{**step(9), **full}, earlier]
        + [{**step(i), **full} for i in (1, 2, 3)]
        + [
            {
                "kind": "ranks",
                "first_step": 1,
                "last_step": 2,
                "compute_s": [0.1, 0.3],
                "wait_s": [0.2, 0.0],
                "stragglers": [1],
            }
        ]
    )
    metrics.write_text("".join(json.dumps(x) + "\n" for x in lines))
    d = failures.diagnose(ctx(p, None, tmp_path), {}, {1: fail(1, "error", "OSError: disk full", 3, "forward", 1.0)})
    failures.write_failed_record(str(metrics), p, d, device="cpu", wall_s=12.0, measure_after=1)
    rec = read_run_records(metrics)[-1]
    assert rec.status == "failed" and rec.error == str(d.error) and rec.failure["rank"] == 1
    assert isinstance(rec.measured, Measured) and rec.measured.steps == 3 and rec.measured.peak_memory_bytes == 20
    assert rec.rank_times == {
        "steps": 2,
        "windows": 1,
        "compute_s": [0.1, 0.3],
        "wait_s": [0.2, 0.0],
        "stragglers": [1],
    }
    assert rec.env["world_size"] == 2 and rec.env["backend"] == "gloo" and rec.env["wall_s"] == 12.0
    # a record read back equals the one written; records from before these fields still load
    assert RunRecord.from_dict(rec.to_dict()) == rec
    old = rec.to_dict()
    del old["failure"], old["rank_times"]
    assert RunRecord.from_dict(old).failure is None


# --- the per-rank picture ---------------------------------------------------------------------------------------------
def test_the_per_rank_picture_draws_the_last_runs_windows(tmp_path: Path) -> None:
    from PIL import Image

    from exatrain.report.ranks import rank_times

    coords = [[r % 2, 0, r // 2] for r in range(4)]

    def w(a, b, c3, named):
        return {
            "kind": "ranks",
            "first_step": a,
            "last_step": b,
            "compute_s": [0.1, 0.1, 0.1, c3],
            "wait_s": [0.3, 0.3, 0.3, 0.1],
            "coords": coords,
            "slow": [3],
            "stragglers": named,
        }

    lines = [
        w(1, 3, 9.0, []),
        RunRecord(plan=plan(), measured=None).to_dict(),  # an earlier run: not drawn
        w(1, 3, 0.4, []),
        w(4, 6, 0.4, [3]),
        {"kind": "superseded", "resumed_from_step": 3, "line": w(4, 6, 7.0, [3])},
        w(4, 9, 0.3, [3]),
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    fig = rank_times(path, tmp_path / "ranks.png")
    n = fig.numbers
    assert n["steps"] == 12 and n["windows"] == 3 and n["stragglers"] == [3]
    assert n["compute_s"][3] == pytest.approx((0.4 * 3 + 0.4 * 3 + 0.3 * 6) / 12)
    assert n["wait_s"][:3] == pytest.approx([0.3] * 3)
    assert "straggler: rank 3" in fig.caption
    with Image.open(tmp_path / "ranks.png") as im:
        assert im.size[0] >= 600 and len(im.convert("RGB").getcolors(1 << 20)) > 20
    (tmp_path / "none.jsonl").write_text(json.dumps(step(1)) + "\n")
    assert rank_times(tmp_path / "none.jsonl", tmp_path / "none.png") is None
