"""A launcher kind that lives only in the tests (tests/launchers/test_toy_launcher.py):
proof that a kind is this one module plus its entry in orchestrator/plan/launcher_kinds.py,
as docs/project.md's "How to add a launcher" says.

It says it queues (`queues`), so the commands treat it as a scheduler: `audiollm train`
returns once it is "queued", a sweep is one job array. The job in fact starts at once on
this machine through submitit's local executor. Its cluster has a time limit of an hour."""

from __future__ import annotations

import signal
from pathlib import Path

from launchers.follow import wait_jobs
from launchers.kinds import ClusterCheck, Launcher, SchedulerView, TaskEnds, world_size
from launchers.kinds.local import alive, signal_local

TIME_LIMIT_MIN = 60


class ToyLauncher(Launcher):
    name = "toy"
    queues = True

    def executor(self, launcher, folder: Path, job_name: str):
        import submitit

        executor = submitit.AutoExecutor(folder=folder, cluster="local")
        executor.update_parameters(name=job_name, tasks_per_node=world_size(launcher),
                                   timeout_min=int(launcher["timeout_min"]))
        return executor

    def dry_run_text(self, launcher, folder, job_name, array_size=None) -> str:
        return f"# toy: {world_size(launcher)} processes queued as {job_name}" + (
            f", an array of {array_size}" if array_size else "")

    def cluster_check(self, launcher) -> ClusterCheck:
        minutes = int(launcher["timeout_min"])
        return ClusterCheck(problems=[] if minutes <= TIME_LIMIT_MIN else [
            f"launcher.timeout_min={minutes} exceeds the toy cluster's time limit of {TIME_LIMIT_MIN} minutes; "
            f"set launcher.timeout_min={TIME_LIMIT_MIN} or less"])

    def submitted(self, job, launcher) -> str:
        return f"queued toy job {job.job_id}"

    def wait(self, jobs, run_dirs) -> int:
        return wait_jobs(jobs, run_dirs)

    def scheduler_view(self, job_id: str) -> SchedulerView:
        return SchedulerView(state="RUNNING" if alive(job_id) else "ENDED")

    def task_ends(self, job_id, folder, world_size, query_scheduler=True) -> TaskEnds:
        return TaskEnds()  # the toy keeps no record of its tasks

    def cancel(self, job_id: str) -> tuple[bool, str]:
        return signal_local(job_id, signal.SIGTERM), "not running"


LAUNCHER = ToyLauncher()
