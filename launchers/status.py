"""`audiollm status PATH` and `audiollm cancel PATH`: a run's (or a sweep's) state, and
stopping its jobs."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from launchers.failures import planned_world_size
from launchers.runs import EXIT_FAILED, EXIT_INVALID, EXIT_OK
from launchers.kinds import launcher_for
from launchers.summary import failure_cause, format_eval_job, format_run, run_state, write_sweep_summary
from launchers.watchdog import read_beats
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
        if (rd.read_json(run_dir / "state.json", default={}) or {}).get("by_hand"):
            code = code if stop_by_hand(run_dir, run_state(run_dir)) else EXIT_FAILED
            continue
        launch = rd.last_launch(run_dir)
        if not launch:
            print(f"{run_dir}: never submitted")
            continue
        for job_id in launch["job_ids"]:
            ok, detail = launcher_for(launch["kind"]).cancel(str(job_id))
            print(f"{run_dir}: {'cancelled' if ok else 'could not cancel'} job {job_id}"
                  + ("" if ok else f" ({detail})"))
            code = code if ok else EXIT_FAILED
    return code


def stop_by_hand(run_dir: Path, info: dict) -> bool:
    """Stop a run started by hand (launchers/by_hand.py) as a time limit would: its ranks
    checkpoint at their next step and end, so that the same command resumes it. One rank's
    stop is every rank's (job_control.should_stop agrees over all of them): SLURM's step
    gets SIGTERM where srun started it, else the ranks that run on this host do. False
    where nothing here could reach it."""
    job_id = str(info.get("job_id"))
    if info["state"] != "RUNNING":
        print(f"{run_dir}: started by hand ({job_id}), {info['state']}: nothing to stop")
        return True
    if re.fullmatch(r"\d+\.\d+", job_id):  # JOB.STEP: srun inside an allocation
        done = subprocess.run(["scancel", "--signal=TERM", job_id], capture_output=True, text=True, timeout=60)
        if done.returncode == 0:
            print(f"{run_dir}: asked the tasks of SLURM step {job_id} to stop: they checkpoint at their next step "
                  f"and end; the same command resumes the run")
            return True
    host, asked, elsewhere = socket.gethostname(), [], set()
    for rank, beat in read_beats(run_dir, planned_world_size(run_dir)).items():
        if beat.get("host") != host:
            elsewhere.add(str(beat.get("host")))
            continue
        try:  # a rank of this start (not a recycled pid) that still runs
            if b"launchers.by_hand" in Path(f"/proc/{int(beat['pid'])}/cmdline").read_bytes():
                os.kill(int(beat["pid"]), signal.SIGTERM)
                asked.append(rank)
        except (OSError, KeyError, TypeError, ValueError):
            continue
    if asked:
        print(f"{run_dir}: asked rank(s) {', '.join(map(str, asked))} on this host to stop (started by hand: "
              f"{job_id}): every rank checkpoints at the next step and ends; the same command resumes the run")
        return True
    print(f"{run_dir}: started by hand ({job_id}) on {', '.join(sorted(elsewhere)) or 'another host'}: stop it "
          f"there (Ctrl-C to torchrun, or SIGTERM to one rank: every rank checkpoints at the next step and ends)",
          file=sys.stderr)
    return False


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
