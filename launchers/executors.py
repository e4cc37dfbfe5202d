"""Build submitit executors from the `launcher` config section, and render sbatch scripts.

Both launchers use submitit, so a job is the same object everywhere: a pickled
callable run once per task, with the task's rank in the environment.

* local: submitit's local executor, `tasks_per_node = nodes x gpus_per_node`
  processes on this machine (only nodes=1 makes sense there).
* slurm: submitit's SlurmExecutor; one task per GPU (`ntasks_per_node =
  gpus_per_node`), parameter names as submitit's (which follow sbatch).

Each task starts through launchers/rank_start.py, which holds a preemption signal back
until the job's handlers are installed.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Mapping

from launchers.failures import ATTEMPT_START
from orchestrator.plan import parallel_dims
from launchers.rank_start import launcher_python


def world_size(launcher: Mapping[str, Any]) -> int:
    return parallel_dims.world_size(launcher["nodes"], launcher["gpus_per_node"])


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


def slurm_executor(launcher: Mapping[str, Any], folder: Path, job_name: str):
    import submitit

    # Requeues are bounded by the job itself (launchers/job.py counts them against
    # launcher.max_requeues); submitit's own time-out countdown gets the same bound.
    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=int(launcher["max_requeues"]),
                                      python=launcher_python())
    executor.update_parameters(**slurm_parameters(launcher, job_name))
    return executor


def local_executor(launcher: Mapping[str, Any], folder: Path, job_name: str):
    import submitit

    executor = submitit.AutoExecutor(folder=folder, cluster="local", local_python=launcher_python())
    params: dict[str, Any] = {
        "name": job_name,
        "tasks_per_node": world_size(launcher),
        "timeout_min": int(launcher["timeout_min"]),
    }
    if launcher["accelerator"] == "gpu":
        params["gpus_per_node"] = world_size(launcher)
    if launcher.get("setup"):
        params["local_setup"] = list(launcher["setup"])
    executor.update_parameters(**params)
    return executor


def make_executor(launcher: Mapping[str, Any], folder: Path, job_name: str):
    if launcher["kind"] == "slurm":
        return slurm_executor(launcher, folder, job_name)
    return local_executor(launcher, folder, job_name)
