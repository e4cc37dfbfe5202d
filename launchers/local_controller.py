"""submitit's local controller (it starts a local job's tasks, forwards signals and
restarts them on a requeue), also recording how each task ended:

    <submitit folder>/<job id>_exit_codes.json   {"exit_codes": [0, -9, ...]}

written each time the tasks of a start have all ended. A negative code is the signal
that killed the task (Popen's convention). It is the only record of a rank that died
without running any Python (SIGKILL from the out-of-memory killer or `kill -9`):
launchers/failures.py names that rank and the signal instead of the error its peers
saw when it disappeared. `audiollm train` starts this module in place of
`submitit.local._local` (launchers/submit.py, own_session).

Each start of the tasks also gets its own rendezvous port, free on this host when the
tasks start and below the ephemeral range (orchestrator/runtime/ports.py), unless the
user exported MASTER_PORT: submitit's own choice is a random port in 20000-60000 that
an outgoing connection can hold, and the tasks start with the stop signals blocked
(launchers/rank_start.py says why).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from submitit.local.local import Controller

from launchers.rank_start import HELD
from orchestrator.plan.rundir import write_json
from orchestrator.runtime.ports import free_port


def exit_codes_path(folder: Path, job_id: str) -> Path:
    return Path(folder) / f"{job_id}_exit_codes.json"


class RecordingController(Controller):
    def __init__(self, folder: Path):
        super().__init__(folder)
        self.user_port = "MASTER_PORT" in os.environ

    def start_tasks(self) -> None:
        if not self.user_port:
            os.environ["MASTER_PORT"] = str(free_port())  # the tasks inherit the controller's environment
        # The tasks start with the stop signals blocked, as launchers/rank_start.py would
        # block them a little later: one sent at once is held until the job can act on it.
        # The controller's own SIGTERM, held meanwhile, is forwarded once they exist.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
        try:
            super().start_tasks()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def wait(self, freq: int = 24):
        codes = super().wait(freq)
        try:
            write_json(exit_codes_path(self.folder, self.pid), {"exit_codes": list(codes)})
        except OSError:  # a full disk: the ranks' own records still name the cause
            pass
        return codes


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m launchers.local_controller SUBMITIT_FOLDER")
    RecordingController(Path(sys.argv[1])).run()
