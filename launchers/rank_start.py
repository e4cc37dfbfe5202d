"""Every task's first Python: hold the stop signals back until the job can act on them.

    <python> -u -m launchers.rank_start -u -m submitit.core._submit FOLDER

(`launcher_python()` is the executors' `python`; submitit appends its own command.)

SIGUSR2 (preemption, the time-limit warning) and SIGTERM kill a Python process whose
handlers are not installed yet. A task spends seconds before launchers/job.py installs
them (submitit's import, the job's unpickling, its logs and state), and submitit's own
handlers, installed in between, end or ignore the task instead of requeuing the job:
a preemption that came while the job started lost it. Here both signals are blocked
first thing: one that arrives stays pending until
orchestrator.runtime.job_control.install_handlers unblocks it, and the job then stops at
its first step boundary and is requeued like one stopped later. Only the interpreter's
own start (tens of milliseconds) comes before this on SLURM; locally the controller
starts the tasks with both signals already blocked (launchers/local_controller.py).
"""

from __future__ import annotations

import signal
import sys

# orchestrator.runtime.job_control.STOP_SIGNALS, written out: this runs before any import.
HELD = (signal.SIGUSR2, signal.SIGTERM)
SUBMITIT_TAIL = ["-u", "-m", "submitit.core._submit"]


def launcher_python(interpreter: str | None = None) -> str:
    """The `python` of submitit's executors: the interpreter (this one by default),
    through this module."""
    import shlex

    return f"{shlex.quote(interpreter or sys.executable)} -u -m launchers.rank_start"


def main(argv: list[str]) -> None:
    if argv[:-1] != SUBMITIT_TAIL:
        sys.exit(f"usage: python -u -m launchers.rank_start {' '.join(SUBMITIT_TAIL)} FOLDER (got {argv})")
    from submitit.core.submission import process_job

    process_job(argv[-1])


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    main(sys.argv[1:])
