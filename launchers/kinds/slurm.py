"""launcher.kind=slurm: the job submitted with sbatch through submitit's SlurmExecutor, one
task per GPU (`ntasks_per_node = gpus_per_node`), parameter names as submitit's (which
follow sbatch). Submission returns once the job is queued (launcher.wait=true waits); a
sweep is one job array per distinct launcher section. Before submission, the cluster's
partitions are checked for a request it could never start (launchers/slurm_fit.py); after,
SLURM's own records say how the job went (launchers/slurm_records.py).

Each task starts through launchers/rank_start.py, which holds a preemption signal back
until the job's handlers are installed."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Any, Mapping, Sequence

from launchers.follow import wait_jobs
from launchers.kinds import ClusterCheck, Launcher, SchedulerView, TaskEnds, size_text
from launchers.rank_start import launcher_python
from launchers.slurm_fit import read_cluster, request_problems, slurm_output
from launchers.slurm_records import (ATTEMPT_START, attempt_start, sacct_end, slurm_attempts, slurm_job, srun_log,
                                     srun_report)


class SlurmLauncher(Launcher):
    name = "slurm"
    queues = True

    def executor(self, launcher: Mapping[str, Any], folder: Path, job_name: str):
        import submitit

        # Requeues are bounded by the job itself (launchers/job.py counts them against
        # launcher.max_requeues); submitit's own time-out countdown gets the same bound.
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=int(launcher["max_requeues"]),
                                          python=launcher_python())
        executor.update_parameters(**slurm_parameters(launcher, job_name))
        return executor

    def dry_run_text(self, launcher, folder, job_name, array_size=None) -> str:
        return "# sbatch script\n" + render_sbatch(launcher, folder, job_name, array_size=array_size)

    def cluster_check(self, launcher: Mapping[str, Any]) -> ClusterCheck:
        """Where a cluster answers: why it could never start the job ([] if it could);
        nothing checked without SLURM's client, and a reason where the controller does not
        answer in time."""
        view = read_cluster()
        if isinstance(view, str):
            return ClusterCheck(skipped=view)
        return ClusterCheck(problems=None if view is None else request_problems(launcher, view))

    def submitted(self, job, launcher) -> str:
        return f"submitted SLURM job {job.job_id} ({size_text(launcher)})"

    def wait(self, jobs: Sequence, run_dirs: Sequence[Path]) -> int:
        return wait_jobs(jobs, run_dirs)

    def scheduler_view(self, job_id: str) -> SchedulerView:
        job, attempts = slurm_job(job_id), slurm_attempts(job_id)
        return SchedulerView(state=job.get("state") or (attempts[-1]["state"] if attempts else None),
                             reason=job.get("reason"), restarts=int(job.get("restarts", 0)), attempts=attempts)

    def task_ends(self, job_id: str, folder: Path, world_size: int, query_scheduler: bool = True) -> TaskEnds:
        """srun's report in the job's log, from this attempt's start on (ATTEMPT_START), and accounting."""
        ends = TaskEnds()
        try:
            with open(srun_log(folder, job_id), "rb") as handle:
                text = handle.read()
            ends = srun_report(text[attempt_start(text):].decode(errors="replace"), world_size)
        except (OSError, ValueError):
            pass
        if query_scheduler:
            text = slurm_output(["sacct", "-n", "-P", "-j", str(job_id), "-o",
                                 "JobID,State,ExitCode,DerivedExitCode,NodeList"]) or ""
            end = sacct_end(text, str(job_id))
            ends.scheduler, ends.step_signal, ends.nodes = end["state"], end["step_signal"], end["nodes"]
        return ends

    def cancel(self, job_id: str) -> tuple[bool, str]:
        done = subprocess.run(["scancel", str(job_id)], capture_output=True, text=True, timeout=60)
        return done.returncode == 0, done.stderr.strip()


def slurm_parameters(launcher: Mapping[str, Any], job_name: str) -> dict[str, Any]:
    """submitit SlurmExecutor parameters for this launcher section."""
    params: dict[str, Any] = {
        "job_name": job_name,
        "nodes": int(launcher["nodes"]),
        "ntasks_per_node": int(launcher["gpus_per_node"]),
        "cpus_per_task": int(launcher["cpus_per_task"]),
        "time": int(launcher["timeout_min"]),
        "signal_delay_s": int(launcher["signal_delay_s"]),
        "array_parallelism": int(launcher["array_parallelism"]),
    }
    if launcher["accelerator"] == "gpu":
        params["gpus_per_node"] = int(launcher["gpus_per_node"])
    optional = {
        "mem": f"{launcher['mem_gb']}GB" if launcher.get("mem_gb") is not None else None,
        "partition": launcher.get("partition"),
        "account": launcher.get("account"),
        "qos": launcher.get("qos"),
        "constraint": launcher.get("constraint"),
        "exclusive": True if launcher.get("exclusive") else None,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    if launcher.get("additional_sbatch"):
        params["additional_parameters"] = dict(launcher["additional_sbatch"])
    # Where this attempt's part of the job's log begins (SLURM appends a requeued job's):
    # srun reports a task that ends even before the other tasks run any Python.
    params["setup"] = [f'echo "{ATTEMPT_START}: job $SLURM_JOB_ID, restart ${{SLURM_RESTART_COUNT:-0}}" >&2',
                       *(launcher.get("setup") or [])]
    if launcher.get("srun_args"):
        params["srun_args"] = list(launcher["srun_args"])
    return params


def submitit_command(folder: Path, interpreter: str | None = None) -> str:
    """The command every task runs (what submitit's SlurmExecutor puts after srun)."""
    return " ".join([launcher_python(interpreter), "-u -m submitit.core._submit", shlex.quote(str(folder))])


def render_sbatch(
    launcher: Mapping[str, Any], folder: Path, job_name: str, *, array_size: int | None = None,
    interpreter: str | None = None,
) -> str:
    """The sbatch script submitit would submit (works without SLURM installed)."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = slurm_parameters(launcher, job_name)
    if array_size is not None and array_size > 1:
        params["map_count"] = array_size
    return _make_sbatch_string(command=submitit_command(folder, interpreter), folder=folder, **params)


LAUNCHER = SlurmLauncher()
