"""Why a job failed, in one line: `audiollm status` and the console after a failure.

Every rank whose entry lets an exception escape records it (launchers/job.py) before
its process ends:

    <run_dir>/logs/failure_rank<N>.json
        {"job_id", "launch", "rank", "host", "pid", "time", "type", "message", "where",
         "line", "log", "lost_peer"}

`message` is the exception's own message, whole; `line` the exception in one line
(type, message, and where outside the installed packages it was raised); `lost_peer`
marks the errors a rank gets only because another one is gone (gloo's "Connection
closed by peer", NCCL's aborted communicator, a collective's timeout). A rank clears its
own record when it starts, so a record always belongs to the rank's last start.

A rank killed without running any Python records nothing. What the launcher saw of it
(`TaskEnds`) names it instead: a local job's controller keeps each task's exit status
(launchers/local_controller.py, a negative one being the signal); on SLURM, srun reports
each task that did not exit cleanly in the job's log ("srun: error: HOST: task 1:
Killed", "...: Out Of Memory", "srun: error: Node failure on HOST"), and accounting
keeps the job's end (sacct: NODE_FAIL, OUT_OF_MEMORY, TIMEOUT, CANCELLED, a step's
signal).

`explain` picks the cause, in this order: the earliest error of a rank's own; a node
lost; a rank out of memory; the job ended by SLURM (time limit, cancelled); a rank killed
by a signal; a rank that ended without a word while its peers lost it; a step's signal
that SLURM recorded without naming the rank; the earliest error of any kind. The ranks
that failed after the cause are named after it, never as the cause.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sysconfig
import time
import traceback
from pathlib import Path
from typing import Optional, Sequence

from launchers.kinds import TaskEnds, launcher_for
from orchestrator.plan.rundir import read_json, write_json

MAX_LINE = 600
MAX_MESSAGE = 20_000
# The errors of a rank whose peer is gone, failed or hangs (gloo, NCCL and its watchdog,
# torch's TCPStore; torch's distributed checkpoint names no failed rank on the ranks that
# did not fail).
_PEER_LOSS = re.compile(r"(reset|closed) by peer|Broken pipe|communicator was aborted|Connection refused|"
                        r"No route to host|Network is unreachable|Socket Timeout|Timed out waiting|"
                        r"collective operation timeout|recvBytes|sendBytes|NCCL (error|communicator)|"
                        r"CheckpointException ranks:dict_keys\(\[\]\)", re.IGNORECASE)
# torch's TCPStore on rank 0 when another process of its host holds the rendezvous port.
_PORT_HELD = re.compile(r"EADDRINUSE|address already in use", re.IGNORECASE)
_PROJECT_CODE = ("orchestrator", "launchers")  # their exceptions' messages say where and why
_REPO = Path(__file__).resolve().parents[1]
_SIGNAL_HINTS = {signal.SIGKILL: "the out-of-memory killer or a kill -9", signal.SIGSEGV: "a crash in native code",
                 signal.SIGABRT: "an abort in native code", signal.SIGBUS: "a bus error (a file mapped in memory "
                                                                         "was truncated?)"}


def failure_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "logs" / f"failure_rank{rank}.json"


def log_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "logs" / f"rank{rank}.log"


def _library_roots() -> tuple:
    paths = sysconfig.get_paths()
    return tuple({str(Path(paths[k]).resolve()) for k in ("stdlib", "platstdlib", "purelib", "platlib")})


def _where(exc: BaseException) -> str:
    """The innermost frame outside Python's and the installed packages' code (the
    project's, or the user's own entry), as a path relative to the repository if within."""
    libraries = _library_roots()
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = Path(frame.filename).resolve()
        if frame.filename.startswith("<") or str(path).startswith(libraries):
            continue
        try:
            path = path.relative_to(_REPO)
        except ValueError:
            pass
        return f"{path}:{frame.lineno}"
    return ""


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if len(line) > MAX_LINE:
        line = line[: MAX_LINE - 1] + "…"
    where = _where(exc)
    return f"{line} (raised in {where})" if where and not type(exc).__module__.startswith(_PROJECT_CODE) else line


def _fix(exc: BaseException) -> str:
    """What to do, for the errors whose own message does not say."""
    if not _PORT_HELD.search(str(exc)):
        return ""
    from orchestrator.runtime.ports import END_PORT, FIRST_PORT

    return (f" (the rendezvous port MASTER_PORT={os.environ.get('MASTER_PORT', '?')} is held by another process on "
            f"{socket.gethostname()}: a server's, or on SLURM another job's whose id is the same modulo "
            f"{END_PORT - FIRST_PORT}; choose a free one: launcher.setup=['export MASTER_PORT=N'] on SLURM, "
            f"`MASTER_PORT=N audiollm train ...` locally, N in {FIRST_PORT}-{END_PORT - 1})")


def clear(run_dir: Path, rank: int) -> None:
    """At a rank's start: a record left by an earlier start (a requeue, a rerun) is not
    this start's."""
    try:
        failure_path(run_dir, rank).unlink(missing_ok=True)
    except OSError:
        pass


