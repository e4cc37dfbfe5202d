"""Why a job failed, in one line: the console's last line after a failure.

Every rank that fails with a Python exception records it (launchers/job.py):

    <run_dir>/logs/failure_rank<N>.json   {"job_id", "rank", "time", "line", "lost_peer"}

`line` is the exception in one line (type, message, and where in the project's code it
was raised); `lost_peer` marks the errors a rank gets only because another one is gone
(gloo's "Connection reset by peer", NCCL's aborted communicator). A rank killed by a
signal records nothing: a local job's controller keeps each task's exit status
(launchers/local_controller.py), a negative one being the signal.

`explain` picks the cause: the earliest failure of its own, else a rank killed by a
signal, else a rank that ended without a word while its peers lost it, else the earliest
failure of any kind.
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

from orchestrator.plan.rundir import read_json, write_json

MAX_LINE = 600
# The errors of a rank whose peer is gone or failed first (gloo, NCCL, torch's TCPStore;
# torch's distributed checkpoint names no failed rank on the ranks that did not fail).
_PEER_LOSS = re.compile(r"(reset|closed) by peer|Broken pipe|communicator was aborted|Connection refused|"
                        r"Socket Timeout|recvBytes|sendBytes|NCCL (error|communicator)|"
                        r"CheckpointException ranks:dict_keys\(\[\]\)", re.IGNORECASE)
_PROJECT_CODE = ("orchestrator", "launchers")  # their exceptions' messages say where and why
_REPO = Path(__file__).resolve().parents[1]
_SIGNAL_HINTS = {signal.SIGKILL: "the out-of-memory killer or a kill -9", signal.SIGSEGV: "a crash in native code",
                 signal.SIGABRT: "an abort in native code", signal.SIGBUS: "a bus error (a file mapped in memory "
                                                                         "was truncated?)"}


def failure_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "logs" / f"failure_rank{rank}.json"


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


def record(run_dir: Path, rank: int, job_id: str, exc: BaseException) -> None:
    """Never raises: a failure to record must not hide the failure itself."""
    try:
        write_json(failure_path(run_dir, rank), {
            "job_id": str(job_id), "rank": rank, "pid": os.getpid(), "host": socket.gethostname(),
            "time": time.time(), "line": one_line(exc), "lost_peer": bool(_PEER_LOSS.search(str(exc))),
        })
    except OSError:
        pass


_BY_DESCRIPTION = {signal.strsignal(s): int(s) for s in signal.Signals if signal.strsignal(s)}
_SRUN_TASK_END = re.compile(r"^srun: error: \S+: tasks? ([\d,-]+): (.+?)\s*$", re.MULTILINE)


def srun_exit_codes(log_text: str, world_size: int) -> list:
    """Exit codes in Popen's convention (minus the signal) of the tasks srun reports in a
    SLURM job's log ("srun: error: HOST: task 1: Killed"); None for the others."""
    codes: list = [None] * world_size
    for tasks, how in _SRUN_TASK_END.findall(log_text):
        number = _BY_DESCRIPTION.get(how)
        if number is None:
            continue
        for part in tasks.split(","):
            first, _, last = part.partition("-")
            for rank in range(int(first), int(last or first) + 1):
                if rank < world_size:
                    codes[rank] = -number
    return codes


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _from(r: dict, log: Path) -> str:
    return f"rank {r['rank']}: {r['line']} (log: {log}/rank{r['rank']}.log)"


def explain(run_dir: Path, job_id: str, exit_codes: Optional[Sequence[Optional[int]]] = None) -> Optional[str]:
    """The cause of job `job_id`'s failure in one line, ending with the log to read; None
    when nothing was recorded."""
    run_dir = Path(run_dir)
    world_size = int((read_json(run_dir / "plan.json", default={}) or {}).get("world_size") or 0)
    records = [r for r in (read_json(failure_path(run_dir, rank)) for rank in range(world_size))
               if isinstance(r, dict) and r.get("job_id") == str(job_id)]
    records.sort(key=lambda r: r.get("time", 0))
    own = [r for r in records if not r.get("lost_peer")]
    log = run_dir / "logs"
    if own:
        r = own[0]
        return _from(r, log)
    recorded = {r["rank"] for r in records}
    killed = [(rank, -code) for rank, code in enumerate(exit_codes or ())
              if code is not None and code < 0 and rank not in recorded]
    if killed:
        rank, number = killed[0]
        hint = _SIGNAL_HINTS.get(number)
        return (f"rank {rank} was killed by signal {number} ({_signal_name(number)}{': ' + hint if hint else ''}); "
                f"the other ranks stopped when it disappeared (log: {log}/rank{rank}.log)")
    silent = [rank for rank in range(world_size) if rank not in recorded]
    if records and silent:  # every recorded error is a lost peer: the silent rank went first
        return (f"rank {silent[0]} ended without an error of its own (killed by a signal? the out-of-memory killer "
                f"or a kill -9); the other ranks stopped when it disappeared (log: {log}/rank{silent[0]}.log)")
    if records:
        return _from(records[0], log)
    return None
