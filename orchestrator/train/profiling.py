"""`train.profile_steps`: steps of the run under torch.profiler, and what it writes.

What bounds a step, the device's kernels or the host issuing them, is what a slow run's
owner asks first; the profile of the job's own step (its model, data, layout and
compiled layers: no loop written for the measurement) answers it. The convention is
Megatron-LM's (`--profile --profile-step-start --profile-step-end --profile-ranks`) and
torchtitan's (`profiling.enable_profiling`): chosen steps, chosen ranks, a trace to open
in Perfetto or chrome://tracing.

Each profiling rank writes RUN/profile/steps_<first>-<last>/rank<N>/:
- ops.txt: the operators by their own device time (on GPUs), by their own host time,
  and by input shape (on GPUs): which kernels take the time and how many are launched;
- trace.json.gz: the whole timeline, gzipped.
The step's metrics row says `profiled` (the profiler slows it: leave it out of
throughput figures); the console names the top operators by device time.
"""

from __future__ import annotations

import gzip
import logging
import shutil
from pathlib import Path
from typing import Optional, Sequence

log = logging.getLogger(__name__)

TOP_OPS = 5  # named on the console when a profile is written


def profile_dir(run_dir: Path, first: int, last: int, rank: int) -> Path:
    return Path(run_dir) / "profile" / f"steps_{first}-{last}" / f"rank{rank}"


def write_profile(prof, out: Path) -> str:
    """A stopped torch.profiler session's ops.txt and trace.json.gz into `out`; returns a
    line naming its top operators (by device time where the device was profiled)."""
    out.mkdir(parents=True, exist_ok=True)
    events = prof.key_averages()
    on_device = any(getattr(e, "self_device_time_total", 0) > 0 for e in events)
    keys = (["self_device_time_total"] if on_device else []) + ["self_cpu_time_total"]
    sections = [f"== operators by {key}\n" + events.table(sort_by=key, row_limit=60, max_name_column_width=90)
                for key in keys]
    if on_device:
        by_shape = prof.key_averages(group_by_input_shape=True)
        sections.append("== operators by input shape, by self_device_time_total\n" + by_shape.table(
            sort_by="self_device_time_total", row_limit=60, max_name_column_width=70, max_shapes_column_width=90))
    (out / "ops.txt").write_text("\n\n".join(sections) + "\n")
    trace = out / "trace.json"
    prof.export_chrome_trace(str(trace))
    with trace.open("rb") as src, gzip.open(out / "trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace.unlink()
    key = keys[0]
    total = sum(getattr(e, key) for e in events) or 1.0
    top = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:TOP_OPS]
    where = "device" if on_device else "host"
    return f"top operators by own {where} time: " + "; ".join(
        f"{e.key} {getattr(e, key) / 1e3:.1f} ms ({getattr(e, key) / total:.0%})" for e in top)


def profiler(device: str):
    """A torch.profiler session of the host, and of the GPU on CUDA, with input shapes."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    return profile(activities=activities, record_shapes=True)


class StepProfiler:
    """train.profile_steps [first, last] on the ranks of train.profile_ranks: the profiler
    starts before step `first` and stops after step `last` (a run resumed inside the window
    profiles the window's rest). Elsewhere it does nothing."""

    def __init__(self, steps: Sequence[int], ranks: Sequence[int], rank: int, run_dir: Path, device: str):
        self.window = (int(steps[0]), int(steps[1])) if steps else None
        self.active = self.window is not None and rank in {int(r) for r in ranks}
        self.rank, self.run_dir, self.device = rank, Path(run_dir), device
        self._session = None
        self._started: Optional[int] = None

    def before_step(self, step: int) -> None:
        """`step`: the step about to run (1-based)."""
        if not self.active or self._session is not None:
            return
        first, last = self.window
        if first <= step <= last:
            self._session = profiler(self.device)
            self._session.start()
            self._started = step

    def after_step(self, step: int) -> bool:
        """`step`: the step just run. True where the profiler recorded it."""
        if self._session is None:
            return False
        if step >= self.window[1]:
            self._finish(step)
        return True

    def _finish(self, step: int) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
        session, self._session = self._session, None
        session.stop()
        out = profile_dir(self.run_dir, self._started, step, self.rank)
        top = write_profile(session, out)
        log.info("rank %d: profile of steps %d-%d written to %s; %s", self.rank, self._started, step, out, top)

    def close(self) -> None:
        """The run ended inside the window (a failure, a stop): the profiler stops, and
        writes nothing."""
        if self._session is not None:
            session, self._session = self._session, None
            session.stop()