def record(run_dir: Path, rank: int, job_id: str, exc: BaseException, launch: Optional[int] = None,
           lost_peer: Optional[bool] = None) -> None:
    """Never raises: a failure to record must not hide the failure itself. `lost_peer`:
    whether the error is only that another rank is gone (by default, from its message)."""
    try:
        if lost_peer is None:
            lost_peer = bool(_PEER_LOSS.search(str(exc)))
        write_json(failure_path(run_dir, rank), {
            "job_id": str(job_id), "launch": launch, "rank": rank, "pid": os.getpid(), "host": socket.gethostname(),
            "time": time.time(), "type": type(exc).__name__, "message": str(exc)[:MAX_MESSAGE], "where": _where(exc),
            "line": one_line(exc) + _fix(exc), "log": str(log_path(run_dir, rank)), "lost_peer": lost_peer,
        })
    except Exception:  # noqa: BLE001 - a full disk, an exception whose str() fails
        pass


# ------------------------------------------------------------------ what the launcher saw


def task_ends(run_dir: Path, kind: Optional[str], job_id: str, folder: Optional[Path],
              query_scheduler: bool = True) -> TaskEnds:
    """What the launcher of kind `kind` recorded of job `job_id`'s ranks (launchers/kinds/)."""
    if folder is None:
        return TaskEnds()
    return launcher_for(kind).task_ends(job_id, Path(folder), planned_world_size(Path(run_dir)), query_scheduler)



# ------------------------------------------------------------------ the cause


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _ranges(ranks) -> str:
    """[0, 2, 3, 4] -> "ranks 0, 2-4"; [1] -> "rank 1"."""
    ranks = sorted(set(ranks))
    parts, start = [], None
    for i, r in enumerate(ranks):
        start = r if start is None else start
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(r) if r == start else f"{start}-{r}")
            start = None
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def _rank_hosts(run_dir: Path, world_size: int) -> dict:
    """rank -> host of its last start (its heartbeat, launchers/watchdog.py)."""
    from launchers.watchdog import read_beats

    return {rank: beat["host"] for rank, beat in read_beats(run_dir, world_size).items() if beat.get("host")}


def _on(rank: int, hosts: dict) -> str:
    return f"rank {rank} on {hosts[rank]}" if hosts.get(rank) else f"rank {rank}"


_SCHEDULER_ENDS = {
    "TIMEOUT": "the job reached its time limit (launcher.timeout_min)",
    "DEADLINE": "the job reached its deadline",
    "CANCELLED": "the job was cancelled (scancel, audiollm cancel, or an administrator)",
    "PREEMPTED": "the job was preempted and not requeued",
    "BOOT_FAIL": "a node of the job failed to boot",
}


def planned_world_size(run_dir: Path) -> int:
    """The run's planned number of ranks (plan.json; 0 where it cannot be read)."""
    return int((read_json(Path(run_dir) / "plan.json", default={}) or {}).get("world_size") or 0)


def _records(run_dir: Path, job_id: str, world_size: int, since: float = 0.0) -> list:
    """The ranks' failure records of job `job_id` written at or after `since`, earliest first."""
    records = [r for r in (read_json(failure_path(run_dir, rank)) for rank in range(world_size))
               if isinstance(r, dict) and r.get("job_id") == str(job_id) and r.get("time", 0) >= since]
    return sorted(records, key=lambda r: r.get("time", 0))


def own_errors(run_dir: Path, job_id: str, since: float = 0.0) -> list:
    """The ranks of job `job_id` that raised an error of their own (not only the loss of
    a peer) at or after `since`: what a requeue would most likely meet again."""
    return [r["rank"] for r in _records(run_dir, job_id, planned_world_size(run_dir), since) if not r.get("lost_peer")]


