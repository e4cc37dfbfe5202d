"""Following a submitted job, whatever its launcher kind: where to follow it, jobs waited
on until they end, and a failed job's cause in one line. (A local job's rank-0 output
streamed to the console: launchers/kinds/local.py.)"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from launchers.runs import EXIT_FAILED, EXIT_OK
from orchestrator.plan import rundir as rd


def follow_hint(path: Path, sweep: bool = False) -> str:
    logs = f"{path}/<point>/logs/rank0.log" if sweep else f"{path}/logs/rank0.log"
    return (f"  follow:  audiollm status {path}\n"
            f"  logs:    tail -f {logs}\n"
            f"  cancel:  audiollm cancel {path}")


def latest_checkpoint(run_dir: Path | None) -> str | None:
    latest = Path(run_dir) / "checkpoints" / "latest" if run_dir is not None else None
    return f"checkpoints/{latest.read_text().strip()}" if latest is not None and latest.is_file() else None


def failure_line(job, run_dir: Path | None, exc: BaseException) -> str:
    """The cause in one line, as `audiollm status` names it (launchers/failures.py), else
    the last line of submitit's report."""
    from launchers import failures

    cause = None
    if run_dir is not None:
        kind = (rd.last_launch(run_dir) or {}).get("kind")
        cause = failures.cause(run_dir, kind, str(job.job_id), job.paths.folder)
    last = str(exc).strip().splitlines()
    return cause or (last[-1] if last else repr(exc))


def wait_jobs(jobs, run_dirs: Sequence[Path]) -> int:
    """Until every job ends (their results collected); each failure's cause said."""
    failed = 0
    for job, run_dir in zip(jobs, run_dirs):
        try:
            job.results()
        except Exception as exc:  # noqa: BLE001
            failed += 1
            print(f"job {job.job_id} failed: {failure_line(job, run_dir, exc)}", file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK
