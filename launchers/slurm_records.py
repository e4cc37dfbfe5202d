"""What SLURM records of a job: srun's report of its tasks in the job's log, accounting
(sacct), and the controller's view of a queued job (scontrol). The slurm launcher
(launchers/kinds/slurm.py) reads them for `audiollm status` and a failure's cause; rank 0's
watchdog follows srun's report while the job runs (launchers/job.py)."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from launchers.kinds import TaskEnds
from launchers.slurm_fit import slurm_output

_BY_DESCRIPTION = {signal.strsignal(s): int(s) for s in signal.Signals if signal.strsignal(s)}
_SRUN_TASK_END = re.compile(r"^srun: error: (\S+): tasks? ([\d,-]+): (.+?)\s*$", re.MULTILINE)
_SRUN_NODE_FAIL = re.compile(r"^srun: error: Node failure on (\S+)", re.MULTILINE)
_EXITED = re.compile(r"Exited with exit code (\d+)")
OOM = "Out Of Memory"  # srun's words for a task the kernel killed for its memory limit


def _ranks(tasks: str, world_size: int) -> list:
    ranks = []
    for part in tasks.split(","):
        first, _, last = part.partition("-")
        ranks += [r for r in range(int(first), int(last or first) + 1) if r < world_size]
    return ranks


def srun_report(log_text: str, world_size: int) -> TaskEnds:
    """What srun says of the tasks in a SLURM job's log (its batch script's stderr)."""
    ends = TaskEnds()
    for host, tasks, how in _SRUN_TASK_END.findall(log_text):
        how = how.removesuffix(" (core dumped)")
        exited = _EXITED.fullmatch(how)
        number = _BY_DESCRIPTION.get(how)
        for rank in _ranks(tasks, world_size):
            if rank in ends.codes or rank in ends.oom:
                continue  # the first report of a task is how it ended
            ends.hosts.setdefault(rank, host)
            if how == OOM:
                ends.oom.append(rank)
            elif exited:
                ends.codes[rank] = int(exited.group(1))
            elif number is not None:
                ends.codes[rank] = -number
    ends.lost_nodes = list(dict.fromkeys(_SRUN_NODE_FAIL.findall(log_text)))
    return ends


def sacct_end(text: str, job_id: str) -> dict:
    """The job's end from `sacct -n -P -o JobID,State,ExitCode,DerivedExitCode,NodeList`:
    {"state", "nodes", "step_signal"} (the job's own row; the signal of its first task
    step, srun's, that did not complete)."""
    end: dict = {"state": None, "nodes": "", "step_signal": None}
    for line in text.splitlines():
        job, state, exit_code, _derived, nodes = (line.split("|") + [""] * 5)[:5]
        state = state.split()[0] if state.strip() else ""
        if job == str(job_id):
            end.update(state=state or None, nodes=nodes)
        step = job.rpartition(".")[2] if job.startswith(f"{job_id}.") else ""
        if step.isdigit() and state != "COMPLETED" and end["step_signal"] is None:
            sig = exit_code.partition(":")[2]
            if sig.isdigit() and int(sig):
                end["step_signal"] = int(sig)
    return end


# The batch script's first line (launchers/kinds/slurm.py): SLURM appends a requeued job's
# log, and an attempt's part of it begins after the last one.
ATTEMPT_START = "[audiollm] the tasks of this attempt start"


def srun_log(folder: Path, job_id: str) -> Path:
    """The batch script's stderr, srun's included: task 0's stderr file."""
    from submitit.core.utils import JobPaths

    return JobPaths(folder, job_id=job_id, task_id=0).stderr


def attempt_start(text: bytes) -> int:
    """Where the last attempt's part of a SLURM job's log `text` begins."""
    at = text.rfind(ATTEMPT_START.encode())
    return 0 if at < 0 else at + len(ATTEMPT_START)


class SrunLogTail:
    """srun's report of this attempt's tasks, followed while the job runs (rank 0's
    watchdog asks every few seconds): each call reads only what the log gained since the
    last, because the same file holds rank 0's stderr and a run lasts days."""

    def __init__(self, path: Path):
        self.path, self.offset, self.lines = Path(path), None, []

    def ends(self, world_size: int) -> TaskEnds:
        try:
            with open(self.path, "rb") as handle:
                if self.offset is not None:
                    handle.seek(self.offset)
                text = handle.read()
        except OSError:
            return srun_report("".join(self.lines), world_size)
        start = attempt_start(text) if self.offset is None else 0
        complete = text.rfind(b"\n") + 1  # a line still being written is read next time
        if complete > start:
            self.lines += [line + "\n" for line in text[start:complete].decode(errors="replace").splitlines()
                           if line.startswith("srun: ")]
        self.offset = (self.offset or 0) + max(complete, start)
        return srun_report("".join(self.lines), world_size)


def slurm_job(job_id: str) -> dict:
    """What slurmctld says of a queued or recent job: {"state", "reason", "restarts", "nodes"} ({} if nothing)."""
    text = slurm_output(["scontrol", "show", "job", "-o", job_id]) or ""
    fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
    if "JobState" not in fields:
        return {}
    return {"state": fields["JobState"], "reason": fields.get("Reason"), "restarts": int(fields.get("Restarts", 0)),
            "nodes": fields.get("NodeList")}


def slurm_attempts(job_id: str) -> list[dict]:
    """Each attempt of a job from accounting (a requeue starts a new one): [{"state", "nodes", "start", "end"}]."""
    rows = slurm_output(["sacct", "-n", "-X", "-D", "-P", "-j", job_id, "-o", "State,NodeList,Start,End"]) or ""
    attempts = []
    for line in rows.splitlines():
        state, nodes, start, end = (line.split("|") + ["", "", "", ""])[:4]
        if state:
            attempts.append({"state": state.split()[0], "nodes": nodes, "start": start, "end": end})
    return attempts
