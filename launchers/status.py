"""`audiollm status PATH` and `audiollm cancel PATH`: a run's (or a sweep's) state, and
stopping its jobs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from launchers.runs import EXIT_FAILED, EXIT_INVALID, EXIT_OK
from launchers.submit import signal_local
from launchers.summary import failure_cause, format_eval_job, format_run, run_state, write_sweep_summary
from orchestrator.plan import rundir as rd


def status(path: str | os.PathLike) -> int:
    path = Path(path)
    if (path / "sweep.json").exists():
        print(write_sweep_summary(path))
        return EXIT_OK
    if rd.is_run_dir(path) or is_eval_job(path):
        info = run_state(path)
        info["cause"] = failure_cause(path, info)
        print(format_eval_job(path, info) if is_eval_job(path) else format_run(path, info))
        if is_eval_job(path / "eval" / "job"):
            print(f"eval job  {run_state(path / 'eval' / 'job')['state']} (audiollm status {path / 'eval' / 'job'})")
        return EXIT_OK
    print(f"{path} is neither a run directory (no plan.json) nor a sweep directory (no sweep.json) nor an "
          f"evaluation job (RUN/eval/job)", file=sys.stderr)
    return EXIT_INVALID


def is_eval_job(path: Path) -> bool:
    """An evaluation submitted as a job (launchers/eval_job.py)."""
    return (Path(path) / "eval_job.json").exists()


def cancel(path: str | os.PathLike) -> int:
    path = Path(path)
    run_dirs = list(rd.point_dirs(path)) if (path / "sweep.json").exists() else [path]
    if not all(rd.is_run_dir(d) or is_eval_job(d) for d in run_dirs):
        print(f"{path} is neither a run directory nor a sweep directory nor an evaluation job", file=sys.stderr)
        return EXIT_INVALID
    code = EXIT_OK
    for run_dir in run_dirs:
        launch = rd.last_launch(run_dir)
        if not launch:
            print(f"{run_dir}: never submitted")
            continue
        for job_id in launch["job_ids"]:
            if launch["kind"] == "slurm":
                done = subprocess.run(["scancel", str(job_id)], capture_output=True, text=True, timeout=60)
                ok = done.returncode == 0
                detail = done.stderr.strip()
            else:
                ok = signal_local(str(job_id), signal.SIGTERM)
                detail = "process not running"
            print(f"{run_dir}: {'cancelled' if ok else 'could not cancel'} job {job_id}"
                  + ("" if ok else f" ({detail})"))
            code = code if ok else EXIT_FAILED
    return code


def _path_main(argv: Sequence[str], prog: str, text: str, fn) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog=prog, description=text)
    parser.add_argument("path", help="a run directory (outputs/<experiment>/<run>), a sweep directory, or an "
                        "evaluation job's (RUN/eval/job)")
    return fn(parser.parse_args(list(argv)).path)


def status_main(argv: Sequence[str]) -> int:
    return _path_main(argv, "audiollm status", "State, last step and last loss of a run (and why it failed, in one "
                      "line), or a sweep's table.", status)


def cancel_main(argv: Sequence[str]) -> int:
    return _path_main(argv, "audiollm cancel", "Cancel the job of a run, or every job of a sweep.", cancel)
