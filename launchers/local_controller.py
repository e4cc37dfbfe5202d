"""submitit's local controller (it starts a local job's tasks, forwards signals and
restarts them on a requeue), also recording how each task ended:

    <submitit folder>/<job id>_exit_codes.json
        {"exit_codes": [0, -9, ...], "ended": [1, 0, ...], "stopped": [0, ...], "host": HOST}

written each time the tasks of a start have all ended: each task's code (a negative one
is the signal that killed it, Popen's convention), the tasks in the order they ended,
and those the controller killed because a peer had failed (launchers/watchdog.py's
PEERS_GRACE_S earlier: they waited for it). It is the only record of a rank that died
without running any Python (SIGKILL from the out-of-memory killer or `kill -9`):
launchers/failures.py names that rank and the signal instead of the error its peers
saw when it disappeared. `audiollm train` starts this module in place of
`submitit.local._local` (launchers/kinds/local.py, own_session).

Each start of the tasks also gets its own rendezvous port, free on this host when the
tasks start and below the ephemeral range (orchestrator/runtime/ports.py), unless the
user exported MASTER_PORT: submitit's own choice is a random port in 20000-60000 that
an outgoing connection can hold, and the tasks start with the stop signals blocked
(launchers/rank_start.py says why).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

from submitit.local.local import LOCAL_REQUEUE_RETURN_CODE, Controller, LocalJobEnvironment

from launchers.rank_start import HELD
from launchers.watchdog import PEERS_GRACE_S
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
        codes, ended, stopped = self._wait_for_tasks(1.0 / freq)
        try:
            write_json(exit_codes_path(self.folder, self.pid),
                       {"exit_codes": list(codes), "ended": ended, "stopped": stopped, "host": socket.gethostname()})
        except OSError:  # a full disk: the ranks' own records still name the cause
            pass
        return codes

    def _wait_for_tasks(self, interval: float):
        """Until every task has ended, as submitit's controller waits (the time limit's
        warning `signal_delay_s` before it; at the limit, return), and one rule more:
        PEERS_GRACE_S after a task failed (neither 0 nor the requeue code), the tasks still
        running are killed. A rank that dies leaves the others waiting for it, in a
        collective or, before the first, at the rendezvous, which no timeout bounds
        closely; a peer that notices it fails on its own well within the grace. Returns
        the exit codes, the tasks in the order they ended, and those killed here."""
        start = time.monotonic()
        warned, failed_at, stopped, ended = False, None, [], []
        while True:
            codes = [task.poll() for task in self.tasks]
            ended += [k for k, code in enumerate(codes) if code is not None and k not in ended]
            elapsed = time.monotonic() - start
            if None not in codes or elapsed >= self.timeout_s:
                return codes, ended, stopped
            if not warned and elapsed >= self.timeout_s - self.signal_delay_s:
                self._forward_signal(LocalJobEnvironment._usr_sig())
                warned = True
            if failed_at is None and any(code not in (None, 0, LOCAL_REQUEUE_RETURN_CODE) for code in codes):
                failed_at = elapsed
            if failed_at is not None and not stopped and elapsed - failed_at >= PEERS_GRACE_S:
                stopped = [k for k, code in enumerate(codes) if code is None]
                first = ended[0]
                print(f"[local controller] task {first} ended with {codes[first]} {PEERS_GRACE_S:.0f} s ago; "
                      f"killing tasks {stopped}, which still wait for it", file=sys.stderr, flush=True)
                for k in stopped:
                    self.tasks[k].kill()
            time.sleep(interval)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m launchers.local_controller SUBMITIT_FOLDER")
    RecordingController(Path(sys.argv[1])).run()
