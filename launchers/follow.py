"""Following a submitted job: a local job's rank-0 output streamed to the console (Ctrl-C
asks it to checkpoint and stop), SLURM jobs waited on (launcher.wait=true), and a failed
job's cause in one line."""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from pathlib import Path
from typing import Sequence

from launchers.runs import EXIT_FAILED, EXIT_OK
from launchers.submit import kill_local, signal_local
from orchestrator.plan import rundir as rd


def follow_hint(path: Path, sweep: bool = False) -> str:
    logs = f"{path}/<point>/logs/rank0.log" if sweep else f"{path}/logs/rank0.log"
    return (f"  follow:  audiollm status {path}\n"
            f"  logs:    tail -f {logs}\n"
            f"  cancel:  audiollm cancel {path}")


# submitit's own start/finish notices ("submitit INFO (<time>) - Starting with
# JobEnvironment(...)"): they stay in its log files, not on the console.
_SUBMITIT_NOTICE = "submitit INFO ("


def stream_local(job, timeout_s: float | None = None, run_dir: Path | None = None) -> int:
    """Print rank 0's stdout/stderr while the local job runs (whole lines, without
    submitit's own notices); Ctrl-C stops it gracefully."""
    from submitit.core.utils import JobPaths

    paths = JobPaths(job.paths.folder, job_id=job.job_id, task_id=0)
    offsets = {paths.stdout: 0, paths.stderr: 0}
    partial = {paths.stdout: "", paths.stderr: ""}  # a line not yet ended
    deadline = None if timeout_s is None else time.time() + timeout_s

    def pump(final: bool = False) -> None:
        for path, stream in ((paths.stdout, sys.stdout), (paths.stderr, sys.stderr)):
            try:
                with open(path, "rb") as handle:
                    handle.seek(offsets[path])
                    data = handle.read()
            except FileNotFoundError:
                continue
            offsets[path] += len(data)
            lines = (partial[path] + data.decode(errors="replace")).split("\n")
            partial[path] = "" if final else lines.pop()
            shown = [line for line in lines if not line.startswith(_SUBMITIT_NOTICE)]
            if final and shown and shown[-1] == "":
                shown.pop()
            if shown:
                stream.write("\n".join(shown) + "\n")
                stream.flush()

    # The job runs in its own session (own_session): a terminal's Ctrl-C, and the hang-up
    # when the terminal closes, reach this process only. The first Ctrl-C, SIGTERM or
    # SIGHUP asks the job to checkpoint at its next step boundary and stop (a rerun of the
    # same command resumes there); a second Ctrl-C stops it at once.
    stop = _StopRequests()
    with stop.handling():
        while not job.done():
            pump()
            if deadline is not None and time.time() > deadline:
                job.cancel()
                print(f"local job {job.job_id} exceeded {timeout_s} s; cancelled", file=sys.stderr)
                return EXIT_FAILED
            if stop.count == 1 and not stop.asked:
                stop.asked = True
                print(f"\n{stop.name}: asking the job to checkpoint at its next step and stop (Ctrl-C again stops "
                      f"it at once, losing the steps since its last checkpoint) ...", file=sys.stderr, flush=True)
                signal_local(str(job.job_id), signal.SIGTERM)
            elif stop.count > 1:
                kill_local(str(job.job_id))
                pump(final=True)
                print(f"stopped at once: the steps since the last checkpoint are lost; the same command resumes "
                      f"from {_latest_checkpoint(run_dir) or 'the start'}", file=sys.stderr)
                return stop.exit_code
            time.sleep(0.2)
    pump(final=True)
    if stop.count:
        print(f"stopped; the same command resumes from {_latest_checkpoint(run_dir) or 'the start'}", file=sys.stderr)
        return stop.exit_code
    try:
        job.results()
    except Exception as exc:  # noqa: BLE001 - submitit re-raises the task's failure
        print(f"job failed: {_failure_line(job, run_dir, exc)}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


class _StopRequests:
    """Ctrl-C (SIGINT), SIGTERM and SIGHUP while a local job streams: counted, not raised,
    so that the wait loop decides what each one does."""

    def __init__(self):
        self.count, self.name, self.asked, self.exit_code = 0, "", False, 0

    def _handle(self, signum, frame) -> None:
        self.count += 1
        self.name = {signal.SIGINT: "interrupted (Ctrl-C)", signal.SIGTERM: "terminated (SIGTERM)",
                     signal.SIGHUP: "hang-up (SIGHUP: the terminal closed)"}.get(signum, signal.Signals(signum).name)
        self.exit_code = 128 + signum

    @contextlib.contextmanager
    def handling(self):
        previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _latest_checkpoint(run_dir: Path | None) -> str | None:
    latest = Path(run_dir) / "checkpoints" / "latest" if run_dir is not None else None
    return f"checkpoints/{latest.read_text().strip()}" if latest is not None and latest.is_file() else None


def _failure_line(job, run_dir: Path | None, exc: BaseException) -> str:
    """The cause in one line, as `audiollm status` names it (launchers/failures.py), else
    the last line of submitit's report."""
    from launchers import failures

    cause = None
    if run_dir is not None:
        kind = (rd.last_launch(run_dir) or {}).get("kind") or "local"
        cause = failures.cause(run_dir, kind, str(job.job_id), job.paths.folder)
    last = str(exc).strip().splitlines()
    return cause or (last[-1] if last else repr(exc))


def wait_slurm(jobs, run_dirs: Sequence[Path]) -> int:
    failed = 0
    for job, run_dir in zip(jobs, run_dirs):
        try:
            job.results()
        except Exception as exc:  # noqa: BLE001
            failed += 1
            print(f"job {job.job_id} failed: {_failure_line(job, run_dir, exc)}", file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK
