"""Another engine's training log read back: the step times and peak memory it logged, for ``exatrain record``.

Each engine prints one line per logged step, in its own words:

* Megatron-LM, Megatron-Core and Megatron-DeepSpeed (``training_log``): ``iteration N/ M | ... | elapsed time per
  iteration (ms): T | ...``, T the mean over the log interval; memory from ``report_memory``: ``[Rank R] (after N
  iterations) memory (MB) | allocated: ... | max allocated: X | ...`` (X MB, the allocator's peak).
* NeMo and Megatron-Bridge (PyTorch Lightning's progress line): ``global_step: N | ... | train_step_timing in s: T``,
  memory ``max_memory_allocated: B`` (bytes) where its memory callback logs it.
* torchtitan (``metrics.py``): ``step: N  loss: ...  memory: G GiB(P%)  tps: K ...``: K tokens a second a device
  (the step's tokens over the step's seconds and the device count, so a step lasts tokens / (K x devices)); G is
  the device's peak reserved memory.
* DeepSpeed's throughput timer: ``0/40, SamplesPerSec=S, MemAllocated=...GB, MaxMemAllocated=XGB`` or
  ``epoch=E/micro_step=M/global_step=N, RunningAvgSamplesPerSec=..., CurrSamplesPerSec=S, ..., MaxMemAllocated=XGB``:
  S samples (sequences) a second over the whole job, X GiB.

``read_log`` returns what the text holds (``LogRead``: the format, each logged step's number and seconds or
throughput, the peak memory); ``steady_step_s`` the median after warm-up. Pure functions of text.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from exatrain.errors import UserError

GIB = 2.0**30

# log format -> the engine that writes it, as a reader names it
LOG_FORMATS = {
    "megatron": "Megatron-LM",
    "nemo": "NeMo / Megatron-Bridge",
    "torchtitan": "torchtitan",
    "deepspeed": "DeepSpeed",
}
# the runtimes (plan.runtime) each format can come from: NeMo and Megatron-Bridge run Megatron-Core; a
# Megatron-DeepSpeed run prints Megatron's lines and DeepSpeed's timer
LOG_RUNTIMES = {
    "megatron": ("megatron-core", "megatron-deepspeed"),
    "nemo": ("megatron-core",),
    "torchtitan": ("torchtitan",),
    "deepspeed": ("megatron-deepspeed",),
}

_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)"
_MEGATRON_STEP = re.compile(r"iteration\s+(\d+)\s*/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*" + _NUM)
_MEGATRON_MEM = re.compile(r"memory \(MB\)\s*\|.*?max allocated:\s*" + _NUM)
_NEMO_STEP = re.compile(r"global_step:\s*(\d+)\b.*?train_step_timing in s:\s*" + _NUM)
_NEMO_MEM = re.compile(r"max_memory_allocated:\s*" + _NUM)
_TITAN_STEP = re.compile(r"step:\s*(\d+)\b.*?memory:\s*" + _NUM + r"\s*GiB.*?tps:\s*" + _NUM)
_DS_STEP = re.compile(r"(?:global_step=(\d+),.*?CurrSamplesPerSec=|\d+/(\d+), SamplesPerSec=)" + _NUM)
_DS_MEM = re.compile(r"MaxMemAllocated=" + _NUM + r"\s*GB")


@dataclass(frozen=True)
class LogRead:
    """What one log states. ``steps``: each logged step's number; ``values``: its seconds (megatron, nemo), or
    tokens a second a device (torchtitan), or samples a second (deepspeed), ``unit`` says which; ``peak_bytes``: the
    largest peak memory logged (``memory_kind`` says of what), None where none is."""

    fmt: str
    steps: tuple[int, ...]
    values: tuple[float, ...]
    unit: str  # "s" | "tokens/s/device" | "samples/s"
    peak_bytes: float | None = None
    memory_kind: str = ""

    @property
    def engine(self) -> str:
        return LOG_FORMATS[self.fmt]


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _scan(text: str) -> dict[str, LogRead]:
    """Every format whose step lines the text holds, read."""
    found: dict[str, LogRead] = {}
    lines = text.splitlines()

    def read(
        fmt: str,
        pattern: re.Pattern,
        unit: str,
        scale: float,
        mem: re.Pattern | None,
        mem_scale: float,
        kind: str,
        step_group: int = 1,
        value_group: int = 2,
    ) -> None:
        steps, values = [], []
        for line in lines:
            m = pattern.search(line)
            if m:
                steps.append(int(next(g for g in m.groups()[: value_group - 1] if g is not None)))
                values.append(_number(m.group(value_group)) * scale)
        if not steps:
            return
        peaks = [_number(m.group(1)) * mem_scale for line in lines if mem and (m := mem.search(line))]
        found[fmt] = LogRead(
            fmt, tuple(steps), tuple(values), unit, max(peaks) if peaks else None, kind if peaks else ""
        )

    read("megatron", _MEGATRON_STEP, "s", 1e-3, _MEGATRON_MEM, 2.0**20, "max allocated")
    read("nemo", _NEMO_STEP, "s", 1.0, _NEMO_MEM, 1.0, "max allocated")
    read("deepspeed", _DS_STEP, "samples/s", 1.0, _DS_MEM, GIB, "max allocated", value_group=3)
    steps, values, peaks = [], [], []
    for line in lines:
        m = _TITAN_STEP.search(line)
        if m:
            steps.append(int(m.group(1)))
            peaks.append(_number(m.group(2)) * GIB)
            values.append(_number(m.group(3)))
    if steps:
        found["torchtitan"] = LogRead(
            "torchtitan", tuple(steps), tuple(values), "tokens/s/device", max(peaks), "max reserved"
        )
    return found


def read_log(data: bytes, *, source: str, runtime: str = "") -> LogRead:
    """The step times and memory of the log ``data`` (the file ``source``), as the engine that ran ``runtime``
    writes them (any engine's where ``runtime`` is ""). A binary, empty or unrecognised log, or one another
    engine wrote, is a UserError naming ``source``."""
    if not data.strip():
        raise UserError(f"{source}: the log is empty")
    if b"\x00" in data[:65536]:
        raise UserError(f"{source}: not a text log (binary data)")
    text = data.decode("utf-8", errors="replace")
    found = _scan(text)
    if not found:
        raise UserError(
            f"{source}: no step times in it: none of the step lines of "
            f"{', '.join(LOG_FORMATS.values())} (e.g. 'elapsed time per iteration (ms)', "
            "'train_step_timing in s', torchtitan's 'step: ... tps:', DeepSpeed's 'SamplesPerSec=')"
        )
    fitting = [
        f
        for f in ("megatron", "nemo", "torchtitan", "deepspeed")
        if f in found and (not runtime or runtime in LOG_RUNTIMES[f])
    ]
    if not fitting:
        what = ", ".join(LOG_FORMATS[f] for f in found)
        raise UserError(f"{source}: a {what} log, but the launch runs {runtime}: give the log of that run")
    best = found[fitting[0]]
    if best.peak_bytes is None:  # Megatron-DeepSpeed: Megatron's step lines, DeepSpeed's memory
        other = next((found[f] for f in fitting[1:] if found[f].peak_bytes is not None), None)
        if other is not None:
            best = LogRead(best.fmt, best.steps, best.values, best.unit, other.peak_bytes, other.memory_kind)
    return best


def steady_values(read: LogRead, warmup: int) -> tuple[float, ...]:
    """The logged values after warm-up: the first logged line dropped (it carries the first steps' compilation,
    allocation and data loading), and every line of a step number up to ``warmup``."""
    first = read.steps[0]
    return tuple(v for s, v in zip(read.steps, read.values) if s != first and s > warmup)


def steady_step_s(
    read: LogRead, warmup: int, *, tokens_per_step: int, global_batch: int, gpus: int, source: str = "log"
) -> tuple[float, int]:
    """(the median step time after warm-up in seconds, how many logged lines it is the median of): a throughput
    logged converted with the run's tokens a step, global batch and GPU count. No line left is a UserError."""
    kept = steady_values(read, warmup)
    if not kept:
        raise UserError(
            f"{source}: {len(read.values)} logged step(s), none after the warm-up (the first logged "
            f"line and steps up to {warmup}); give a longer log or a smaller --warmup"
        )
    med = statistics.median(kept)
    if med <= 0:
        raise UserError(f"{source}: the median logged {read.unit} after warm-up is {med:g}")
    if read.unit == "tokens/s/device":
        return tokens_per_step / (med * gpus), len(kept)
    if read.unit == "samples/s":
        return global_batch / med, len(kept)
    return med, len(kept)


__all__ = ["LOG_FORMATS", "LogRead", "LOG_RUNTIMES", "read_log", "steady_step_s", "steady_values"]