def explain(run_dir: Path, job_id: str, ends: TaskEnds | Sequence[Optional[int]] | None = None) -> Optional[str]:
    """The cause of job `job_id`'s failure in one line, with its rank, host and the log to
    read, then the ranks that failed after it; None when nothing was recorded. `ends`: a
    TaskEnds, or a list of exit statuses per rank."""
    run_dir = Path(run_dir)
    if not isinstance(ends, TaskEnds):
        ends = TaskEnds(codes={r: c for r, c in enumerate(ends or ()) if c is not None})
    world_size = planned_world_size(run_dir)
    records = _records(run_dir, job_id, world_size)
    by_rank = {r["rank"]: r for r in records}
    # The ranks' own host names first (as their records and logs say), srun's node names else.
    hosts = {**ends.hosts, **_rank_hosts(run_dir, world_size), **{r["rank"]: r.get("host") for r in records}}
    own = [r for r in records if not r.get("lost_peer")]
    # Every rank that did not end cleanly: the cause's followers are among them.
    failed = set(by_rank) | {r for r, c in ends.codes.items() if c} | set(ends.oom)

    def log(rank: int) -> str:
        return f"(log: {log_path(run_dir, rank)})"

    def after(cause_ranks, same=()) -> str:
        rest = sorted(failed - set(cause_ranks) - set(same))
        text = f"; {_ranges(same)} raised the same" if same else ""
        return text + (f"; {_ranges(rest)} failed after it" if rest else "")

    if own:
        first = own[0]
        same = [r["rank"] for r in own[1:] if r.get("line") == first.get("line")]
        return f"{_on(first['rank'], hosts)}: {first['line']} {log(first['rank'])}{after([first['rank']], same)}"

    if ends.scheduler == "NODE_FAIL" or ends.lost_nodes:
        lost = ends.lost_nodes
        short = {node.split(".")[0] for node in lost}
        there = sorted(r for r in range(world_size)
                       if {ends.hosts.get(r), (hosts.get(r) or "").split(".")[0]} & short)
        what = (f"node {', '.join(lost)} failed" if lost else f"a node of the job ({ends.nodes}) failed")
        text = what + " (SLURM: NODE_FAIL)" if ends.scheduler == "NODE_FAIL" else what
        if there:
            text += f": {_ranges(there)} ran there {log(there[0])}"
        return text + after(there)

    oom = ends.oom or ([r for r, c in ends.codes.items() if c and c < 0 and r not in by_rank]
                       if ends.scheduler == "OUT_OF_MEMORY" else [])
    if oom or ends.scheduler == "OUT_OF_MEMORY":
        limit = "(SLURM: OUT_OF_MEMORY; launcher.mem_gb is the job's memory)"
        if not oom:
            return f"a rank ran out of memory {limit}"
        return f"{_on(oom[0], hosts)} ran out of memory {limit} {log(oom[0])}{after(oom[:1])}"

    if ends.scheduler in _SCHEDULER_ENDS:
        return f"SLURM ended the job ({ends.scheduler}): {_SCHEDULER_ENDS[ends.scheduler]}"

    killed = [(rank, -code) for rank, code in ends.codes.items()
              if code < 0 and rank not in by_rank and rank not in ends.stopped]
    if killed:
        rank, number = killed[0]
        hint = _SIGNAL_HINTS.get(number)
        return (f"{_on(rank, hosts)} was killed by signal {number} ({_signal_name(number)}"
                f"{': ' + hint if hint else ''}) {log(rank)}{after([rank])}")

    silent = [rank for rank in range(world_size) if rank not in by_rank and rank not in ends.stopped]
    if records and silent:  # every recorded error is a lost peer: the silent rank went first
        rank = silent[0]
        return (f"{_on(rank, hosts)} ended without an error of its own (killed by a signal? the out-of-memory killer "
                f"or a kill -9) {log(rank)}{after([rank])}")

    if ends.step_signal:
        number = ends.step_signal
        hint = _SIGNAL_HINTS.get(number)
        return (f"a rank was killed by signal {number} ({_signal_name(number)}{': ' + hint if hint else ''}; "
                f"SLURM's accounting of the job's step, which does not say which rank)")

    if records:
        first = records[0]
        return f"{_on(first['rank'], hosts)}: {first['line']} {log(first['rank'])}{after([first['rank']])}"
    return None


def cause(run_dir: Path, kind: Optional[str], job_id: Optional[str], folder: Optional[Path],
          query_scheduler: bool = True) -> Optional[str]:
    """The cause of job `job_id` of the run in one line (explain), from everything
    recorded; None when nothing was."""
    if job_id is None:
        return None
    ends = task_ends(run_dir, kind, str(job_id), Path(folder) if folder else None, query_scheduler)
    return explain(run_dir, str(job_id), ends)
