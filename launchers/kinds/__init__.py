"""What a launcher is: the one interface through which the commands (train, eval, sweep,
status, cancel, plan) ask a launcher kind anything.

A kind is one module under launchers/kinds/ holding a `LAUNCHER`, an instance of a
`Launcher` subclass, and one entry in orchestrator/plan/launcher_kinds.py (its name, its
module, and whether its ranks all run on the submitting machine, which the plan's rules
need). Nothing else in launchers/ or orchestrator/ tells the kinds apart: the commands
call `launcher_for(kind)` and the methods below. The kinds here: local (submitit's local
executor, this machine) and slurm (sbatch through submitit).

Every kind submits through submitit, so a job is the same object everywhere: a pickled
callable (launchers.job.RankJob) run once per task with the task's rank in the
environment; `job.job_id`, `job.done()`, `job.results()` and `job.paths` are what the
commands use of it.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence

from orchestrator.plan import parallel_dims
from orchestrator.plan.launcher_kinds import KINDS


@dataclass
class ClusterCheck:
    problems: Optional[List[str]] = None  # why the cluster could never start the job; None: not checked
    skipped: Optional[str] = None  # why it was not checked where the scheduler's client is installed


@dataclass
class SchedulerView:
    """What the kind's scheduler says of a submitted job now."""

    state: Optional[str] = None  # SLURM's words (PENDING, RUNNING, TIMEOUT, ...); a kind without a queue: RUNNING | ENDED
    reason: Optional[str] = None  # why it waits, in the scheduler's words
    restarts: int = 0  # requeues the scheduler did
    attempts: list = field(default_factory=list)  # [{"state", "nodes", "start", "end"}], one per start, oldest first


@dataclass
class TaskEnds:
    """How the ranks' processes of a job ended, as the launcher and the scheduler saw it."""

    codes: dict = field(default_factory=dict)  # rank -> exit status (Popen's: -N = signal N), in the order seen
    stopped: list = field(default_factory=list)  # ranks the launcher ended itself, after a peer had failed
    oom: list = field(default_factory=list)  # ranks the scheduler reports out of memory
    hosts: dict = field(default_factory=dict)  # rank -> host, where it is known
    lost_nodes: list = field(default_factory=list)  # nodes the scheduler reports failed
    scheduler: Optional[str] = None  # the scheduler's end of the job: NODE_FAIL, OUT_OF_MEMORY, TIMEOUT, CANCELLED, ...
    step_signal: Optional[int] = None  # the signal of the job's step in accounting (no rank known)
    nodes: str = ""  # the job's nodes in accounting


def world_size(launcher: Mapping[str, Any]) -> int:
    return parallel_dims.world_size(launcher["nodes"], launcher["gpus_per_node"])


def size_text(launcher: Mapping[str, Any]) -> str:
    return f"{launcher['nodes']} node(s) x {launcher['gpus_per_node']} process(es)"


class Launcher:
    """The interface. `queues` decides how the commands use a kind: a queueing kind
    (slurm) returns once a job is queued unless launcher.wait=true, and runs a sweep as
    job arrays; a kind that runs jobs at once on this machine (local) streams rank 0 until
    the job ends unless launcher.wait=false, and runs a sweep's points one after another."""

    name: str = ""
    queues: bool = False

    @property
    def one_machine(self) -> bool:
        """Every rank runs on the submitting machine (orchestrator/plan/launcher_kinds.py)."""
        return KINDS[self.name].one_machine

    # -- before submission
    def executor(self, launcher: Mapping[str, Any], folder: Path, job_name: str):
        """The submitit executor for this `launcher` section, writing into `folder`."""
        raise NotImplementedError

    def dry_run_text(self, launcher: Mapping[str, Any], folder: Path, job_name: str,
                     array_size: Optional[int] = None) -> str:
        """The dry run's last part: what would be submitted (a heading line, then its text)."""
        raise NotImplementedError

    def cluster_check(self, launcher: Mapping[str, Any]) -> ClusterCheck:
        """Why the cluster could never start this job ([] if it could); not checked by default."""
        return ClusterCheck()

    def submitting(self):
        """A context around `executor.submit` (and `map_array`)."""
        return contextlib.nullcontext()

    # -- after submission
    def submitted(self, job, launcher: Mapping[str, Any]) -> str:
        """Where the job went, in a few words (after "starting run DIR: ")."""
        raise NotImplementedError

    def waits(self, launcher: Mapping[str, Any]) -> bool:
        """Whether the command stays until the job ends (launcher.wait; its default: not `queues`)."""
        wait = launcher.get("wait")
        return (not self.queues) if wait is None else bool(wait)

    def wait(self, jobs: Sequence, run_dirs: Sequence[Path]) -> int:
        """Stay until `jobs` end; the exit status (launchers/runs.py EXIT_*), a failure's cause said."""
        raise NotImplementedError

    def scheduler_view(self, job_id: str) -> SchedulerView:
        raise NotImplementedError

    def task_ends(self, job_id: str, folder: Path, world_size: int, query_scheduler: bool = True) -> TaskEnds:
        """What the launcher recorded of how each rank's process ended (launchers/failures.py reads it)."""
        raise NotImplementedError

    def cancel(self, job_id: str) -> tuple[bool, str]:
        """Stop the job (its ranks checkpoint where they can): (done, why not)."""
        raise NotImplementedError


def launcher_for(kind: Optional[str]) -> Launcher:
    """The kind's launcher; a launch recorded before kinds were named (None) was local."""
    kind = kind or "local"
    if kind not in KINDS:
        raise ValueError(f"launcher.kind={kind!r} is none of the launcher kinds ({', '.join(sorted(KINDS))}); "
                         f"orchestrator/plan/launcher_kinds.py lists them")
    return importlib.import_module(KINDS[kind].module).LAUNCHER
