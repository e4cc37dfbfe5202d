"""Submitting a prepared run through its launcher kind (launchers/kinds/): one job per
run directory at a time, the launch recorded."""

from __future__ import annotations

from pathlib import Path

from launchers.job import update_state
from launchers.runs import PreparedRun, config_yaml, launch_index, rank_job
from launchers.summary import active_submission, run_state
from orchestrator.plan import rundir as rd


class RunActive(RuntimeError):
    """The run already has a queued or running job."""


def ensure_not_active(run_dir: Path) -> None:
    """Two jobs must never write one run directory's checkpoints: neither a submitted one
    nor one started by hand (launchers/by_hand.py) that still runs."""
    if not (rd.last_launch(run_dir) or (Path(run_dir) / "state.json").exists()):  # never started
        return
    info = run_state(run_dir)
    if info.get("by_hand") and info["state"] == "RUNNING":
        raise RunActive(
            f"run {run_dir} runs, started by hand ({info['job_id']}); follow it with `audiollm status {run_dir}`, "
            f"or stop it first with `audiollm cancel {run_dir}` (or Ctrl-C to its torchrun): it checkpoints"
        )
    submitted = active_submission(run_dir, info)
    if submitted:
        raise RunActive(submitted)


def submit_run(run: PreparedRun):
    """Write the run directory, submit, record the launch. Returns the submitit job."""
    return submit_job(run.run_dir, run.launcher, rank_job(run.launcher), run.job_name,
                      write=lambda: rd.prepare(run.run_dir, config_yaml(run), run.plan),
                      record={"overrides": run.overrides, "resumed": run.resumes, "source": run.source})


def submit_job(job_dir: Path, launcher: dict, task, job_name: str, write, record: dict):
    """What every submission does, one command at a time (check -> submit -> record under
    the directory's lock): refuse a second active job, write what the job reads
    (`write()`), submit `task` (a launchers.job.RankJob) on every rank with `job_dir`,
    and append the launch to launch.json (`record` beside its kind, job id and index).
    Returns the submitit job."""
    from launchers.kinds import launcher_for

    with rd.submission_lock(job_dir):
        ensure_not_active(job_dir)
        write()
        if (rd.read_json(job_dir / "state.json", default={}) or {}).get("by_hand"):
            # The run is now the queued job's: a start by hand beside it is refused
            # (launchers/by_hand.py), before the job writes its own state.
            update_state(job_dir, by_hand=False)
        index = launch_index(job_dir)
        kind = launcher_for(launcher["kind"])
        executor = kind.executor(launcher, job_dir / "submitit", job_name)
        with kind.submitting():
            job = executor.submit(task, str(job_dir), index)
        rd.record_launch(job_dir, {"kind": launcher["kind"], "job_ids": [str(job.job_id)], "launch_index": index,
                                   "submitit_folder": str(job_dir / "submitit"), **record})
    return job
